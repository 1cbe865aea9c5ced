"""The worker service in-process (no broker): its crash-safety behaviour, told as stories.

`Bus` plays Kafka: every record the service sends is appended to its topic's partition 0 log with the next
offset and delivered back to the agent that reads that topic, until nothing moves. The tables are
`MemoryTable`s shared between "processes", as changelog-backed tables survive a crash; a second
`WorkerService` on the same tables is the process that restarted or took the partition over.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import NoReturn

import pytest

from handlers.worker.lanes import Lanes
from handlers.worker.ports import MemorySink, MemoryTable, SourceRecord
from handlers.worker.service import WorkerService, WorkerTables
from projections.fold import parts_of, wakeup_of
from schemas.codec import decode_command, decode_conversation_event
from schemas.config import RouterConfig
from schemas.configs import ConfigBook, ConfigDocument, FoldSettings
from schemas.records import (
    MAX_CHAINED_OUTCOMES,
    ChainedOutcomes,
    EffectCommand,
    EffectOutcome,
    TimerFired,
    WebhookReceived,
)
from schemas.state import ConversationState
from tests.unit.test_fold_driver import ACCOUNT, CONV, T0, FakeChatwoot, decision, incoming, make_config

KEY = f"{ACCOUNT}:{CONV}"
AGENT_OF = {"conversations": "router", "effects": "effects", "sweeps": "sweeper"}


class FakeExecutor:
    """Runs commands against a `FakeChatwoot`, as `handlers.worker.effects.EffectExecutor` does against HTTP."""

    def __init__(self, chatwoot: FakeChatwoot) -> None:
        self.chatwoot = chatwoot

    async def execute(self, command: EffectCommand, config: RouterConfig | None = None) -> EffectOutcome:
        result, error, requests = self.chatwoot.execute(command)
        return EffectOutcome(
            at_ms=T0,
            key=command.key,
            account_id=command.account_id,
            command_id=command.command_id,
            op=command.op,
            result=result,
            error=error,
            requests=requests,
        )

    def forget(self, key: str) -> None:
        return None

    async def aclose(self) -> None:
        return None


@dataclass
class Bus:
    """Topic logs (partition 0 only) and the delivery of what the service sends."""

    logs: dict[str, list[SourceRecord]] = field(default_factory=dict)
    delivered: dict[str, int] = field(default_factory=dict)

    def append(self, topic: str, key: str, value: bytes) -> SourceRecord:
        log = self.logs.setdefault(topic, [])
        record = SourceRecord(topic, 0, len(log), key.encode(), value)
        log.append(record)
        return record

    def collect(self, sink: MemorySink) -> None:
        for sent in sink.sent:
            self.append(sent.topic, sent.key, sent.value)
        sink.sent.clear()

    def records(self, topic: str) -> list[SourceRecord]:
        return self.logs.get(topic, [])


def new_tables() -> WorkerTables:
    return WorkerTables(MemoryTable(), MemoryTable(), MemoryTable(), MemoryTable(), MemoryTable())


def new_service(
    tables: WorkerTables,
    chatwoot: FakeChatwoot,
    config: RouterConfig | None = None,
    *,
    max_chain: int = 16,
    write_cache: bool = True,
) -> WorkerService:
    """A service on `tables`; with the write cache (the commit protocol) unless `write_cache` is False."""
    document = ConfigDocument.of(config or make_config(), FoldSettings(retry_base_ms=1000))

    async def no_book() -> ConfigBook:
        return ConfigBook()

    class NoGaps:
        async def read_range(self, topic: str, partition: int, start: int, end: int) -> list[SourceRecord]:
            raise AssertionError("no gap expected")

    return WorkerService(
        tables=tables,
        sink=MemorySink(),
        executor=FakeExecutor(chatwoot),
        book=ConfigBook([document]),
        own_document=document,
        load_book=no_book,
        reader=NoGaps(),
        lanes=Lanes(hold_s=3600.0),  # a lane the fold forgot to let go of would stay
        now_ms=lambda: T0,
        max_chain=max_chain,
        write_cache=write_cache,
        stop=stopped,
    )


class WorkerStopped(BaseException):
    """The service stopped the worker (fail-stop: a broken barrier, a fenced worker): in production the process
    is replaced by a fresh start; here the test sees this. A BaseException, so nothing on the way catches it."""


def stopped(reason: str) -> NoReturn:
    raise WorkerStopped(reason)


async def deliver(service: WorkerService, bus: Bus, record: SourceRecord, *, commit: bool = True) -> None:
    """Hand `record` to its agent and let its effects run; then, unless `commit` is False, commit as the transport
    does after it (the write cache written; tests/unit/test_commit_protocol.py tells the commits apart)."""
    await service.on_record(AGENT_OF[record.topic], record)
    await service.lanes.drain()
    if commit:
        service.before_commit()
    assert isinstance(service.sink, MemorySink)
    bus.collect(service.sink)


async def run_until_quiet(service: WorkerService, bus: Bus, stop_before: str | None = None) -> None:
    """Deliver every record not yet delivered, in log order per topic, until nothing new is sent.

    With `stop_before`, stop when the next effect command to deliver has that op (it stays undelivered).
    """
    for _ in range(500):
        moved = False
        for topic in ("conversations", "effects", "sweeps"):
            records = bus.records(topic)
            position = bus.delivered.get(topic, 0)
            if position >= len(records):
                continue
            record = records[position]
            if stop_before is not None and topic == "effects" and decode_command(record.value).op == stop_before:
                return
            bus.delivered[topic] = position + 1
            await deliver(service, bus, record)
            moved = True
        if not moved:
            return
    raise AssertionError("the service did not settle")


def webhook(bus: Bus) -> SourceRecord:
    event = WebhookReceived(at_ms=T0, account_id=ACCOUNT, conversation_id=CONV, event="message_created")
    return bus.append("conversations", KEY, event.model_dump_json().encode())


def state(tables: WorkerTables) -> ConversationState:
    return ConversationState.model_validate(tables.states.get(KEY))


async def test_a_webhook_is_routed_to_its_owner_through_the_service() -> None:
    chatwoot = FakeChatwoot(messages=[incoming(1, "I was charged twice")])
    tables, bus = new_tables(), Bus()
    service = new_service(tables, chatwoot)
    webhook(bus)
    await run_until_quiet(service, bus)
    assert chatwoot.ops()[-1] == "assign" and chatwoot.conversation.assignee_id == 7
    assert state(tables).run is None and state(tables).job is None
    assert wakeup_of(state(tables)) is None and service.timers.pending() == 0  # nothing due any more
    assert tables.timers.get(KEY) is None  # nor listed
    assert isinstance(tables.timers, MemoryTable) and tables.timers.writes == 2  # listed once, unlisted once
    async with asyncio.timeout(5):  # the turn ended: its lane gave its slots back (handlers/worker/lanes.py)
        while service.lanes.lane_count:
            await asyncio.sleep(0)


async def test_a_reply_command_delivered_again_after_a_restart_is_never_sent_twice() -> None:
    chatwoot = FakeChatwoot(messages=[incoming(1, "refund please")], decision=decision(kind="refund"))
    tables, bus = new_tables(), Bus()
    first = new_service(tables, chatwoot)
    webhook(bus)
    await run_until_quiet(first, bus, stop_before="create_message")
    reply = bus.records("effects")[bus.delivered["effects"]]
    await deliver(first, bus, reply)  # the reply is sent, then the process dies before its offset is committed
    assert chatwoot.ops().count("create_message") == 1
    assert isinstance(first.sink, MemorySink)

    restarted = new_service(tables, chatwoot)  # same tables (changelogs), a new process id
    await deliver(restarted, bus, reply)
    assert chatwoot.ops().count("create_message") == 1  # not sent again
    outcome = EffectOutcome.model_validate_json(bus.records("conversations")[-1].value or b"")
    assert outcome.command_id == decode_command(reply.value).command_id
    assert outcome.error is not None and outcome.error.kind == "unconfirmed"
    assert restarted.metrics.commands_dropped.labels("create_message", "redelivered")._value.get() == 1


async def test_the_attempt_is_flushed_before_the_reply_is_handed_to_the_executor() -> None:
    chatwoot = FakeChatwoot(messages=[incoming(1, "refund please")], decision=decision(kind="refund"))
    tables, bus = new_tables(), Bus()
    service = new_service(tables, chatwoot)
    webhook(bus)
    await run_until_quiet(service, bus, stop_before="create_message")
    sink = service.sink
    assert isinstance(sink, MemorySink)
    flushes = sink.flushes
    reply = bus.records("effects")[bus.delivered["effects"]]
    await service.dispatch_command(reply)
    assert tables.effect_attempts.get(KEY) is not None and sink.flushes == flushes + 1
    await service.lanes.drain()


async def test_a_takeover_resumes_a_run_whose_command_another_process_issued() -> None:
    chatwoot = FakeChatwoot(messages=[incoming(1, "I was charged twice")])
    tables, bus = new_tables(), Bus()
    dead = new_service(tables, chatwoot)
    webhook(bus)
    await deliver(dead, bus, bus.records("conversations")[0])  # folded; its first command is never executed
    bus.delivered["conversations"] = 1
    due = wakeup_of(state(tables))
    assert due is not None and state(tables).run is not None and state(tables).run.pending is not None

    heir = new_service(tables, chatwoot)  # the partition's new owner (or this process restarted)
    await heir.fire_due_timers(frozenset({0}), generation=2)
    assert isinstance(heir.sink, MemorySink)
    fired = [TimerFired.model_validate_json(s.value) for s in heir.sink.on("conversations")]
    assert [(f.key, f.resume, f.due_ms) for f in fired] == [(KEY, True, due)]
    assert heir.metrics.runs_resumed._value.get() == 1
    assert heir.timers.pending() == 1  # the index was rebuilt from the state table

    # the process that issued the command itself is not resumed: its command is still in its lanes
    await dead.fire_due_timers(frozenset({0}), generation=2)
    assert isinstance(dead.sink, MemorySink) and dead.sink.on("conversations") == []


async def test_an_undecodable_record_goes_to_the_dlq_and_the_partition_goes_on() -> None:
    chatwoot = FakeChatwoot(messages=[incoming(1, "I was charged twice")])
    tables, bus = new_tables(), Bus()
    service = new_service(tables, chatwoot)
    sink = service.sink
    assert isinstance(sink, MemorySink)
    service.offsets.assign([("conversations", 0)], {("conversations", 0): 0})
    bad = bus.append("conversations", KEY, b"{not json")
    await service.on_record("router", bad)
    assert [(s.topic, s.value) for s in sink.sent] == [("dlq", b"{not json")]
    headers = dict(sink.sent[0].headers or [])
    assert (headers["source_topic"], headers["source_offset"]) == (b"conversations", b"0")
    assert headers["error"].startswith(b"conversation event: ")  # why, without the record's content
    bus.collect(sink)
    bus.delivered["conversations"] = 1

    webhook(bus)
    await run_until_quiet(service, bus)
    assert chatwoot.conversation.assignee_id == 7  # the webhook behind it was still routed
    assert service.metrics.dlq.labels("conversations")._value.get() == 1


@pytest.mark.parametrize("write_cache", [True, False])
async def test_a_redelivered_record_rewrites_the_state_it_finds(write_cache: bool) -> None:
    """After a SIGKILL the local store can be ahead of its changelog: a redelivered record writes both again."""
    chatwoot = FakeChatwoot(messages=[incoming(1, "I was charged twice")])
    tables, bus = new_tables(), Bus()
    service = new_service(tables, chatwoot, write_cache=write_cache)
    record = webhook(bus)
    await deliver(service, bus, record)
    states, timers = tables.states, tables.timers
    assert isinstance(states, MemoryTable) and isinstance(timers, MemoryTable)
    before = (states.writes, timers.writes, states.get(KEY), timers.get(KEY))

    restarted = new_service(tables, chatwoot, write_cache=write_cache)  # the offset was never committed
    await deliver(restarted, bus, record)
    assert (states.writes, timers.writes) == (before[0] + 1, before[1] + 1)
    assert (states.get(KEY), timers.get(KEY)) == (before[2], before[3])  # the same values, written again
    assert restarted.timers.index.due_of(KEY) == wakeup_of(state(tables))  # and its due time indexed
    assert [decode_command(r.value).op for r in bus.records("effects")] == ["get_conversation"]  # no new command


# --- chained reads ----------------------------------------------------------------------------------------------


def outcomes_of(bus: Bus) -> list[EffectOutcome]:
    """Every outcome on the conversations topic, in fold order (a `ChainedOutcomes` record holds several)."""
    events = [decode_conversation_event(r.value) for r in bus.records("conversations")]
    return [part for event in events for part in parts_of(event) if isinstance(part, EffectOutcome)]


def record_types(bus: Bus) -> list[str]:
    return [decode_conversation_event(r.value).type for r in bus.records("conversations")]


async def test_chained_reads_make_the_same_requests_with_fewer_commands() -> None:
    """A read the fold would issue next runs at once; the log still has every outcome, the effects topic fewer."""
    runs = {}
    for max_chain in (0, 16):
        chatwoot = FakeChatwoot(messages=[incoming(1, "I was charged twice")])
        tables, bus = new_tables(), Bus()
        service = new_service(tables, chatwoot, max_chain=max_chain)
        webhook(bus)
        await run_until_quiet(service, bus)
        runs[max_chain] = (chatwoot, bus, tables, service)
    (plain, plain_bus, plain_tables, _), (chained, chained_bus, chained_tables, service) = runs[0], runs[16]
    assert chained.ops() == plain.ops() and chained.ops()[-1] == "assign"  # the very same requests, in order
    sent = [decode_command(r.value).op for r in chained_bus.records("effects")]
    assert sent == ["get_conversation", "decide", "assign"]  # a read that follows any command runs at once
    assert len(plain_bus.records("effects")) == 12
    # the log has every outcome, in the same order; the 9 chained ones name their command copy
    assert [o.op for o in outcomes_of(chained_bus)] == [o.op for o in outcomes_of(plain_bus)]
    assert sum(o.answers is not None for o in outcomes_of(chained_bus)) == 9
    # the reads run back to back are one event each time: the decision and the assignment stand alone
    chained_types, plain_types = record_types(chained_bus), record_types(plain_bus)
    assert plain_types == ["webhook_received"] + ["effect_outcome"] * 12
    assert chained_types == [
        "webhook_received",
        "chained_outcomes",  # the turn's reads, from the first one on
        "effect_outcome",  # System One's decision
        "chained_outcomes",  # the reads after it
        "effect_outcome",  # the assignment
    ]
    held = [
        [part.op for part in event.outcomes]
        for r in chained_bus.records("conversations")
        if isinstance(event := decode_conversation_event(r.value), ChainedOutcomes)
    ]
    assert held[0] == ["get_conversation", "get_inbox_bot", "read_turn"]  # from the first read of the turn on
    assert service.metrics.commands_chained.labels("read_turn")._value.get() == 3
    plain_end, chained_end = state(plain_tables), state(chained_tables)
    assert plain_end.run is None and chained_end.run is None and plain_end.runs == chained_end.runs
    assert plain_end.guard.model_copy(update={"offset": 0}) == chained_end.guard.model_copy(update={"offset": 0})
    assert not service.chained  # nothing left claimed


async def test_a_chained_read_of_a_step_the_fold_took_otherwise_is_stale_and_the_real_command_goes_out() -> None:
    chatwoot = FakeChatwoot(messages=[incoming(1, "I was charged twice")])
    tables, bus = new_tables(), Bus()
    service = new_service(tables, chatwoot, max_chain=0)
    webhook(bus)
    await deliver(service, bus, bus.records("conversations")[0])
    bus.delivered["conversations"] = 1
    head = decode_command(bus.records("effects")[0].value)
    await deliver(service, bus, bus.records("effects")[0])  # the snapshot read; its outcome is now in the log
    bus.delivered["effects"] = 1
    # this process claims a different copy of step 2 than the fold will issue (as if an event came in between)
    expected = head.model_copy(update={"command_id": head.command_id[: head.command_id.rfind(":")] + ":2"})
    service.chained[KEY] = {expected.command_id: expected}
    await deliver(service, bus, bus.records("conversations")[1])
    bus.delivered["conversations"] = 2
    real = decode_command(bus.records("effects")[-1].value)
    assert (real.command_id, real.op) == (expected.command_id, "get_inbox_bot")  # sent: not the claimed copy
    before = state(tables)
    stale = EffectOutcome(
        at_ms=T0,
        key=KEY,
        account_id=ACCOUNT,
        command_id=real.command_id,
        op="get_inbox_bot",
        answers=expected.digest(),
    )
    await deliver(service, bus, bus.append("conversations", KEY, stale.model_dump_json().encode()))
    assert state(tables).run == before.run  # the outcome of the other copy changed nothing
    await run_until_quiet(service, bus)
    assert chatwoot.ops()[-1] == "assign"


def test_a_chain_limit_one_record_cannot_hold_is_refused() -> None:
    chatwoot = FakeChatwoot(messages=[incoming(1, "I was charged twice")])
    new_service(new_tables(), chatwoot, max_chain=MAX_CHAINED_OUTCOMES - 1)  # the head read and 31 after it
    with pytest.raises(ValueError, match="max_chain"):
        new_service(new_tables(), chatwoot, max_chain=MAX_CHAINED_OUTCOMES)
