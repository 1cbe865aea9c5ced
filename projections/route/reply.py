"""The canned-reply phases (behavior.md §9.7): the history scan, the canned response and the send."""

from __future__ import annotations

from projections.route.ending import agents_step
from projections.route.folder import Folder
from projections.turn import is_confirmed_brand_reply
from schemas.records import (
    CannedResult,
    CreateMessageResult,
    EffectOutcome,
    ListCanned,
    ReplyHistoryResult,
    ScanReplyHistory,
)


def reply_step(f: Folder) -> None:
    kind = f.kind()
    if kind is not None and kind[1].canned_response is not None:
        f.issue(ScanReplyHistory(bot_id=f.bot_id), "history")
    else:
        agents_step(f)


def on_history(f: Folder, o: EffectOutcome) -> None:
    if o.error is not None or not isinstance(o.result, ReplyHistoryResult):
        f.handoff("reply_history_unavailable")
        return
    found = o.result.found
    if found == "unknown":
        f.handoff("reply_history_unknown")
    elif found == "found":
        if f.ledger.value is None:
            f.ledger = f.ledger.evolve(value="observed")
        agents_step(f)
    elif f.ledger.value is not None:
        f.handoff("reply_attempted_before")
    else:
        kind = f.kind()
        assert kind is not None and kind[1].canned_response is not None
        f.issue(ListCanned(short_code=kind[1].canned_response), "canned")


def on_canned(f: Folder, o: EffectOutcome) -> None:
    if f.failed(o, drop_on_missing=False):
        return
    assert isinstance(o.result, CannedResult)
    content = o.result.content
    if content is None or not content.strip():
        f.handoff("canned_response_missing")
        return
    f.set_run(canned_content=content)
    f.snapshot("before_send")


def on_send(f: Folder, o: EffectOutcome) -> None:
    receipt = o.result.message if isinstance(o.result, CreateMessageResult) else None
    if (
        o.error is None
        and receipt is not None
        and is_confirmed_brand_reply(receipt, f.bot_id)
        and receipt.conversation_id == f.conversation
    ):
        f.set_run(replied=True, canned_content=None)
        agents_step(f)
    elif o.error is not None and o.error.kind == "throttled":
        # refused with 429 on every try, so certainly not made (Rack::Attack answers before Chatwoot creates
        # anything): the attempt is taken back and the reply goes out after a new fresh read (Decisions 15);
        # throttling alone never hands a conversation off
        f.ledger = f.ledger.evolve(value=None)
        f.snapshot("before_send")
    elif o.error is not None and o.error.kind == "stale_read":
        # not sent (its fresh read was too old), and never sent later: the ledger already says attempted (§9.7)
        f.set_run(canned_content=None)
        f.handoff("reply_stale_read")
    else:
        f.set_run(canned_content=None)
        f.handoff("reply_unconfirmed")
