"""Turn-guard operations (behavior.md §4.5, §6.2–§6.4) on their own."""

from __future__ import annotations

import pytest

from projections.guard import (
    ActivityPending,
    apply_turn_read,
    expect_activity,
    observe_status,
    record_failure,
)
from schemas.records import Boundary, TurnResult
from schemas.state import Expected, TurnGuard


def read(
    boundary: int | None,
    *,
    status: str = "pending",
    created: float = 100,
    complete: bool = True,
    deleted: bool = False,
) -> TurnResult:
    b = None if boundary is None else Boundary(id=boundary, created_at=created, activity_status=status)
    return TurnResult(boundary=b, complete=complete, deleted=deleted)


def test_older_or_duplicate_status_webhooks_are_ignored() -> None:
    g = expect_activity(TurnGuard(), "pending", 50.5)
    assert g.expected == Expected(status="pending", at=50.5, after=0) and g.transition_at == 50.5
    assert expect_activity(g, "resolved", 50.5) == g
    assert expect_activity(g, "resolved", 40) == g
    own = expect_activity(TurnGuard(boundary=9), "open")
    assert expect_activity(own, "open") == own


def test_a_claimed_boundary_requires_a_higher_activity_id() -> None:
    unclaimed = expect_activity(TurnGuard(boundary=9), "pending", 10)
    assert unclaimed.expected is not None and unclaimed.expected.after == 0
    claimed = expect_activity(TurnGuard(boundary=9, claimed=True, transition_at=5), "pending", 10)
    assert claimed.expected is not None and claimed.expected.after == 9
    never_lower = expect_activity(
        TurnGuard(boundary=3, expected=Expected(status="open", after=7)), "resolved"
    )
    assert never_lower.expected is not None and never_lower.expected.after == 7


def test_expectation_resets_failures_and_handoff_mode() -> None:
    g = expect_activity(TurnGuard(handoff=True, failures=4), "pending", 1)
    assert not g.handoff and g.failures == 0


def test_observed_leaving_pending_creates_an_expectation_once() -> None:
    g = observe_status(TurnGuard(), "pending")
    assert g.pending is True and g.expected is None
    g = observe_status(g, "resolved")
    assert g.pending is False and g.expected == Expected(status="resolved", after=0)
    assert observe_status(g, "resolved") == g


def test_third_failure_turns_on_handoff_mode() -> None:
    g = record_failure(record_failure(TurnGuard()))
    assert not g.handoff
    assert record_failure(g).handoff


def test_late_activity_raises_unless_in_handoff_mode() -> None:
    g = TurnGuard(boundary=5, expected=Expected(status="pending", at=200.9, after=5))
    with pytest.raises(ActivityPending):
        apply_turn_read(g, read(5))  # not newer than `after`
    with pytest.raises(ActivityPending):
        apply_turn_read(g, read(6, created=199))  # older than floor(at)
    with pytest.raises(ActivityPending):
        apply_turn_read(g, read(6, created=200, status="open"))  # another status
    ok = apply_turn_read(g, read(6, created=200))
    assert ok.boundary == 6 and ok.expected is None and ok.claimed is True
    forced = apply_turn_read(g.model_copy(update={"handoff": True}), read(5))
    assert forced.handoff and forced.expected == g.expected


def test_a_new_boundary_starts_a_new_turn() -> None:
    g = apply_turn_read(TurnGuard(boundary=5, handoff=True, failures=2, claimed=True), read(8))
    assert (g.boundary, g.handoff, g.failures, g.claimed) == (8, False, 0, False)


def test_vanished_deleted_or_incomplete_turns_force_handoff() -> None:
    missing = apply_turn_read(TurnGuard(boundary=8), read(None))
    assert missing.handoff and missing.boundary == 8
    assert apply_turn_read(TurnGuard(), read(None, deleted=True, complete=False)).handoff
    incomplete = apply_turn_read(TurnGuard(), read(None, complete=False))
    assert incomplete.handoff and incomplete.boundary is None
    start = apply_turn_read(TurnGuard(), read(None))
    assert start.boundary == 0 and not start.handoff
