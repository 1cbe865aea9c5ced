"""The ending phases (behavior.md §9.5 steps 10–12, §9.4): the agents check, the status or assignment, and the
handoff's toggle."""

from __future__ import annotations

from projections.guard import (
    expect_activity,
)
from projections.route.folder import Folder
from projections.rules import (
    person_assigned,
)
from schemas.records import (
    AgentsResult,
    Assign,
    EffectOutcome,
    GetConversation,
    ListAgents,
    ToggleStatus,
)


def agents_step(f: Folder) -> None:
    kind = f.kind()
    if f.r.assignee is not None and not (kind is not None and kind[1].status is not None):
        f.issue(ListAgents(), "agents")
    else:
        f.snapshot("before_end")


def on_agents(f: Folder, o: EffectOutcome) -> None:
    if f.failed(o, drop_on_missing=False):
        return
    assert isinstance(o.result, AgentsResult)
    if f.r.assignee not in o.result.agent_ids:
        f.handoff("assignee_not_an_agent")
    else:
        f.snapshot("before_end")


def ending(f: Folder) -> None:
    kind = f.kind()
    current = f.r.current
    assert current is not None
    if kind is not None and kind[1].status is not None:
        f.issue(ToggleStatus(status=kind[1].status), "ending")
    elif f.r.assignee is not None and current.assignee_type == "AgentBot":
        f.issue(Assign(assignee_id=f.r.assignee), "ending")
    elif person_assigned(current):
        f.handoff("person_assigned", have_current=True)
    elif f.r.assignee is not None:
        f.handoff("not_bot_assigned", have_current=True)
    else:
        f.handoff("unclear_owner", have_current=True)


def on_ending(f: Folder, o: EffectOutcome) -> None:
    if f.failed(o, drop_on_missing=True):
        return
    pending_op = o.op
    if pending_op == "toggle_status":
        kind = f.kind()
        assert kind is not None and kind[1].status is not None
        f.guard = expect_activity(f.guard, kind[1].status)
        f.set_run(after_release="ended")
        f.issue(GetConversation(), "release_read")
    else:
        f.guard = expect_activity(f.guard, "open")
        f.complete("assigned", assignee_id=f.r.assignee)


def on_handoff_toggle(f: Folder, o: EffectOutcome) -> None:
    if not f.failed(o, drop_on_missing=True):
        f.complete("handed_off", reason=f.r.handoff_reason)
