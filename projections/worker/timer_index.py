"""The in-memory side of the durable timers (DESIGN §7): per-partition min-heaps of due times.

The durable copy is each key's folded state (its due time is part of it); this index mirrors the due times of the
partitions the worker owns, so a once-a-second tick costs what is due, not what is stored. It is rebuilt
from the table after every recovery and loses a partition's heap when that partition is revoked.

A fired entry stays armed: it fires again `refire_ms` later unless the table's due time for the key changed
in between (the fold's answer to the `TimerFired` normally moves it). That covers a `TimerFired` lost after
it was popped; a lost one across a crash is covered by the rebuild. Stale heap entries (a key whose due time
moved) are dropped lazily when they reach the top. Pure: the caller passes "now".
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable

DEFAULT_REFIRE_MS = 30_000


class TimerIndex:
    """Due times by partition; `pop_due` returns the (key, due_ms) pairs that should fire now."""

    def __init__(self, *, refire_ms: int = DEFAULT_REFIRE_MS) -> None:
        self.refire_ms = refire_ms
        # partition -> heap of (fire_at_ms, due_ms, key); due = what the table held when pushed
        self._heaps: dict[int, list[tuple[int, int, str]]] = {}
        self._due: dict[str, tuple[int, int]] = {}  # key -> (partition, due_ms): the table's mirror

    def __len__(self) -> int:
        return len(self._due)

    def due_of(self, key: str) -> int | None:
        entry = self._due.get(key)
        return entry[1] if entry is not None else None

    def set(self, partition: int, key: str, due_ms: int | None) -> None:
        """Mirror a table write: a new due time for `key` (None = no timer)."""
        if due_ms is None:
            self._due.pop(key, None)
            return
        if self._due.get(key) == (partition, due_ms):
            return
        self._due[key] = (partition, due_ms)
        heapq.heappush(self._heaps.setdefault(partition, []), (due_ms, due_ms, key))

    def rebuild(self, entries: Iterable[tuple[int, str, int]]) -> None:
        """Replace everything with `(partition, key, due_ms)` entries read from the table."""
        self._heaps.clear()
        self._due.clear()
        for partition, key, due_ms in entries:
            self._due[key] = (partition, due_ms)
            self._heaps.setdefault(partition, []).append((due_ms, due_ms, key))
        for heap in self._heaps.values():
            heapq.heapify(heap)

    def drop_partitions(self, partitions: Iterable[int]) -> None:
        """Forget partitions this worker no longer owns."""
        gone = set(partitions)
        for partition in gone:
            self._heaps.pop(partition, None)
        for key in [k for k, (p, _) in self._due.items() if p in gone]:
            del self._due[key]

    def pop_due(self, now_ms: int, partitions: Iterable[int] | None = None) -> list[tuple[str, int]]:
        """The timers due at `now_ms` in `partitions` (all when None); each is re-armed `refire_ms` later."""
        fired: list[tuple[str, int]] = []
        for partition in list(self._heaps) if partitions is None else partitions:
            heap = self._heaps.get(partition)
            if not heap:
                continue
            rearm: list[tuple[int, int, str]] = []
            while heap and heap[0][0] <= now_ms:
                _, due_ms, key = heapq.heappop(heap)
                if self._due.get(key) != (partition, due_ms):
                    continue  # stale: the due time moved or was cleared
                fired.append((key, due_ms))
                rearm.append((now_ms + self.refire_ms, due_ms, key))
            for entry in rearm:
                heapq.heappush(heap, entry)
        return fired

    def pending(self) -> int:
        """How many keys have a timer (for metrics)."""
        return len(self._due)
