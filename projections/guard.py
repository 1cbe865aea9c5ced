"""Turn-guard operations (behavior.md §4.5, §6.2–§6.4), as pure functions from guard to guard."""

from __future__ import annotations

import math

from schemas.records import TurnResult
from schemas.state import Expected, TurnGuard


class ActivityPending(Exception):
    """The expected status activity is not visible yet (§6.2 step 3): a job failure, retried."""

    def __init__(self) -> None:
        super().__init__("Chatwoot status activity is not available yet")


def expect_activity(g: TurnGuard, status: str, at: float | None = None) -> TurnGuard:
    """§6.4 expectActivity: the next turn read must see a status activity with this status."""
    if at is not None and at <= (g.transition_at or 0):
        return g
    if at is None and g.expected is not None and g.expected.status == status:
        return g
    claimed = g.claimed if g.claimed is not None else g.transition_at is not None
    after = (g.boundary or 0) if (at is None or claimed) else 0
    previous_after = g.expected.after if g.expected is not None else 0
    return g.evolve(
        expected=Expected(status=status, at=at, after=max(previous_after, after)),
        transition_at=at if at is not None else g.transition_at,
        handoff=False,
        failures=0,
    )


def observe_status(g: TurnGuard, status: str) -> TurnGuard:
    """§6.4 observeStatus: a conversation seen leaving pending must show a newer activity of that status."""
    is_pending = status == "pending"
    if g.pending is True and not is_pending:
        g = expect_activity(g, status)
    if g.pending != is_pending:
        g = g.evolve(pending=is_pending)
    return g


STUCK_AFTER_FAILURES = 3
"""A conversation is stuck while its runs keep failing: this many failed runs in a row (Decisions 9), for the
worker's `/stuck` and the console alike."""


def record_failure(g: TurnGuard) -> TurnGuard:
    """§4.5: count a processing failure; the third one turns on handoff mode."""
    failures = g.failures + 1
    return g.evolve(failures=failures, handoff=g.handoff or failures >= 3)


def clear_failures(g: TurnGuard) -> TurnGuard:
    return g if g.failures == 0 else g.evolve(failures=0)


def request_handoff(g: TurnGuard) -> TurnGuard:
    return g if g.handoff else g.evolve(handoff=True)


def apply_turn_read(g: TurnGuard, turn: TurnResult) -> TurnGuard:
    """§6.2: update the guard from a turn read; raises ActivityPending when the expected activity is late."""
    boundary = turn.boundary
    b = boundary.id if boundary is not None else 0
    e = g.expected
    missing = g.boundary is not None and b < g.boundary
    late = e is not None and (
        boundary is None
        or boundary.id <= e.after
        or (e.at is not None and (boundary.created_at or 0) < math.floor(e.at))
        or boundary.activity_status != e.status
    )
    if late and not g.handoff and not turn.deleted and not missing:
        raise ActivityPending()
    update: dict[str, object] = {}
    if (
        boundary is not None
        and g.boundary is not None
        and boundary.id != g.boundary
        and not missing
        and not late
    ):
        update.update(handoff=False, failures=0)
    if not missing and turn.complete:
        if g.boundary != b:
            update["claimed"] = False
        update["boundary"] = b
    if e is not None and not late:
        update.update(claimed=e.at is not None, expected=None)
    if turn.deleted or missing or not turn.complete:
        update["handoff"] = True
    return g.evolve(**update)
