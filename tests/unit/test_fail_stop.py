"""Guarantees against Faust as it really behaves (issue 34), told on the in-process bus of test_worker_service:
an adversarial sink whose barrier breaks, offsets Faust would commit past what was folded, a worker paused past
its session, and weather (a broker error) that is not poison."""

from __future__ import annotations

from typing import Any, NoReturn

import pytest
from aiokafka.errors import KafkaConnectionError
from faust.types import TP

from handlers.worker.barrier import BarrierBroken
from handlers.worker.fencing import Fence
from handlers.worker.ports import Headers, MemorySink, MemoryTable
from schemas.configs import ConfigBook, ConfigDocument, FoldSettings
from schemas.records import ConfigApplied
from tests.unit.test_fold_driver import T0, FakeChatwoot, decision, incoming, make_config
from tests.unit.test_worker_service import (
    Bus,
    WorkerStopped,
    deliver,
    new_service,
    new_tables,
    run_until_quiet,
    webhook,
)


class BreakingSink(MemorySink):
    """A sink whose barrier breaks once `broken` is set: a send that failed, or one never acknowledged."""

    broken = False

    async def flush(self) -> None:
        self.flushes += 1
        if self.broken:
            raise BarrierBroken("1 of 3 writes failed (NotEnoughReplicasError)")


def refund() -> FakeChatwoot:
    return FakeChatwoot(messages=[incoming(1, "refund please")], decision=decision(kind="refund"))


async def test_a_broken_barrier_before_a_reply_stops_the_worker_and_the_reply_is_never_sent() -> None:
    """The attempt record the reply depends on was not acknowledged: no reply, no DLQ, no commit; the worker stops."""
    chatwoot = refund()
    tables, bus = new_tables(), Bus()
    service = new_service(tables, chatwoot)
    sink = BreakingSink()
    service.sink = sink
    webhook(bus)
    await run_until_quiet(service, bus, stop_before="create_message")
    sink.broken = True
    reply = bus.records("effects")[bus.delivered["effects"]]
    with pytest.raises(WorkerStopped, match="not acknowledged"):
        await deliver(service, bus, reply, commit=False)
    await service.lanes.drain()
    assert "create_message" not in chatwoot.ops()
    assert bus.records("dlq") == []


async def test_a_broken_barrier_at_a_commit_commits_nothing() -> None:
    chatwoot = FakeChatwoot(messages=[incoming(1, "I was charged twice")])
    tables, bus = new_tables(), Bus()
    service = new_service(tables, chatwoot)
    sink = BreakingSink()
    service.sink = sink
    record = webhook(bus)
    await deliver(service, bus, record, commit=False)
    sink.broken = True
    with pytest.raises(WorkerStopped, match="commit barrier broke"):
        await service.before_offsets_commit({TP("conversations", 0): 1})


async def test_offsets_are_never_committed_past_the_last_record_folded() -> None:
    """Faust acks records it skipped (flow control, a stale generation) and may commit past them: the worker
    commits no further than the record after the last one it folded, leaves a partition it folded nothing of
    uncommitted, and counts each time Faust was ahead."""
    chatwoot = FakeChatwoot(messages=[incoming(1, "I was charged twice")])
    tables, bus = new_tables(), Bus()
    service = new_service(tables, chatwoot)
    service.offsets.assign([("conversations", 0), ("conversations", 1)], {("conversations", 0): 0})
    await deliver(service, bus, webhook(bus), commit=False)  # offset 0 folded: the next is 1
    allowed = await service.before_offsets_commit({TP("conversations", 0): 5, TP("conversations", 1): 3})
    assert allowed == {TP("conversations", 0): 1}
    assert service.metrics.commits_clamped.labels("conversations")._value.get() == 2
    assert await service.before_offsets_commit({TP("conversations", 0): 1}) == {TP("conversations", 0): 1}


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


async def test_a_worker_paused_past_its_session_writes_no_state_and_makes_no_mutation() -> None:
    """SIGSTOP for longer than the session: the group gave the partition to another worker. Whatever runs first
    after the pause (a commit, a mutation, a tick) finds the worker in doubt and stops it before it writes."""
    chatwoot = FakeChatwoot(messages=[incoming(1, "I was charged twice")])
    tables, bus = new_tables(), Bus()
    service = new_service(tables, chatwoot)
    clock = Clock()
    service.fence = Fence(15.0, clock)
    service.fence.joined()
    webhook(bus)
    await run_until_quiet(service, bus, stop_before="assign")
    assert isinstance(tables.states, MemoryTable)
    writes = tables.states.writes
    await deliver(service, bus, bus.records("conversations")[-1], commit=False)  # a dirty state in the cache
    clock.now += 40  # paused
    with pytest.raises(WorkerStopped, match=r"did not run for 40\.0 s"):
        await service.before_offsets_commit({TP("conversations", 0): 99})
    assert tables.states.writes == writes  # the stale cache never reached the changelog
    stops: list[str] = []

    def stop(reason: str) -> NoReturn:
        stops.append(reason)
        raise WorkerStopped(reason)

    service.stop = stop
    assign = bus.records("effects")[bus.delivered["effects"]]
    await service.on_record("effects", assign)  # the mutation runs in its lane: the fence stops it there
    await service.lanes.drain()
    assert "assign" not in chatwoot.ops()
    assert stops and "not making the assign call" in stops[0]


async def test_a_worker_the_group_expelled_writes_no_state_at_its_revoke() -> None:
    """A commit refused for an old generation (streams/worker/transport.py `fenced_commit`): aiokafka revokes the
    partitions next, and the revoke writes the cache; the fence stops the worker before that write, with no pause
    ever measured."""
    chatwoot = FakeChatwoot(messages=[incoming(1, "I was charged twice")])
    tables, bus = new_tables(), Bus()
    service = new_service(tables, chatwoot)
    service.fence = Fence(15.0, Clock())
    webhook(bus)
    await run_until_quiet(service, bus, stop_before="assign")
    assert isinstance(tables.states, MemoryTable)
    writes = tables.states.writes
    await deliver(service, bus, bus.records("conversations")[-1], commit=False)  # a dirty state in the cache
    service.fence.expelled("the group refused an offset commit (IllegalGenerationError)")
    with pytest.raises(WorkerStopped, match="refused an offset commit"):
        await service.commit_cache()
    assert tables.states.writes == writes


def test_the_doubt_is_latched_by_whichever_runs_first_after_a_pause() -> None:
    clock = Clock()
    fence = Fence(15.0, clock)
    clock.now += 100
    fence.beat()
    assert not fence.in_doubt()  # not a member yet: a slow start owns nothing
    fence.joined()
    clock.now += 16
    fence.beat()  # the tick ran first after the pause
    clock.now += 1
    assert fence.in_doubt()  # the commit that runs next still knows
    fence.beat()
    assert fence.in_doubt()


async def test_a_broker_error_while_handling_a_record_stops_the_worker_instead_of_dead_lettering_it() -> None:
    chatwoot = FakeChatwoot(messages=[incoming(1, "I was charged twice")])
    tables, bus = new_tables(), Bus()
    service = new_service(tables, chatwoot)

    class Unreachable(MemorySink):
        async def send(self, topic: str, key: str, value: bytes, headers: Headers | None = None) -> None:
            raise KafkaConnectionError("no broker")

    service.sink = Unreachable()
    with pytest.raises(WorkerStopped, match="KafkaConnectionError"):
        await service.on_record("router", webhook(bus))
    assert bus.records("dlq") == []


async def test_a_configuration_marker_read_during_a_hiccup_is_retried_never_dead_lettered(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr("handlers.worker.service.asyncio.sleep", no_wait)
    chatwoot = FakeChatwoot(messages=[incoming(1, "I was charged twice")])
    tables, bus = new_tables(), Bus()
    service = new_service(tables, chatwoot)
    new = ConfigDocument.of(make_config(), FoldSettings(retry_base_ms=2000))
    answers: list[Any] = [KafkaConnectionError("hiccup"), ConfigBook(), ConfigBook([new])]

    async def load_book() -> ConfigBook:
        answer = answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return answer

    service.load_book = load_book
    marker = bus.append(
        "conversations", "config", ConfigApplied(version=new.version, at_ms=T0).model_dump_json().encode()
    )
    await deliver(service, bus, marker, commit=False)
    assert answers == [] and bus.records("dlq") == []
    assert service.document_in_force("conversations", 0) == new


async def test_a_configuration_version_that_never_appears_stops_the_worker(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("handlers.worker.service.asyncio.sleep", no_wait)
    monkeypatch.setattr("handlers.worker.service.CONFIG_READ_DEADLINE_S", 0.0)
    tables, bus = new_tables(), Bus()
    service = new_service(tables, FakeChatwoot(messages=[incoming(1, "hi")]))

    async def load_book() -> ConfigBook:
        return ConfigBook()

    service.load_book = load_book
    marker = bus.append("conversations", "config", ConfigApplied(version="f" * 64, at_ms=T0).model_dump_json().encode())
    with pytest.raises(WorkerStopped, match="not on the configs topic"):
        await deliver(service, bus, marker, commit=False)
    assert bus.records("dlq") == []


async def no_wait(seconds: float) -> None:
    return None


def test_a_pause_right_after_the_join_counts_even_before_the_event_loop_hears_of_it() -> None:
    """Issue 40: the consumer's thread completes the join and the process is frozen before the event loop ran once
    more (seed 4003 of bench/chaos.py --pause-in-recovery). A fence armed by the next beat, or once the tables were
    recovered, saw no gap when the worker woke; it folded and wrote over the new owner's changelog."""
    clock = Clock()
    fence = Fence(15.0, clock)
    fence.beat()
    clock.now += 0.4
    fence.joined()  # in the consumer's thread
    clock.now += 25  # frozen: recovering, rebalancing, or before anything ran
    fence.beat()
    assert fence.in_doubt()
    assert "did not run for 25.0 s" in fence.reason()


def test_a_pause_during_a_recovery_or_a_revoke_is_latched_and_a_later_join_does_not_hide_it() -> None:
    clock = Clock()
    fence = Fence(15.0, clock)
    fence.joined()
    for _ in range(20):  # a slow recovery: the beat goes on while it waits
        clock.now += 1
        fence.beat()
    assert not fence.in_doubt()
    clock.now += 30  # frozen in a revoke
    fence.joined()  # the consumer's thread rejoined first after the pause
    fence.beat()
    assert fence.in_doubt()


def test_a_gap_before_the_first_join_does_not_count() -> None:
    clock = Clock()
    fence = Fence(15.0, clock)
    clock.now += 60  # a slow start: nothing owned yet
    fence.joined()
    clock.now += 1
    fence.beat()
    assert not fence.in_doubt()
