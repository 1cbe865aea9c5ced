"""The turn-read phase (behavior.md §6.1–§6.2): the guard, the input (§6.5), and the fresh reads (§9.3) that decide
where the run goes next."""

from __future__ import annotations

from projections.guard import (
    ActivityPending,
    apply_turn_read,
)
from projections.inputs import decide_command, memo_key, turn_input
from projections.route.deciding import after_fresh_decision, decided
from projections.route.ending import ending
from projections.route.folder import Folder
from projections.rules import (
    requires_handoff,
)
from schemas.records import (
    CreateMessage,
    EffectOutcome,
    ToggleStatus,
    TurnResult,
)


def on_turn(f: Folder, o: EffectOutcome) -> None:
    if f.failed(o, drop_on_missing=True):
        return
    assert isinstance(o.result, TurnResult)
    turn = o.result
    try:
        f.guard = apply_turn_read(f.guard, turn)
    except ActivityPending:
        f.fail("activity_pending")
        return
    current = f.r.current
    assert current is not None
    input_ = turn_input(turn.messages, current)
    public_reply = requires_handoff(turn.messages, f.bot_id)
    if f.r.purpose == "initial":
        f.set_run(first_turn=turn, input_key=input_.key, input_count=input_.count)
        if f.guard.handoff or public_reply or input_.count == 0:
            f.handoff(turn_reason(f, turn, public_reply, input_.count))
            return
        key = memo_key(input_, f.config, f.account)
        f.set_run(memo_key=key)
        memo = f.memos.get(key)
        if memo is not None:
            decided(f, memo.decision)
        else:
            f.issue(decide_command(input_), "decide")
        return
    first = f.r.first_turn
    assert first is not None
    first_boundary = first.boundary.id if first.boundary is not None else 0
    boundary = turn.boundary.id if turn.boundary is not None else 0
    if boundary != first_boundary or input_.key != f.r.input_key:
        f.defer("input_changed")
        return
    handoff = f.guard.handoff or public_reply
    reason = turn_reason(f, turn, public_reply, input_.count) if handoff else None
    purpose = f.r.purpose
    if purpose == "handoff":
        f.issue(ToggleStatus(status="open"), "handoff_toggle")
    elif handoff:
        f.handoff(reason or "handoff_mode", have_current=True)
    elif purpose == "after_decide":
        after_fresh_decision(f)
    elif purpose == "before_send":
        f.issue(CreateMessage(content=f.r.canned_content or ""), "send")
        if f.run is not None:  # issued (not deferred for budget): the ledger goes with the command
            f.ledger = f.ledger.evolve(value="attempted")
    else:
        ending(f)


def turn_reason(f: Folder, turn: TurnResult, public_reply: bool, count: int) -> str:
    if turn.deleted:
        return "boundary_deleted"
    if not turn.complete:
        return "incomplete_read"
    if f.guard.handoff:
        return "handoff_mode"
    if public_reply:
        return "public_reply"
    return "no_usable_text" if count == 0 else "handoff_mode"
