"""A mutation whose outcome never came is not simply made again (DESIGN §6, behavior.md §12.1).

Its call may have happened, and a person may have changed the conversation since the fresh read before it. When
the run resumes (a takeover) or the mutation's deadline passes, the run makes that fresh read again
(`projections.route.folder.RECHECK_BEFORE`); the read's own rules then decide whether the mutation still applies.
"""

from __future__ import annotations

import pytest

from projections.route.folder import RECHECK_BEFORE
from schemas.records import TimerFired
from tests.unit.test_fold_driver import ACCOUNT, CONV, Driver, FakeChatwoot, decision, incoming

MUTATION_PHASES = {"labels", "ending", "handoff_toggle", "release_unassign", "disconnect_toggle"}
"""Every phase whose pending command changes the conversation, but for `send` (a reply is never re-sent)."""


def billing(**chatwoot: object) -> Driver:
    fake = FakeChatwoot(**chatwoot)  # type: ignore[arg-type]
    fake.messages = [incoming(1, "I was charged twice")]
    return Driver(chatwoot=fake)


def ops_since(d: Driver, start: int) -> list[str]:
    return [c.op for c in d.chatwoot.calls[start:]]


def test_every_mutation_phase_has_its_fresh_read() -> None:
    assert set(RECHECK_BEFORE) == MUTATION_PHASES


def test_an_assignment_whose_outcome_was_lost_is_not_made_again_over_a_persons_change() -> None:
    d = billing(lost_after_call={"assign": 1})
    d.webhook()
    assert d.state.run is not None and d.state.run.pending is not None and d.state.run.pending.op == "assign"
    assert d.chatwoot.conversation.assignee_id == 7  # the call happened; the outcome never came
    d.chatwoot.conversation = d.chatwoot.conversation.model_copy(update={"assignee_id": 8})  # a person reassigns
    calls = len(d.chatwoot.calls)
    d.tick()  # the deadline
    assert ops_since(d, calls)[0] == "get_conversation"  # the fresh read first, not the assignment
    assert "assign" not in ops_since(d, calls)
    assert d.chatwoot.conversation.assignee_id == 8  # the person's choice stands
    assert d.state.run is None and d.last().result == "nothing"


def test_an_assignment_whose_outcome_was_lost_is_made_again_after_its_fresh_read() -> None:
    d = billing(lost={"assign": 1})  # the call never reached Chatwoot
    d.webhook()
    calls = len(d.chatwoot.calls)
    d.tick()
    again = ops_since(d, calls)
    assert again[0] == "get_conversation" and again.count("assign") == 1
    assert again.index("get_conversation") < again.index("assign")
    assert d.last().result == "assigned" and d.chatwoot.conversation.assignee_id == 7


def test_a_resume_after_a_takeover_rechecks_too() -> None:
    d = billing(lost_after_call={"assign": 1})
    d.webhook()
    run = d.state.run
    assert run is not None and run.pending is not None and run.deadline_ms is not None
    d.chatwoot.conversation = d.chatwoot.conversation.model_copy(update={"assignee_id": 8})
    calls = len(d.chatwoot.calls)
    d.send(TimerFired(at_ms=d.now, key=f"{ACCOUNT}:{CONV}", due_ms=run.deadline_ms, resume=True))
    d.settle()
    assert ops_since(d, calls)[0] == "get_conversation" and "assign" not in ops_since(d, calls)


@pytest.mark.parametrize(
    ("lost_op", "kind"),
    [("set_labels", None), ("toggle_status", "spam"), ("unassign", "spam")],
)
def test_each_mutation_whose_outcome_was_lost_is_preceded_by_a_fresh_read_when_made_again(
    lost_op: str, kind: str | None
) -> None:
    fake = FakeChatwoot(decision=decision(topic="invoices", kind=kind), lost={lost_op: 1})
    fake.messages = [incoming(1, "I was charged twice")]
    d = Driver(chatwoot=fake)
    d.webhook()
    assert d.state.run is not None and d.state.run.pending is not None and d.state.run.pending.op == lost_op
    calls = len(d.chatwoot.calls)
    d.tick()
    again = ops_since(d, calls)
    assert again[0] == "get_conversation"
    assert again.count(lost_op) == 1 and again.index("get_conversation") < again.index(lost_op)
    assert d.state.run is None


def test_a_lost_read_or_decision_is_simply_issued_again() -> None:
    for op in ("get_inbox_bot", "decide"):
        d = billing(lost={op: 1})
        d.webhook()
        calls = len(d.chatwoot.calls)
        d.tick()
        assert ops_since(d, calls)[0] == op  # nothing changes in Chatwoot by asking again
