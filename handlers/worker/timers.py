"""Durable timers (DESIGN §7): the keys that have a due time, the in-memory index, and runs resumed after a takeover.

A key's next due time is part of its folded state (`wakeup_of`: the pending command's deadline, else the job's
due time; `sweep_wakeup` for a sweep). The changelog-backed `timers` table lists the keys that have one, with
their partition, and changes only when a key gains or loses its due time (twice per turn), not at every step;
like the states, the table is written once per commit (`write_dirty`), so a key listed and unlisted between two
commits writes nothing.
`TimerIndex` mirrors the owned partitions in memory: each fold step sets its key's due time, and after every
rebalance the index is rebuilt from the listed keys' states, so a rebalance reads the conversations that are
in progress, never every conversation ever seen.

A run that waits for the outcome of a command this process did not issue (it died with another process, or with
this one before a restart) is resumed at once when its partition is newly owned, instead of at its deadline.
Which runs wait on this process's own commands is kept in memory: those commands are still in its lanes.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Any

from pydantic import BaseModel, ConfigDict, ValidationError

from handlers.worker.ports import PartitionScope, Table, any_partition
from handlers.worker.state_cache import ModelCache
from projections.fold import wakeup_of
from projections.sweep import sweep_wakeup
from projections.worker.timer_index import TimerIndex
from schemas.keys import is_conversation_key
from schemas.state import ConversationState, SweepState

log = logging.getLogger("chatwoot_router.worker")


class TimerKey(BaseModel):
    """A `timers` table value: the key has a due time (in its state); `p` is the partition that owns it.

    Entries written before due times were read from the state also hold `due` and `waiting_by`: ignored."""

    model_config = ConfigDict(extra="ignore", frozen=True)

    p: int


class Timers:
    """Due times of the keys in the partitions this process owns, and the runs waiting on its own commands."""

    def __init__(
        self,
        table: Table,
        states: ModelCache[ConversationState],
        sweep_states: ModelCache[SweepState],
        *,
        write_back: bool = True,
    ) -> None:
        self.table = table
        self.write_back = write_back  # False: each change is written at once, as before issue 23
        self.states = states
        self.sweep_states = sweep_states
        self.index = TimerIndex()
        self.listed: set[str] = set()  # keys of owned partitions the table lists
        self.waiting_here: set[str] = set()  # keys whose run waits for a command this process issued
        # key -> (partition, entry or None to unlist): the table writes since the last commit
        self._writes: dict[str, tuple[int, dict[str, Any] | None]] = {}
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
        """A fold step's result for `key`: its next due time, and whether its run now waits on this process.

        `rewrite` lists the key again even when it is listed: a redelivered record, whose changelog record may
        never have left a killed process (docs/consumer-gaps.md §2).
        """
        if not waiting:
            self.waiting_here.discard(key)
        elif issued:
            self.waiting_here.add(key)
        if due_ms is not None:
            if key not in self.listed or rewrite:
                self._write(key, partition, TimerKey(p=partition).model_dump())
                self.listed.add(key)
        elif key in self.listed or self._entry(key) is not None:
            self._write(key, partition, None)
            self.listed.discard(key)
        self.index.set(partition, key, due_ms)

    def _write(self, key: str, partition: int, value: dict[str, Any] | None) -> None:
        if self.write_back:
            self._writes[key] = (partition, value)
        elif value is not None:
            self.table.set(key, value)
        else:
            self.table.delete(key)

    def write_dirty(self, scope: PartitionScope = any_partition) -> int:
        """Write the entries changed since the last commit, each once; returns how many records that made.

        An entry unlisted before it was ever written is not written at all (the table never had it)."""
        by_partition: dict[int, list[str]] = {}
        for key, (partition, _) in self._writes.items():
            by_partition.setdefault(partition, []).append(key)
        written = 0
        for partition, keys in by_partition.items():
            with scope(partition):
                for key in keys:
                    value = self._writes[key][1]
                    if value is not None:
                        self.table.set(key, value)
                        written += 1
                    elif self.table.get(key) is not None:
                        self.table.delete(key)
                        written += 1
                    del self._writes[key]
        return written

    @property
    def dirty(self) -> int:
        return len(self._writes)

    def _entry(self, key: str) -> Any | None:
        """The key's entry as the next commit leaves it."""
        if key in self._writes:
            return self._writes[key][1]
        return self.table.get(key)

    def _entries(self) -> Iterator[tuple[str, Any]]:
        """The table's entries as the next commit leaves them."""
        for key, value in self.table.items():
            if key not in self._writes:
                yield key, value
        for key, (_, value) in list(self._writes.items()):
            if value is not None:
                yield key, value

    def refresh(self, owned: frozenset[int], generation: int | None) -> list[tuple[str, int]]:
        """Rebuild the index from the listed keys' states when the assignment changed.

        Returns the conversations of newly owned partitions whose run waits for the outcome of a command another
        process issued (or this one, before it restarted): they are resumed now rather than at their deadline.
        """
        if generation == self._generation and owned == self._partitions:
            return []
        new = owned - self._partitions
        entries: list[tuple[int, str, int]] = []
        resume: list[tuple[str, int]] = []
        listed: set[str] = set()
        for key, value in self._entries():
            try:
                partition = TimerKey.model_validate(value).p
            except ValidationError:
                continue
            if partition not in owned:
                continue
            listed.add(key)
            due, waiting = self._due_of(key)
            if due is None:
                continue
            entries.append((partition, key, due))
            if waiting and partition in new and key not in self.waiting_here:
                resume.append((key, due))
        self.listed = listed
        self.waiting_here &= listed
        self.index.rebuild(entries)
        self._generation, self._partitions = generation, owned
        counts = {"timers": len(entries), "resumed": len(resume), "partitions": sorted(owned)}
        log.info("timer index rebuilt", extra=counts)
        return resume

    def _due_of(self, key: str) -> tuple[int | None, bool]:
        """The key's due time from its state, and whether its run waits for an outcome."""
        try:
            if is_conversation_key(key):
                state = self.states.get(key)
                if state is None:
                    return None, False
                return wakeup_of(state), state.run is not None and state.run.pending is not None
            sweep = self.sweep_states.get(key)
            return (sweep_wakeup(sweep) if sweep is not None else None), False
        except ValidationError:
            return None, False

    def pop_due(self, now_ms: int, owned: frozenset[int]) -> list[tuple[str, int]]:
        return self.index.pop_due(now_ms, owned)

    def pending(self) -> int:
        return self.index.pending()
