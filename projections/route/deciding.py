"""The decision phases (behavior.md §7.4–§7.6, §8): System One's answer, the memo, waiting and the labels."""

from __future__ import annotations

from projections.route.folder import Folder
from projections.route.reply import reply_step
from projections.rules import (
    actionable_kind,
    confident_assignee,
    new_labels,
    should_wait,
)
from schemas.decision import Decision
from schemas.records import (
    DecideResult,
    EffectOutcome,
    SetLabels,
)
from schemas.state import Memo


def on_decide(f: Folder, o: EffectOutcome) -> None:
    if f.failed(o, drop_on_missing=False):
        return
    assert isinstance(o.result, DecideResult)
    key = f.r.memo_key
    assert key is not None
    f.memos = {**f.memos, key: Memo(decision=o.result.decision, offset=f.offset)}
    decided(f, o.result.decision)


def decided(f: Folder, decision: Decision) -> None:
    kind = actionable_kind(decision, f.config, f.account)
    assignee = confident_assignee(decision, f.config, f.account)
    f.set_run(decision=decision, kind=kind[0] if kind else None, assignee=assignee)
    f.snapshot("after_decide")


def after_fresh_decision(f: Folder) -> None:
    r = f.r
    assert r.decision is not None and r.current is not None and r.first_turn is not None
    if should_wait(
        decision=r.decision,
        kind=r.kind,
        count=r.input_count,
        current=r.current,
        messages=r.first_turn.messages,
        now_ms=f.now,
    ):
        f.complete("waited", reason="no_request_yet")
        return
    labels = new_labels(
        decision=r.decision,
        kind=f.kind(),
        current=r.current,
        config=f.config,
        account_id=f.account,
    )
    if labels is not None:
        f.issue(SetLabels(labels=labels), "labels")
    else:
        reply_step(f)


def on_labels(f: Folder, o: EffectOutcome) -> None:
    if not f.failed(o, drop_on_missing=True):
        f.set_run(labeled=True)
        reply_step(f)
