"""Decoded fold states kept in memory, so a record's fold does not decode its key's state again (issue 16).

Every record of a conversation used to read its state from the table (RocksDB and JSON) and validate it into a
`ConversationState` before the fold, although the previous record of the same conversation had just produced
that very object. `ModelCache` keeps the decoded object of the keys folded lately and writes through to the
table, which stays the durable copy (its changelog is what a new owner recovers).

It is safe because one process is the only writer of a partition's keys while it owns the partition, and the
fold never changes a state in place (the state models are frozen; a step returns new objects). The cache is
emptied at every rebalance: a partition that comes back may have been written by another owner meanwhile. It is
bounded (least recently used first out), since a conversation's state is kept forever.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Generic, TypeVar

from pydantic import BaseModel

from handlers.worker_ports import Table

M = TypeVar("M", bound=BaseModel)

CAPACITY = 4096
"""Enough for the conversations in flight; a state is a few KB of objects, so a few tens of MB at most."""


class ModelCache(Generic[M]):
    """A table's values as `model` objects for recently used keys; writes go through to the table."""

    def __init__(self, table: Table, model: type[M], capacity: int = CAPACITY) -> None:
        if capacity < 1:
            raise ValueError("capacity must be at least 1")
        self.table = table
        self.model = model
        self.capacity = capacity
        self._values: OrderedDict[str, M] = OrderedDict()

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

    def set(self, key: str, value: M) -> None:
        """Write `value` to the table (as JSON) and keep it decoded."""
        self.table.set(key, value.model_dump(mode="json"))
        self._remember(key, value)

    def clear(self) -> None:
        """Forget every decoded value (the table is read again): at a rebalance."""
        self._values.clear()

    def __len__(self) -> int:
        return len(self._values)

    def _remember(self, key: str, value: M) -> None:
        self._values[key] = value
        self._values.move_to_end(key)
        if len(self._values) > self.capacity:
            self._values.popitem(last=False)
