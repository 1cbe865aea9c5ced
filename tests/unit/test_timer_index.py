"""The durable timers' in-memory index: what fires, when, for which partitions, and what is forgotten."""

from __future__ import annotations

from projections.worker.timer_index import TimerIndex


def test_fires_only_what_is_due_in_order_of_due_time() -> None:
    index = TimerIndex()
    index.set(0, "1:1", 1_000)
    index.set(0, "1:2", 500)
    index.set(0, "1:3", 5_000)
    assert index.pop_due(1_000) == [("1:2", 500), ("1:1", 1_000)]
    assert index.pop_due(1_001) == []


def test_a_moved_or_cleared_due_time_does_not_fire_the_old_one() -> None:
    index = TimerIndex()
    index.set(0, "1:1", 1_000)
    index.set(0, "1:1", 9_000)
    index.set(0, "1:2", 1_000)
    index.set(0, "1:2", None)
    assert index.pop_due(2_000) == []
    assert index.pop_due(9_000) == [("1:1", 9_000)]


def test_a_fired_timer_fires_again_later_unless_its_due_time_changes() -> None:
    index = TimerIndex(refire_ms=10_000)
    index.set(3, "1:1", 1_000)
    assert index.pop_due(1_000) == [("1:1", 1_000)]
    assert index.pop_due(5_000) == []
    assert index.pop_due(11_000) == [("1:1", 1_000)]  # the TimerFired may have been lost
    index.set(3, "1:1", 50_000)  # the fold answered: the old due time is gone
    assert index.pop_due(30_000) == []


def test_only_the_given_partitions_fire_and_dropped_ones_are_forgotten() -> None:
    index = TimerIndex()
    index.set(0, "1:1", 100)
    index.set(1, "1:2", 100)
    assert index.pop_due(200, partitions=[1]) == [("1:2", 100)]
    index.drop_partitions([0])
    assert index.pop_due(200) == []
    assert index.due_of("1:1") is None and len(index) == 1


def test_rebuild_replaces_the_index_from_table_entries() -> None:
    index = TimerIndex()
    index.set(0, "stale", 1)
    index.rebuild([(0, "1:pending", 300), (2, "1:7", 100)])
    assert index.due_of("stale") is None
    assert sorted(index.pop_due(1_000)) == [("1:7", 100), ("1:pending", 300)]


def test_many_future_timers_leave_only_the_due_one_to_fire() -> None:
    index = TimerIndex()
    for n in range(10_000):
        index.set(n % 4, f"1:{n}", 1_000_000 + n)
    index.set(2, "1:due", 10)
    assert index.pop_due(10) == [("1:due", 10)]
    assert index.pending() == 10_001
