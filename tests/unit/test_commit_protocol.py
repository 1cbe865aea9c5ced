"""The commit protocol (docs/architecture.md): states and `timers` entries are written back once per commit, the
producer is flushed, and only then are the input offsets committed. Told as crash stories on the in-process bus
of tests/unit/test_worker_service.py, where "commit" is what the transport does (`before_commit`, flush, offsets)
and a crash throws the process, its cache and its uncommitted offsets away.
"""

from __future__ import annotations

from typing import Any

from handlers.worker_ports import Headers, MemorySink, MemoryTable
from handlers.worker_service import WorkerService, WorkerTables
from projections.fold import wakeup_of
from schemas.codec import decode_command
from schemas.state import ConversationState
from tests.unit.test_fold_driver import FakeChatwoot, decision, incoming
from tests.unit.test_worker_service import KEY, Bus, deliver, new_service, new_tables, state, webhook

Offsets = dict[str, int]


async def fold_uncommitted(service: WorkerService, bus: Bus, stop_before: str) -> None:
    """Deliver what is not yet delivered, in log order per topic, with no commit, until the next command to
    deliver has the op `stop_before` (it stays undelivered)."""
    for _ in range(500):
        moved = False
        for topic in ("conversations", "effects"):
            records, position = bus.records(topic), bus.delivered.get(topic, 0)
            if position >= len(records):
                continue
            if topic == "effects" and decode_command(records[position].value).op == stop_before:
                return
            bus.delivered[topic] = position + 1
            await deliver(service, bus, records[position], commit=False)
            moved = True
        if not moved:
            raise AssertionError(f"no {stop_before} command came")
    raise AssertionError("the service did not settle")


async def commit(service: WorkerService, bus: Bus) -> Offsets:
    """What the transport does at a commit: write the cache, flush (acks), then commit the offsets delivered."""
    service.before_commit()
    await service.sink.flush()
    return dict(bus.delivered)


def tables_of(tables: WorkerTables) -> tuple[dict[str, Any], dict[str, Any]]:
    assert isinstance(tables.states, MemoryTable) and isinstance(tables.timers, MemoryTable)
    return dict(tables.states.data), dict(tables.timers.data)


def billing() -> FakeChatwoot:
    return FakeChatwoot(messages=[incoming(1, "I was charged twice")], decision=decision(topic="invoices"))


async def test_a_crash_with_a_dirty_cache_folds_the_records_after_the_committed_offset_again_to_the_same_states() -> (
    None
):
    chatwoot = billing()
    tables, bus = new_tables(), Bus()
    dead = new_service(tables, chatwoot, max_chain=0)  # no chained reads: one command per fold step
    webhook(bus)
    await deliver(dead, bus, bus.records("conversations")[0], commit=False)
    bus.delivered["conversations"] = 1
    committed = await commit(dead, bus)
    await fold_uncommitted(dead, bus, stop_before="set_labels")  # reads and System One, folded, never committed
    cached = dead.states.get(KEY)
    assert cached is not None and cached.run is not None and cached.run.pending is not None
    assert state(tables) != cached  # the process dies with these folds only in its cache

    issued = [decode_command(r.value).command_id for r in bus.records("effects")]
    consumed = bus.delivered["effects"]

    restarted = new_service(tables, chatwoot, max_chain=0)  # the committed state; the rest is delivered again
    again = bus.records("conversations")[committed["conversations"] :]
    assert len(again) >= 3
    for record in again:
        await deliver(restarted, bus, record, commit=False)
    # the same commands, with the same ids, as the dead process sent for those records (all but the webhook's)
    sent_again = [decode_command(r.value).command_id for r in bus.records("effects")[len(issued) :]]
    assert sent_again == issued[1:]
    ops = chatwoot.ops()
    for record in bus.records("effects")[committed.get("effects", 0) : consumed]:  # consumed again: none runs
        await deliver(restarted, bus, record, commit=False)
    assert chatwoot.ops() == ops
    await commit(restarted, bus)

    reference_tables, reference_bus = new_tables(), Bus()  # the same records folded, a commit after each
    reference = new_service(reference_tables, chatwoot, max_chain=0)
    for record in bus.records("conversations")[: committed["conversations"] + len(again)]:
        await reference.on_record("router", record)
        await commit(reference, reference_bus)
    assert state(tables) == cached  # the same state as the dead process had in its cache
    assert tables_of(tables) == tables_of(reference_tables)  # states and timers entries
    assert restarted.timers.index.due_of(KEY) == wakeup_of(cached)


async def test_a_crash_after_the_flush_before_the_offset_commit_makes_redelivered_records_rewrite_what_they_find() -> (
    None
):
    chatwoot = billing()
    tables, bus = new_tables(), Bus()
    dead = new_service(tables, chatwoot)
    webhook(bus)
    committed = dict(bus.delivered)  # nothing committed yet
    await fold_uncommitted(dead, bus, stop_before="set_labels")
    dead.before_commit()
    await dead.sink.flush()  # the cache is written and acknowledged; the process dies before the offset commit
    states, timers = tables.states, tables.timers
    assert isinstance(states, MemoryTable) and isinstance(timers, MemoryTable)
    before = (states.writes, timers.writes, tables_of(tables))
    assert timers.get(KEY) is not None  # the run waits: the key is listed

    restarted = new_service(tables, chatwoot)
    again = bus.records("conversations")[committed.get("conversations", 0) :]
    assert len(again) >= 3
    for record in again:
        await deliver(restarted, bus, record, commit=False)
    assert restarted.before_commit() == 2  # the state and the timers entry, each once for all those records
    assert (states.writes, timers.writes) == (before[0] + 1, before[1] + 1)
    assert tables_of(tables) == before[2]  # the same values, written again
    assert isinstance(restarted.sink, MemorySink) and restarted.sink.on("effects") == []  # no-ops: nothing sent


async def test_the_cache_is_written_and_acknowledged_before_a_reply_is_sent() -> None:
    chatwoot = FakeChatwoot(messages=[incoming(1, "refund please")], decision=decision(kind="refund"))
    tables, bus = new_tables(), Bus()
    service = new_service(tables, chatwoot)
    seen: list[tuple[int, ConversationState]] = []

    class Watching(MemorySink):
        async def send(self, topic: str, key: str, value: bytes, headers: Headers | None = None) -> None:
            if topic == "effects" and decode_command(value).op == "create_message":
                seen.append((self.flushes, state(tables)))
            await super().send(topic, key, value, headers)

    service.sink = Watching()
    webhook(bus)
    await fold_uncommitted(service, bus, stop_before="create_message")
    assert len(seen) == 1
    flushes, stored = seen[0]
    assert flushes >= 1
    cached = service.states.get(KEY)
    assert cached is not None and stored == cached  # the ledger entry was in the table before the command left
    assert service.states.dirty == 0


async def test_each_changed_key_is_written_once_per_commit() -> None:
    chatwoot = billing()
    tables, bus = new_tables(), Bus()
    service = new_service(tables, chatwoot)
    webhook(bus)
    await fold_uncommitted(service, bus, stop_before="set_labels")
    states = tables.states
    assert isinstance(states, MemoryTable) and states.writes == 0 and service.states.dirty == 1
    assert service.before_commit() == 2 and states.writes == 1  # several fold steps, one state record
    assert service.before_commit() == 0  # nothing changed since
