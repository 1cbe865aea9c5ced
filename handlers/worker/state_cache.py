"""Decoded fold states kept in memory and written back once per commit (issues 16 and 23).

Every record of a conversation used to read its state from the table (RocksDB and JSON) and validate it into a
`ConversationState` before the fold, and to write the new state back at once, one changelog record per step.
`ModelCache` keeps the decoded object of the keys folded lately and is a *write cache*: a fold step marks its
key dirty, and `write_dirty` (called at each commit, before the producer is flushed and the input offsets are
committed: docs/architecture.md "The commit protocol") writes each dirty key once. The table stays the durable
copy (its changelog is what a new owner recovers).

It is safe because one process is the only writer of a partition's keys while it owns the partition, and the
fold never changes a state in place (the state models are frozen; a step returns new objects). Clean entries are
forgotten at every rebalance (a partition that comes back may have been written by another owner meanwhile) and
when the cache is full (least recently used first out); a dirty entry is never dropped before it is written.
With `write_back=False` every `set` writes through at once, as before issue 23.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Generic, TypeVar

from pydantic import BaseModel

from handlers.worker.ports import PartitionScope, Table, any_partition

M = TypeVar("M", bound=BaseModel)

CAPACITY = 4096
"""Enough for the conversations in flight; a state is a few KB of objects, so a few tens of MB at most."""


class ModelCache(Generic[M]):
    """A table's values as `model` objects for recently used keys; changed keys are written back on commit."""

    def __init__(self, table: Table, model: type[M], capacity: int = CAPACITY, *, write_back: bool = True) -> None:
        if capacity < 1:
            raise ValueError("capacity must be at least 1")
        self.table = table
        self.model = model
        self.capacity = capacity
        self.write_back = write_back
        self._values: OrderedDict[str, M] = OrderedDict()
        self._dirty: dict[str, int] = {}  # key -> partition, for the keys changed since the last write

    def get(self, key: str) -> M | None:
        """The key's value, decoded (raises the model's ValidationError if the stored value is not one)."""
        value = self._values.get(key)
        if value is not None:
            self._values.move_to_end(key)
            return value
        stored = self.table.get(key)
        if stored is None:
            return None
        value = self.model.model_validate(stored)
        self._remember(key, value)
        return value

    def set(self, key: str, value: M, partition: int) -> None:
        """Keep `value` as the key's value; it is written to partition `partition` of the table on commit (at
        once, in the current event's partition, without `write_back`)."""
        if self.write_back:
            self._dirty[key] = partition
        else:
            self.table.set(key, value.model_dump(mode="json"))
        self._remember(key, value)

    def rewrite(self, key: str, partition: int) -> None:
        """Write the key's current value again on commit (a redelivered record: docs/consumer-gaps.md §2)."""
        value = self.get(key)
        if value is not None:
            self.set(key, value, partition)

    def write_dirty(self, scope: PartitionScope = any_partition) -> int:
        """Write every dirty key to the table once (as JSON), partition by partition; returns how many."""
        by_partition: dict[int, list[str]] = {}
        for key, partition in self._dirty.items():
            by_partition.setdefault(partition, []).append(key)
        written = 0
        for partition, keys in by_partition.items():
            with scope(partition):
                for key in keys:
                    self.table.set(key, self._values[key].model_dump(mode="json"))
                    del self._dirty[key]  # only once it is written: a write that raises leaves the rest dirty
                    written += 1
        return written

    @property
    def dirty(self) -> int:
        return len(self._dirty)

    def clear(self) -> None:
        """Forget every clean value (the table is read again): at a rebalance. Dirty values stay until written."""
        for key in [key for key in self._values if key not in self._dirty]:
            del self._values[key]

    def __len__(self) -> int:
        return len(self._values)

    def _remember(self, key: str, value: M) -> None:
        self._values[key] = value
        self._values.move_to_end(key)
        if len(self._values) > self.capacity:
            self._evict()

    def _evict(self) -> None:
        """Drop least recently used clean values down to capacity; dirty ones stay (the cache may run over)."""
        excess = len(self._values) - self.capacity
        victims: list[str] = []
        for key in self._values:  # oldest first; usually the first one is clean
            if key not in self._dirty:
                victims.append(key)
                if len(victims) >= excess:
                    break
        for key in victims:
            del self._values[key]
