"""ModelCache: decoded states kept for recently folded keys, written through, bounded, emptied at a rebalance."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from handlers.state_cache import ModelCache
from handlers.worker_ports import MemoryTable
from schemas.state import ConversationState, Job


class CountingTable(MemoryTable):
    """A memory table that counts reads, to show which gets are served from memory."""

    def __init__(self) -> None:
        super().__init__()
        self.reads = 0

    def get(self, key: str) -> object | None:
        self.reads += 1
        return super().get(key)


def state(version: int) -> ConversationState:
    return ConversationState(job=Job(version=version, not_before=0, created_at=0))


def test_a_value_written_is_served_from_memory_and_stored_as_json() -> None:
    table = CountingTable()
    cache = ModelCache(table, ConversationState)
    cache.set("1:1", state(3))
    assert table.get("1:1") == state(3).model_dump(mode="json")
    reads = table.reads
    assert cache.get("1:1") == state(3)
    assert table.reads == reads  # not read again


def test_a_value_found_only_in_the_table_is_decoded_once() -> None:
    table = CountingTable()
    table.set("1:1", state(5).model_dump(mode="json"))
    cache = ModelCache(table, ConversationState)
    assert cache.get("1:1") == state(5) and cache.get("1:1") == state(5)
    assert table.reads == 1
    assert cache.get("1:2") is None


def test_clear_makes_the_next_get_read_the_table_again() -> None:
    """At a rebalance the table may have been written by another owner: its value wins."""
    table = CountingTable()
    cache = ModelCache(table, ConversationState)
    cache.set("1:1", state(1))
    table.set("1:1", state(2).model_dump(mode="json"))  # another owner's write, recovered from the changelog
    cache.clear()
    assert cache.get("1:1") == state(2)


def test_the_least_recently_used_keys_are_forgotten_first() -> None:
    table = CountingTable()
    cache = ModelCache(table, ConversationState, capacity=2)
    cache.set("1:1", state(1))
    cache.set("1:2", state(2))
    cache.get("1:1")  # 1:2 is now the least recently used
    cache.set("1:3", state(3))
    assert len(cache) == 2
    reads = table.reads
    assert cache.get("1:1") == state(1) and cache.get("1:3") == state(3)
    assert table.reads == reads
    assert cache.get("1:2") == state(2)  # read back from the table, nothing lost
    assert table.reads == reads + 1


def test_an_invalid_stored_value_raises_and_is_not_kept() -> None:
    table = CountingTable()
    table.set("1:1", {"job": {"version": "not a number"}})
    cache = ModelCache(table, ConversationState)
    with pytest.raises(ValidationError):
        cache.get("1:1")
    assert len(cache) == 0
