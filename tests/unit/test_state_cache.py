"""ModelCache: decoded states kept for recently folded keys, written back once per commit, bounded, emptied of
clean values at a rebalance; a dirty value is never dropped before it is written."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import pytest
from pydantic import ValidationError

from handlers.worker.ports import MemoryTable
from handlers.worker.state_cache import ModelCache
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
    cache.set("1:1", state(3), 0)
    assert table.get("1:1") is None  # not before the commit
    assert cache.write_dirty() == 1
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
    cache.set("1:1", state(1), 0)
    cache.write_dirty()
    table.set("1:1", state(2).model_dump(mode="json"))  # another owner's write, recovered from the changelog
    cache.clear()
    assert cache.get("1:1") == state(2)


def test_the_least_recently_used_keys_are_forgotten_first() -> None:
    table = CountingTable()
    cache = ModelCache(table, ConversationState, capacity=2)
    cache.set("1:1", state(1), 0)
    cache.set("1:2", state(2), 0)
    cache.write_dirty()
    cache.get("1:1")  # 1:2 is now the least recently used
    cache.set("1:3", state(3), 0)
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


def test_each_changed_key_is_written_once_per_commit_to_its_partition() -> None:
    table = CountingTable()
    cache = ModelCache(table, ConversationState)
    scopes: list[int] = []

    @contextmanager
    def scope(partition: int) -> Iterator[None]:
        scopes.append(partition)
        yield

    for version in range(5):  # five fold steps of one key, one of another
        cache.set("1:1", state(version), 3)
    cache.set("1:2", state(9), 1)
    assert cache.dirty == 2 and table.writes == 0
    assert cache.write_dirty(scope) == 2
    assert table.writes == 2 and sorted(scopes) == [1, 3]
    assert table.get("1:1") == state(4).model_dump(mode="json")
    assert cache.write_dirty(scope) == 0  # nothing changed since


def test_a_rewrite_writes_the_value_it_finds_again() -> None:
    table = CountingTable()
    table.set("1:1", state(5).model_dump(mode="json"))
    cache = ModelCache(table, ConversationState)
    cache.rewrite("1:1", 0)
    cache.rewrite("1:2", 0)  # nothing there: nothing to write
    assert cache.write_dirty() == 1 and table.writes == 2


def test_a_dirty_value_is_never_evicted_or_cleared_before_it_is_written() -> None:
    table = CountingTable()
    cache = ModelCache(table, ConversationState, capacity=2)
    for n in range(1, 5):
        cache.set(f"1:{n}", state(n), 0)
    cache.clear()  # a rebalance before the commit (the worker writes first; the cache never loses a fold anyway)
    assert len(cache) == 4  # over capacity rather than lose a fold
    assert cache.write_dirty() == 4
    assert all(table.get(f"1:{n}") == state(n).model_dump(mode="json") for n in range(1, 5))
    cache.set("1:5", state(5), 0)
    assert len(cache) == 2  # clean values are dropped again once the dirty ones are written


def test_without_write_back_every_set_writes_through_at_once() -> None:
    table = CountingTable()
    cache = ModelCache(table, ConversationState, write_back=False)
    cache.set("1:1", state(1), 0)
    cache.set("1:1", state(2), 0)
    assert table.writes == 2 and table.get("1:1") == state(2).model_dump(mode="json")
    assert cache.dirty == 0 and cache.write_dirty() == 0
