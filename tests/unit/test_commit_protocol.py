"""The commit protocol (docs/architecture.md): states and `timers` entries are written back once per commit, the
producer is flushed, and only then are the input offsets committed. Told as crash stories on the in-process bus
of tests/unit/test_worker_service.py, where "commit" is what the transport does (`before_commit`, flush, offsets)
and a crash throws the process, its cache and its uncommitted offsets away.
"""

from __future__ import annotations

from typing import Any

import pytest
from faust.transport.drivers import aiokafka as faust_aiokafka
from faust.types import TP

from handlers.worker.ports import Headers, MemorySink, MemoryTable
from handlers.worker.service import WorkerService, WorkerTables
from projections.fold import wakeup_of
from schemas.codec import decode_command
from schemas.configs import ConfigDocument, FoldSettings
from schemas.keys import partition_slot
from schemas.records import ConfigApplied
from schemas.state import ConversationState
from streams.worker import transport
from tests.unit.test_fold_driver import T0, FakeChatwoot, decision, incoming, make_config
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
    """What the transport does at a commit: write the cache, flush (acks), then commit the offsets delivered
    (`test_a_crash_right_after_an_offset_commit_finds_every_record_below_it_in_the_table` runs the transport's own
    `_commit_offsets` instead)."""
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
    """Failure point 3a in-process: the records after the committed offset are folded again from the committed
    state to the states and command ids the dead process had, and the commands consumed again do not run.

    What it rests on is the fold's determinism and the admission of `projections/worker/admission.py` (both older than
    the cache); the commit's own guard, the hook before Faust's commit, is shown to matter by
    `test_a_crash_right_after_an_offset_commit_finds_every_record_below_it_in_the_table`. Shown to fail when a
    guard is removed (2026-12-02): with `WorkerService.awaited_command` answering the command itself (every copy
    awaited), the consumed-again commands run again."""
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
    """Failure point 5a: the cache was written and acknowledged, the offsets were not committed. The redelivered
    records are no-ops that write the state and the `timers` entry they find once more (the local store may hold
    values whose changelog records never left), and send nothing.

    Shown to fail when its guards are removed (2026-12-02): without `table.rewrite(...)` for a redelivered record
    in `WorkerService.fold_record`, the state is not written again; with `rewrite=False` passed to
    `Timers.set` there, the listed key's `timers` entry is not written again."""
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
    restarted.timers.refresh(frozenset({0}), generation=1)  # at assignment: the listed keys are known
    again = bus.records("conversations")[committed.get("conversations", 0) :]
    assert len(again) >= 3
    for record in again:
        await deliver(restarted, bus, record, commit=False)
    assert restarted.before_commit() == 2  # the state and the timers entry, each once for all those records
    assert (states.writes, timers.writes) == (before[0] + 1, before[1] + 1)
    assert tables_of(tables) == before[2]  # the same values, written again
    assert isinstance(restarted.sink, MemorySink) and restarted.sink.on("effects") == []  # no-ops: nothing sent


async def test_the_cache_is_written_and_acknowledged_before_a_reply_is_sent() -> None:
    """Failure point 4: a `create_message` leaves only once the state holding its reply-ledger entry is written
    and flushed, so a crash after it never issues the reply again.

    Shown to fail when its guard is removed (2026-12-02): without `await self.commit_cache()` before a step's
    `create_message` is sent (`WorkerService.fold_record`), the table has no state when the command leaves."""
    chatwoot = FakeChatwoot(messages=[incoming(1, "refund please")], decision=decision(kind="refund"))
    tables, bus = new_tables(), Bus()
    service = new_service(tables, chatwoot)
    seen: list[tuple[int, Any]] = []

    class Watching(MemorySink):
        async def send(self, topic: str, key: str, value: bytes, headers: Headers | None = None) -> None:
            if topic == "effects" and decode_command(value).op == "create_message":
                seen.append((self.flushes, tables.states.get(KEY)))
            await super().send(topic, key, value, headers)

    service.sink = Watching()
    webhook(bus)
    await fold_uncommitted(service, bus, stop_before="create_message")
    assert len(seen) == 1
    flushes, stored = seen[0]
    assert flushes >= 1
    cached = service.states.get(KEY)
    assert stored is not None, "the command left before its state was written"
    assert cached is not None and ConversationState.model_validate(stored) == cached  # the ledger entry included
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


async def test_a_crash_right_after_an_offset_commit_finds_every_record_below_it_in_the_table(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Failure point 3a through the worker's transport: Faust's commit (flush, then offsets) runs with the service's
    `before_commit` as the pre-commit hook, the process dies right after it, and the restarted one, which gets no
    record below the committed offsets again, finds the state the dead one had folded in the table.

    Shown to fail when its guard is removed (2026-12-02): with the `hook()` call taken out of
    `streams/worker/transport.py:Consumer._commit_offsets`, the offsets are committed while the state is only in the
    cache, and the table holds no state for the key (a record skipped for good)."""
    chatwoot = billing()
    tables, bus = new_tables(), Bus()
    dead = new_service(tables, chatwoot)
    committed: list[Offsets] = []

    async def faust_commit(self: Any, offsets: Any, start_new_transaction: bool = True) -> bool:
        await dead.sink.flush()  # Faust's own: producer.flush() (the acks), then the offset commit
        committed.append(dict(bus.delivered))
        return True

    monkeypatch.setattr(faust_aiokafka.Consumer, "_commit_offsets", faust_commit)
    consumer = transport.Consumer.__new__(transport.Consumer)  # nothing of it is started
    app = type("App", (), {})()
    object.__setattr__(consumer, "app", app)
    transport.set_pre_commit(app, dead.before_offsets_commit)

    webhook(bus)
    await fold_uncommitted(dead, bus, stop_before="set_labels")
    cached = dead.states.get(KEY)
    assert cached is not None and cached.run is not None and cached.run.pending is not None
    assert await consumer._commit_offsets({TP("conversations", 0): bus.delivered["conversations"]})
    assert committed[-1]["conversations"] == len(bus.records("conversations"))  # nothing left to redeliver

    restarted = new_service(tables, chatwoot)  # the dead process's cache is gone
    assert tables.states.get(KEY) is not None, "the offsets were committed while the state was only in the cache"
    assert restarted.states.get(KEY) == cached == state(tables)
    assert tables.timers.get(KEY) is not None  # the run waits: listed, so its timer is found after a rebalance
    restarted.timers.refresh(frozenset({0}), generation=1)
    assert restarted.timers.index.due_of(KEY) == wakeup_of(cached)


def other_document() -> ConfigDocument:
    return ConfigDocument.of(make_config(), FoldSettings(retry_base_ms=2000))  # another version


async def test_a_configuration_switch_writes_the_cache_before_it_records_the_new_version() -> None:
    """The states folded under the old version are durable before the partition's new version is: a crash after
    the switch never folds a record before the marker again under the new version.

    Shown to fail when its guard is removed (2026-12-02): without `await self.commit_cache()` in
    `WorkerService.switch_config`, the new version is in `partition_configs` while the table has no state."""
    chatwoot = billing()
    tables, bus = new_tables(), Bus()
    service = new_service(tables, chatwoot)
    new = other_document()
    service.book.add(new)
    seen: list[Any] = []

    class Watching(MemoryTable):
        def set(self, key: str, value: Any) -> None:
            seen.append((value, tables.states.get(KEY), service.states.dirty))
            super().set(key, value)

    tables = WorkerTables(tables.states, tables.sweep_states, tables.timers, tables.effect_attempts, Watching())
    service.tables = tables
    webhook(bus)
    await deliver(service, bus, bus.records("conversations")[0], commit=False)
    bus.delivered["conversations"] = 1
    assert service.states.dirty == 1
    marker = bus.append(
        "conversations", "__config__", ConfigApplied(version=new.version, at_ms=T0).model_dump_json().encode()
    )
    await deliver(service, bus, marker, commit=False)
    assert len(seen) == 1
    version, stored, dirty = seen[0]
    assert version == new.version and stored is not None and dirty == 0
    assert service.document_in_force("conversations", 0) == new


async def test_the_configuration_version_kept_for_a_partition_is_read_again_after_a_rebalance() -> None:
    """`document_in_force` reads a partition's version once and keeps it; a rebalance (`forget_states`) drops it,
    because another owner may have switched the partition while it was away.

    Shown to fail when its guard is removed (2026-12-02): without `self._versions.clear()` in
    `WorkerService.forget_states`, the partition stays on the version read before the rebalance."""
    tables = new_tables()
    service = new_service(tables, billing())
    old = service.document_in_force("conversations", 0)
    new = other_document()
    service.book.add(new)
    tables.partition_configs.set(partition_slot("conversations", 0), new.version)  # by the owner meanwhile
    assert service.document_in_force("conversations", 0) == old  # kept while the partition is owned here
    service.forget_states()  # a rebalance
    assert service.document_in_force("conversations", 0) == new
