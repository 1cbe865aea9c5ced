"""Every record of an owned partition is folded once, in order (projections.worker.offsets)."""

from __future__ import annotations

from projections.worker.offsets import OffsetTracker

A = ("app.conversations", 0)
B = ("app.conversations", 1)


def test_a_new_partition_starts_where_the_group_resumes_it() -> None:
    tracker = OffsetTracker()
    tracker.assign([A, B], {A: 0, B: 17})
    assert tracker.check(A, 0).verdict == "next"
    assert tracker.check(B, 17).verdict == "next"


def test_records_past_the_expected_offset_are_a_gap_to_read_first() -> None:
    """Faust left the fetch position past records it dropped: offsets 0..4 never reached the agent."""
    tracker = OffsetTracker()
    tracker.assign([A], {A: 0})
    check = tracker.check(A, 5)
    assert check.verdict == "gap" and check.expected == 0


def test_records_folded_already_are_duplicates() -> None:
    tracker = OffsetTracker()
    tracker.assign([A], {A: 0})
    for offset in range(3):
        assert tracker.check(A, offset).verdict == "next"
        tracker.advance(A, offset)
    assert tracker.check(A, 1).verdict == "duplicate"
    assert tracker.check(A, 3).verdict == "next"


def test_a_kept_partition_continues_at_the_groups_offset_when_it_is_lower() -> None:
    """The group committed less than this process folded: the records between are handed over (or read) again and
    folded as no-ops; nothing is skipped (issue 34)."""
    tracker = OffsetTracker()
    tracker.assign([A], {A: 0})
    for offset in range(10):
        tracker.advance(A, offset)
    tracker.assign([A], {A: 4})
    assert tracker.check(A, 4).verdict == "next"
    assert tracker.check(A, 3).verdict == "duplicate"


def test_a_kept_partition_never_jumps_to_a_group_offset_ahead_of_what_it_folded() -> None:
    """Faust can commit past records no agent folded (it acks what it skips): a group offset ahead of this process
    is no proof, so the partition continues at its own next offset (issue 34; before, it took the larger)."""
    tracker = OffsetTracker()
    tracker.assign([A], {A: 0})
    tracker.advance(A, 2)
    tracker.assign([A], {A: 40})
    assert tracker.check(A, 3).verdict == "next"
    assert tracker.check(A, 40).verdict == "gap"


def test_a_newly_assigned_partition_starts_at_the_groups_offset() -> None:
    tracker = OffsetTracker()
    tracker.assign([A], {A: 40})
    assert tracker.check(A, 40).verdict == "next"


def test_a_revoked_partition_is_forgotten() -> None:
    tracker = OffsetTracker()
    tracker.assign([A, B], {A: 0, B: 0})
    tracker.advance(B, 5)
    tracker.assign([A], {A: 0})
    assert tracker.check(B, 3).verdict == "untracked"
    tracker.assign([A, B], {A: 0, B: 2})
    assert tracker.check(B, 2).verdict == "next"  # not 6: it was away, the group's offset rules


def test_a_quiet_partition_stopped_short_of_its_last_records_is_fetched_again() -> None:
    """The record Faust dropped was the partition's last: no later record will ever reveal the gap."""
    from projections.worker.offsets import TailWatch

    watch = TailWatch(stall_ms=10_000)
    assert not watch.stuck(A, expected=298, highwater=299, now_ms=0)
    assert not watch.stuck(A, expected=298, highwater=299, now_ms=9_000)
    assert watch.stuck(A, expected=298, highwater=299, now_ms=10_000)
    assert not watch.stuck(A, expected=298, highwater=299, now_ms=11_000)  # once per stall period
    assert watch.stuck(A, expected=298, highwater=299, now_ms=20_000)


def test_a_backlog_being_worked_through_or_a_caught_up_partition_is_left_alone() -> None:
    from projections.worker.offsets import TailWatch

    watch = TailWatch(stall_ms=10_000)
    for second, expected in enumerate(range(100, 130)):
        assert not watch.stuck(A, expected=expected, highwater=500, now_ms=second * 1000)
    assert not watch.stuck(B, expected=40, highwater=40, now_ms=0)
    assert not watch.stuck(B, expected=40, highwater=40, now_ms=60_000)
    assert not watch.stuck(B, expected=None, highwater=41, now_ms=60_000)
