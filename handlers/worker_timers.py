"""Durable timers (DESIGN §7), derived from the state: the in-memory index and the runs resumed after a takeover.

A key's next due time is part of its folded state (`wakeup_of`: the pending command's deadline, else the job's
due time; `sweep_wakeup` for a sweep), and the state tables are changelog-backed, so a due time outlives any
process without a table of its own. `TimerIndex` mirrors the owned partitions in memory: each fold step sets
its key's due time, and after every rebalance the index is rebuilt by reading the owned partitions' states
(a key's partition is the one Kafka's default partitioner gives its bytes, as for every record of the key).

A run that waits for the outcome of a command this process did not issue (it died with another process, or with
this one before a restart) is resumed at once when its partition is newly owned, instead of at its deadline.
Which runs wait on this process's own commands is kept in memory: those commands are still in its lanes.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from aiokafka.partitioner import murmur2
from pydantic import ValidationError

from handlers.worker_ports import Table
from projections.fold import wakeup_of
from projections.sweep import sweep_wakeup
from projections.timer_index import TimerIndex
from schemas.state import ConversationState, SweepState

log = logging.getLogger("chatwoot_router.worker")


def partition_of_key(key: str, partitions: int) -> int:
    """The partition Kafka's default partitioner (murmur2, as the Java client) gives a record keyed `key`."""
    return (murmur2(key.encode()) & 0x7FFFFFFF) % partitions


class Timers:
    """Due times of the keys in the partitions this process owns, and the runs waiting on its own commands."""

    def __init__(self, states: Table, sweep_states: Table, partitions: int) -> None:
        self.states = states
        self.sweep_states = sweep_states
        self.partition_of: Callable[[str], int] = lambda key: partition_of_key(key, partitions)
        self.index = TimerIndex()
        self.waiting_here: set[str] = set()  # keys whose run waits for a command this process issued
        self._generation: int | None = None
        self._partitions: frozenset[int] = frozenset()

    def set(self, partition: int, key: str, due_ms: int | None, *, waiting: bool = False, issued: bool = False) -> None:
        """A fold step's result for `key`: its next due time, and whether its run now waits on this process."""
        if not waiting:
            self.waiting_here.discard(key)
        elif issued:
            self.waiting_here.add(key)
        self.index.set(partition, key, due_ms)

    def refresh(self, owned: frozenset[int], generation: int | None) -> list[tuple[str, int]]:
        """Rebuild the index from the owned partitions' states when the assignment changed.

        Returns the conversations of newly owned partitions whose run waits for the outcome of a command another
        process issued (or this one, before it restarted): they are resumed now rather than at their deadline.
        """
        if generation == self._generation and owned == self._partitions:
            return []
        new = owned - self._partitions
        entries: list[tuple[int, str, int]] = []
        resume: list[tuple[str, int]] = []
        self.waiting_here = {key for key in self.waiting_here if self.partition_of(key) in owned and key}
        for key, value in self.states.items():
            partition = self.partition_of(key)
            if partition not in owned or value is None:
                continue
            try:
                state = ConversationState.model_validate(value)
            except ValidationError:
                continue
            due = wakeup_of(state)
            if due is None:
                continue
            entries.append((partition, key, due))
            waiting = state.run is not None and state.run.pending is not None
            if waiting and partition in new and key not in self.waiting_here:
                resume.append((key, due))
        for key, value in self.sweep_states.items():
            partition = self.partition_of(key)
            if partition not in owned or value is None:
                continue
            try:
                due = sweep_wakeup(SweepState.model_validate(value))
            except ValidationError:
                continue
            if due is not None:
                entries.append((partition, key, due))
        self.index.rebuild(entries)
        self._generation, self._partitions = generation, owned
        counts = {"timers": len(entries), "resumed": len(resume), "partitions": sorted(owned)}
        log.info("timer index rebuilt", extra=counts)
        return resume

    def pop_due(self, now_ms: int, owned: frozenset[int]) -> list[tuple[str, int]]:
        return self.index.pop_due(now_ms, owned)

    def pending(self) -> int:
        return self.index.pending()
