"""Route phases that read the conversation: the snapshot (behavior.md §9.1), the inbox's bot, the disconnect
(§9.8) and the release (§9.9)."""

from __future__ import annotations

from projections.guard import (
    observe_status,
)
from projections.route.folder import Folder
from projections.rules import (
    owns,
)
from schemas.records import (
    ConversationResult,
    EffectOutcome,
    GetConversation,
    GetInboxBot,
    InboxBotResult,
    ReadTurn,
    ToggleStatus,
    Unassign,
)


def on_snapshot(f: Folder, o: EffectOutcome) -> None:
    c = f.conversation_read(o)
    if c is None:
        return
    if c.inbox_id is None or (f.r.inbox_id is not None and c.inbox_id != f.r.inbox_id):
        f.complete("nothing", reason="inbox_changed")
        return
    if c.status != "pending":
        f.guard = observe_status(f.guard, c.status or "open")
        if c.status is not None and owns(c, f.bot_id):
            f.set_run(after_release="nothing")
            f.issue(GetConversation(), "release_read")
            return
        f.complete("nothing", reason="not_pending")
        return
    if c.assignee_type == "AgentBot" and c.assignee_id != f.bot_id:
        f.complete("nothing", reason="other_bot")
        return
    f.set_run(current=c, inbox_id=f.r.inbox_id if f.r.inbox_id is not None else c.inbox_id)
    f.issue(GetInboxBot(inbox_id=c.inbox_id), "inbox_bot")


def on_inbox_bot(f: Folder, o: EffectOutcome) -> None:
    linked = False
    if o.error is None or o.error.kind != "missing":
        if f.failed(o, drop_on_missing=False):
            return
        assert isinstance(o.result, InboxBotResult)
        bot = o.result
        if bot.bot_id is not None and bot.bot_account_id != f.account:
            f.fail("foreign_bot")
            return
        linked = bot.bot_id == f.bot_id
    current = f.r.current
    assert current is not None
    if not linked:
        if owns(current, f.bot_id):
            f.issue(GetConversation(), "disconnect_read")
        else:
            f.complete("nothing", reason="inbox_disconnected_not_ours")
        return
    if current.blocked:
        f.complete("nothing", reason="blocked")
        return
    f.guard = observe_status(f.guard, "pending")
    f.issue(ReadTurn(), "turn")


def on_disconnect_read(f: Folder, o: EffectOutcome) -> None:
    c = f.conversation_read(o)
    if c is None:
        return
    if c.status == "pending" and c.inbox_id == f.r.inbox_id and owns(c, f.bot_id):
        f.issue(ToggleStatus(status="open"), "disconnect_toggle")
    else:
        f.complete("nothing", reason="inbox_disconnected_not_ours")


def on_disconnect_toggle(f: Folder, o: EffectOutcome) -> None:
    if not f.failed(o, drop_on_missing=True):
        f.complete("handed_off", reason="inbox_disconnected")


def on_release_read(f: Folder, o: EffectOutcome) -> None:
    if o.error is not None and o.error.kind == "missing":
        finish_release(f)
        return
    if f.failed(o, drop_on_missing=False):
        return
    assert isinstance(o.result, ConversationResult)
    c = o.result.conversation
    f.saw(c)
    if c.status is not None and c.status != "pending" and owns(c, f.bot_id):
        f.issue(Unassign(), "release_unassign")
    else:
        finish_release(f)


def on_release_unassign(f: Folder, o: EffectOutcome) -> None:
    if not f.failed(o, drop_on_missing=True):
        finish_release(f, released=True)


def finish_release(f: Folder, *, released: bool = False) -> None:
    if f.r.after_release == "ended":
        kind = f.kind()
        f.complete("ended", status=kind[1].status if kind else None, reason=None)
    else:
        f.complete("nothing", reason="released" if released else "not_pending")
