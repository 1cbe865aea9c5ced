"""A mutation is made only on a fresh read (issue 22; DESIGN §6 "No command runs stale", behavior.md §12.1).

A mutation's read is the outcome the fold issued it on, so its age is the executing worker's clock against the
command's `at_ms`. Older than ROUTER_FRESH_READ_MS, it is not made: a `stale_read` outcome goes to the log and the
run makes the fresh read again, whose rules decide. A status change Chatwoot reported after the read (a person's
takeover) stops it, and so does a partition whose fold has not yet passed the head its worker saw at assignment.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest

from handlers.worker.lanes import Lanes
from handlers.worker.ports import MemorySink, SourceRecord
from handlers.worker.service import DEFAULT_FRESH_READ_MS, WorkerService, WorkerTables
from projections.fold import fold_parts
from projections.worker.admission import changed_since_read, read_is_fresh
from schemas.codec import decode_command, decode_conversation_event
from schemas.config import RouterConfig
from schemas.configs import ConfigBook, ConfigDocument, FoldSettings
from schemas.records import (
    CONVERSATION_READS,
    MUTATIONS,
    ConfigApplied,
    EffectCommand,
    EffectError,
    EffectOutcome,
    GetConversation,
    SetLabels,
    Transition,
    WebhookReceived,
)
from schemas.state import ConversationState, Run, TurnGuard
from tests.golden.histories import book_of, histories, settings_of
from tests.unit.test_fold_driver import ACCOUNT, CONV, T0, FakeChatwoot, decision, incoming, make_config
from tests.unit.test_worker_service import KEY, Bus, deliver, new_tables, run_until_quiet, state, stopped, webhook

BOUND = DEFAULT_FRESH_READ_MS


class Clock:
    """The worker's clock, moved by the test."""

    def __init__(self) -> None:
        self.now = T0

    def __call__(self) -> int:
        return self.now


class ClockedExecutor:
    """Runs commands against a `FakeChatwoot`, stamping each outcome with the worker's clock."""

    def __init__(self, chatwoot: FakeChatwoot, clock: Clock) -> None:
        self.chatwoot, self.clock = chatwoot, clock

    async def execute(
        self, command: EffectCommand, config: RouterConfig | None = None, *, unchanged_since: float | None = None
    ) -> EffectOutcome:
        current = self.chatwoot.conversation.updated_at
        if unchanged_since is not None and current is not None and current > unchanged_since:
            error = EffectError(kind="stale_read", reason="changed since the fresh read")  # as EffectExecutor does
            return EffectOutcome(
                at_ms=self.clock(),
                key=command.key,
                account_id=command.account_id,
                command_id=command.command_id,
                op=command.op,
                error=error,
                requests=1,
            )
        result, error, requests = self.chatwoot.execute(command)
        return EffectOutcome(
            at_ms=self.clock(),
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


def clocked_service(tables: WorkerTables, chatwoot: FakeChatwoot, clock: Clock) -> WorkerService:
    document = ConfigDocument.of(make_config(), FoldSettings(retry_base_ms=1000))

    async def no_book() -> ConfigBook:
        return ConfigBook()

    class NoGaps:
        async def read_range(self, topic: str, partition: int, start: int, end: int) -> list[SourceRecord]:
            raise AssertionError("no gap expected")

    return WorkerService(
        tables=tables,
        sink=MemorySink(),
        executor=ClockedExecutor(chatwoot, clock),
        book=ConfigBook([document]),
        own_document=document,
        load_book=no_book,
        reader=NoGaps(),
        lanes=Lanes(hold_s=3600.0),
        now_ms=clock,
        fresh_read_ms=BOUND,
        stop=stopped,
    )


def billing() -> FakeChatwoot:
    chatwoot = FakeChatwoot(messages=[incoming(1, "I was charged twice")], decision=decision(topic="invoices"))
    chatwoot.conversation = chatwoot.conversation.model_copy(update={"updated_at": 1000.0})
    return chatwoot


def next_command(bus: Bus) -> SourceRecord:
    return bus.records("effects")[bus.delivered["effects"]]


def outcomes(bus: Bus) -> Iterator[EffectOutcome]:
    for record in bus.records("conversations"):
        event = decode_conversation_event(record.value)
        if isinstance(event, EffectOutcome):
            yield event


async def labels_issued(chatwoot: FakeChatwoot, clock: Clock) -> tuple[WorkerTables, Bus, WorkerService]:
    """A billing turn run up to its labels mutation, which is on the effects topic but not executed yet."""
    tables, bus = new_tables(), Bus()
    service = clocked_service(tables, chatwoot, clock)
    webhook(bus)
    await run_until_quiet(service, bus, stop_before="set_labels")
    assert decode_command(next_command(bus).value).op == "set_labels"
    assert "set_labels" not in chatwoot.ops()
    return tables, bus, service


# --- the pure checks ---------------------------------------------------------------------------------------------


def labels_at(at_ms: int) -> EffectCommand:
    labels = SetLabels(labels=("a",))
    return EffectCommand(at_ms=at_ms, key=KEY, account_id=ACCOUNT, command_id=f"{KEY}:1:9", params=labels)


def test_a_mutation_is_fresh_up_to_the_bound_and_not_a_millisecond_longer() -> None:
    assert read_is_fresh(labels_at(T0), T0 + BOUND, BOUND)
    assert not read_is_fresh(labels_at(T0), T0 + BOUND + 1, BOUND)


def test_a_read_is_never_held_to_the_bound() -> None:
    read = EffectCommand(at_ms=T0, key=KEY, account_id=ACCOUNT, command_id=f"{KEY}:1:1", params=GetConversation())
    assert read_is_fresh(read, T0 + 10 * BOUND, BOUND)


def with_change(read_updated_at: float | None, transition_at: float | None) -> ConversationState:
    run = Run(number=1, job_version=1, read_updated_at=read_updated_at)
    return ConversationState(run=run, guard=TurnGuard(transition_at=transition_at))


def test_only_a_status_change_newer_than_the_read_counts_as_a_change_since_it() -> None:
    assert changed_since_read(with_change(1000.0, 1000.5))
    assert not changed_since_read(with_change(1000.0, 1000.0))  # the router's own change, which the read saw
    assert not changed_since_read(with_change(1000.0, None))
    assert not changed_since_read(with_change(None, 1000.5))  # a Chatwoot without updated_at: unknown, not changed
    assert not changed_since_read(None)


def test_every_mutation_the_fold_issues_is_issued_on_a_reads_outcome_at_its_time() -> None:
    """What makes `command.at_ms` the read's outcome time: no mutation is issued on anything but a read."""
    seen: set[str] = set()
    for history in histories():
        state = ConversationState()
        book = book_of(history.directory) if history.versioned else None
        version: str | None = None
        for offset, event in history.events():
            if isinstance(event, ConfigApplied):
                version = event.version if book is not None and event.version in book else version
                continue
            if book is not None:
                document = book.in_force(version)
                assert document is not None
                config, retry_base_ms = document.config, document.fold.retry_base_ms
            else:
                config, retry_base_ms = settings_of(history.directory)
            for part, result in fold_parts(state, event, offset, config, retry_base_ms=retry_base_ms):
                for command in result.commands:
                    if command.op in MUTATIONS:
                        seen.add(command.op)
                        assert isinstance(part, EffectOutcome) and part.op in CONVERSATION_READS, history.name
                        assert command.at_ms == part.at_ms
                state = result.state
    assert {"set_labels", "create_message", "toggle_status", "assign"} <= seen


# --- the worker: the bound, a takeover, and a partition catching up -----------------------------------------


async def test_a_mutation_executed_past_the_bound_is_not_made_and_its_read_is_made_again() -> None:
    chatwoot, clock = billing(), Clock()
    tables, bus, service = await labels_issued(chatwoot, clock)
    command = decode_command(next_command(bus).value)
    clock.now = command.at_ms + BOUND + 1  # the worker died; its heir executes the command this late
    calls = len(chatwoot.calls)
    bus.delivered["effects"] += 1
    await deliver(service, bus, next_command_at(bus, -1))
    assert "set_labels" not in chatwoot.ops()[calls:]
    stale = [o for o in outcomes(bus) if o.command_id == command.command_id]
    assert [o.error.kind if o.error else None for o in stale] == ["stale_read"]
    assert service.metrics.commands_dropped.labels("set_labels", "stale_read")._value.get() == 1

    await run_until_quiet(service, bus)  # the conversation is still the bot's: read, then the labels
    after = chatwoot.ops()[calls:]
    assert after[0] == "get_conversation" and after.count("set_labels") == 1
    assert after.index("get_conversation") < after.index("set_labels")
    assert chatwoot.conversation.labels == ("invoices",) and chatwoot.conversation.assignee_id == 7
    assert state(tables).run is None


def next_command_at(bus: Bus, index: int) -> SourceRecord:
    return bus.records("effects")[bus.delivered["effects"] + index]


async def test_a_mutation_is_made_within_the_bound() -> None:
    chatwoot, clock = billing(), Clock()
    _, bus, service = await labels_issued(chatwoot, clock)
    clock.now = decode_command(next_command(bus).value).at_ms + BOUND
    await run_until_quiet(service, bus)
    assert chatwoot.ops().count("set_labels") == 1 and chatwoot.ops()[-1] == "assign"
    assert service.metrics.commands_dropped.labels("set_labels", "stale_read")._value.get() == 0


def takeover(bus: Bus, chatwoot: FakeChatwoot, at: float) -> None:
    """A person assigns themselves (pending -> open); Chatwoot's webhook reaches `conversations`."""
    chatwoot.conversation = chatwoot.conversation.model_copy(
        update={"status": "open", "assignee_type": "User", "assignee_id": 8, "updated_at": at}
    )
    event = WebhookReceived(
        at_ms=T0,
        account_id=ACCOUNT,
        conversation_id=CONV,
        event="conversation_updated",
        transition=Transition(status="open", at=at),
        updated_at=at,
    )
    bus.append("conversations", KEY, event.model_dump_json().encode())


@pytest.mark.parametrize("late", [False, True], ids=["within the bound", "past the bound"])
async def test_a_persons_takeover_after_the_read_stops_the_mutation_for_good(late: bool) -> None:
    chatwoot, clock = billing(), Clock()
    tables, bus, service = await labels_issued(chatwoot, clock)
    command = decode_command(next_command(bus).value)
    takeover(bus, chatwoot, at=1001.0)
    await deliver(service, bus, bus.records("conversations")[-1])  # the webhook is folded first
    bus.delivered["conversations"] = len(bus.records("conversations"))
    clock.now = command.at_ms + (BOUND + 1 if late else 10)
    calls = len(chatwoot.calls)
    await run_until_quiet(service, bus)
    assert not {"set_labels", "assign", "toggle_status", "unassign"} & set(chatwoot.ops()[calls:])
    assert chatwoot.conversation.assignee_id == 8 and chatwoot.conversation.labels == ()
    assert chatwoot.ops()[calls:][0] == "get_conversation"  # the read again, which finds it not pending
    assert state(tables).run is None


async def test_a_mutation_waits_for_the_fold_to_pass_the_head_seen_at_assignment() -> None:
    """The heir's effect agent reaches the command before its router agent folded the takeover on the log."""
    chatwoot, clock = billing(), Clock()
    tables, bus, _ = await labels_issued(chatwoot, clock)
    takeover(bus, chatwoot, at=1001.0)  # while the partition had no owner
    heir = clocked_service(tables, chatwoot, clock)
    head = len(bus.records("conversations"))
    folded = bus.delivered["conversations"]
    heir.offsets.assign([("conversations", 0), ("effects", 0)], {("conversations", 0): folded})
    heir.catch_up.assign(frozenset({0}), {0: head}, {0: folded})
    calls = len(chatwoot.calls)
    command = next_command(bus)
    bus.delivered["effects"] += 1
    await heir.on_record("effects", command)  # queued in its lane, waiting for the fold
    for _ in range(20):  # let the lane run as far as it can
        await asyncio.sleep(0)
    assert heir.lanes.pending == 1 and "set_labels" not in chatwoot.ops()[calls:]
    for record in bus.records("conversations")[folded:]:
        await heir.on_record("router", record)  # the router agent folds the takeover
    bus.delivered["conversations"] = head
    await heir.lanes.drain()
    assert isinstance(heir.sink, MemorySink)
    bus.collect(heir.sink)
    await run_until_quiet(heir, bus)
    assert "set_labels" not in chatwoot.ops()[calls:] and chatwoot.conversation.assignee_id == 8
    assert heir.metrics.commands_dropped.labels("set_labels", "changed_since_read")._value.get() == 1


async def test_a_partition_that_does_not_catch_up_within_the_bound_makes_no_mutation() -> None:
    chatwoot, clock = billing(), Clock()
    tables, bus, _ = await labels_issued(chatwoot, clock)
    heir = clocked_service(tables, chatwoot, clock)
    folded = bus.delivered["conversations"]
    heir.catch_up.assign(frozenset({0}), {0: folded + 100}, {0: folded})  # far behind its head
    command = decode_command(next_command(bus).value)
    clock.now = command.at_ms + BOUND  # no time left to wait
    calls = len(chatwoot.calls)
    bus.delivered["effects"] += 1
    await deliver(heir, bus, next_command_at(bus, -1))
    assert "set_labels" not in chatwoot.ops()[calls:]
    assert heir.metrics.commands_dropped.labels("set_labels", "catching_up")._value.get() == 1
    assert [o.error.kind for o in outcomes(bus) if o.command_id == command.command_id and o.error] == ["stale_read"]


async def test_a_reply_past_the_bound_is_not_sent_and_never_sent_later() -> None:
    chatwoot = FakeChatwoot(messages=[incoming(1, "refund please")], decision=decision(kind="refund"))
    clock = Clock()
    tables, bus = new_tables(), Bus()
    service = clocked_service(tables, chatwoot, clock)
    webhook(bus)
    await run_until_quiet(service, bus, stop_before="create_message")
    reply = decode_command(next_command(bus).value)
    assert state(tables).ledger.value == "attempted"
    clock.now = reply.at_ms + BOUND + 1
    await run_until_quiet(service, bus)
    assert "create_message" not in chatwoot.ops()
    assert state(tables).ledger.value == "attempted" and state(tables).run is None
    handoffs = service.metrics.handoffs.labels("reply_stale_read")._value.get()
    assert handoffs == 1 and chatwoot.conversation.status == "open"  # handed to people on a fresh read


async def test_a_change_whose_webhook_was_not_folded_yet_stops_the_mutation_at_its_last_read() -> None:
    """The person's change reached Chatwoot, but its webhook is not on the log yet: the executor's read right
    before the call sees it, the mutation is not made, and the run's fresh read decides again."""
    chatwoot, clock = billing(), Clock()
    tables, bus, service = await labels_issued(chatwoot, clock)
    chatwoot.conversation = chatwoot.conversation.model_copy(
        update={"status": "open", "assignee_type": "User", "assignee_id": 8, "updated_at": 1001.0}
    )
    calls = len(chatwoot.calls)
    await run_until_quiet(service, bus)
    assert not {"set_labels", "assign"} & set(chatwoot.ops()[calls:])
    stale = [o for o in outcomes(bus) if o.op == "set_labels" and o.error is not None]
    assert [o.error.kind for o in stale if o.error] == ["stale_read"]
    assert chatwoot.conversation.assignee_id == 8 and state(tables).run is None
