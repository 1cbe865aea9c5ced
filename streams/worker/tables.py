"""The worker's table manager and table class: Faust's, with two changes (nothing in Faust is patched).

The table class keeps the future of every changelog write for the commit barrier (`Table`, below).

The table manager is Faust's, without the second it waits at start before tables may still be declared.

Faust's `TableManager.on_start` sleeps one second so that tables declared late (at import time of modules loaded
after the app starts) are registered before recovery starts. The worker declares every table in
`WorkerApp.__init__`, before the app starts, so that second only delays recovery — and with it `/healthz` and
routing — after every start, including a worker that waited for the broker (DESIGN §3). The app selects this
class through Faust's `TableManager` setting; nothing in Faust is patched.
"""

from __future__ import annotations

import asyncio
import weakref
from typing import Any

import faust
from faust.tables import TableManager as FaustTableManager

from handlers.worker.barrier import Barrier
from schemas.records import GENERATION_HEADER


class TableManager(FaustTableManager):
    async def on_start(self) -> None:
        if not self.should_stop:
            await self._update_channels()
            await self.recovery.start()


class Table(faust.Table):
    """Faust's table, whose changelog writes are tracked by the worker's commit barrier (handlers/worker/barrier.py)
    and stamped with the writer's group generation.

    Faust sends a table write's changelog record with `send_soon` and only logs a failed send; this keeps the
    future of each in the barrier of the app (`track_changelog`), so nothing relies on a state whose changelog
    record was not acknowledged. Each record carries the header `router-generation` (the consumer group's
    generation the writer was in), so a write from a worker that had lost its partitions is visible on the
    changelog: it lands after a write of a newer generation (bench/chaos_verify.py checks there is none). This is
    Faust's `send_changelog` (every table write goes through it) with the headers added; the app selects this
    class through Faust's `Table` setting."""

    def send_changelog(
        self,
        partition: int | None,
        key: Any,
        value: Any,
        key_serializer: Any = None,
        value_serializer: Any = None,
    ) -> Any:
        future = self.changelog_topic.send_soon(
            key=key,
            value=value,
            partition=partition,
            key_serializer=self.key_serializer if key_serializer is None else key_serializer,
            value_serializer=self.value_serializer if value_serializer is None else value_serializer,
            headers=[(GENERATION_HEADER, str(self.app.consumer_generation_id).encode())],
            callback=self._on_changelog_sent,
            eager_partitioning=True,  # the record's partition is final at once, as in Faust's
        )
        barrier = _barriers.get(self.app)
        if barrier is not None:
            barrier.add(future)
        return future


_barriers: weakref.WeakKeyDictionary[Any, Barrier] = weakref.WeakKeyDictionary()


def track_changelog(app: Any, barrier: Barrier) -> None:
    """Every changelog write of `app`'s tables is added to `barrier`."""
    _barriers[app] = barrier


async def compact_store(table: Any, partition: int) -> None:
    """Compact the local RocksDB store of `table`'s `partition` (issue 32): a value replaced in RocksDB stays in its
    older files until a compaction rewrites them, and an erased data key's old value must not outlive the erasure
    deadline there either. In a thread: RocksDB compacts while the worker goes on. A table whose store is not
    RocksDB, or has no open database for it, has nothing to do."""
    databases = getattr(getattr(table, "data", None), "_dbs", None)
    database = databases.get(partition) if isinstance(databases, dict) else None
    if database is not None and hasattr(database, "compact_range"):
        await asyncio.to_thread(database.compact_range, None, None)
