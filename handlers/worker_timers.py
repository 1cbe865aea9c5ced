"""Durable timers (DESIGN §7): the `timers` table, its in-memory index and the runs resumed after a takeover.

The agent that folds a key writes the key's next due time to the table (changelog-backed, so a due time
outlives any process); `TimerIndex` mirrors the owned partitions in memory and is rebuilt from the table after
every rebalance. A run that waits for an outcome is marked with the id of the process that issued the awaited
command: a process that finds such an entry in a partition it has just taken over resumes the run at once.
"""

from __future__ import annotations

import logging

from handlers.worker_ports import Table
from projections.timer_index import TimerIndex
from schemas.keys import is_conversation_key
from schemas.state import TimerEntry

log = logging.getLogger("chatwoot_router.worker")


class Timers:
    """The table of due times and its index, for the partitions this process owns."""

    def __init__(self, table: Table, instance_id: str) -> None:
        self.table = table
        self.instance_id = instance_id
        self.index = TimerIndex()
        self._generation: int | None = None
        self._partitions: frozenset[int] = frozenset()

    def set(
        self,
        partition: int,
        key: str,
        due_ms: int | None,
        *,
        waiting: bool = False,
        issued: bool = False,
        rewrite: bool = False,
    ) -> None:
        """Record the key's next due time in the table and the index.

        A waiting run is marked with the issuer of the awaited command (this process when it `issued` it now).
        `rewrite` writes the entry even when the store already holds it: a redelivered record, whose changelog
        record may never have left a killed process (docs/consumer-gaps.md §2).
        """
        stored = self.table.get(key)
        by = None
        if waiting:
            issuer = stored.get("waiting_by") if isinstance(stored, dict) else None
            by = self.instance_id if issued or issuer is None else issuer
        entry = None if due_ms is None else TimerEntry(due=due_ms, p=partition, waiting_by=by).model_dump()
        if entry is not None and (entry != stored or rewrite):
            self.table.set(key, entry)
        elif entry is None and stored is not None:
            self.table.delete(key)
        self.index.set(partition, key, due_ms)

    def refresh(self, owned: frozenset[int], generation: int | None) -> list[tuple[str, int]]:
        """Rebuild the index from the table when the assignment changed (partitions moved, state recovered).

        Returns the conversations of newly owned partitions whose run waits for the outcome of a command another
        process issued: it may have died with that process, so they are resumed now rather than at their
        deadline. This process's own commands are still in its lanes and are never resumed.
        """
        if generation == self._generation and owned == self._partitions:
            return []
        new = owned - self._partitions
        entries, resume = [], []
        for key, value in self.table.items():
            try:
                entry = TimerEntry.model_validate(value)
            except ValueError:
                continue
            if entry.p not in owned:
                continue
            entries.append((entry.p, key, entry.due))
            if entry.waiting_by not in (None, self.instance_id) and entry.p in new and is_conversation_key(key):
                resume.append((key, entry.due))
        self.index.rebuild(entries)
        self._generation, self._partitions = generation, owned
        counts = {"timers": len(entries), "resumed": len(resume), "partitions": sorted(owned)}
        log.info("timer index rebuilt", extra=counts)
        return resume

    def pop_due(self, now_ms: int, owned: frozenset[int]) -> list[tuple[str, int]]:
        return self.index.pop_due(now_ms, owned)

    def pending(self) -> int:
        return self.index.pending()
