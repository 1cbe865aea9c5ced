"""The composite reads' paging rules (behavior.md §6.1, §9.7 step 1) and message parsing (§6.5, §10.2)."""

from __future__ import annotations

import pytest

from projections.turn import (
    ReplyHistoryScan,
    TurnPager,
    customer_text,
    is_confirmed_brand_reply,
    message_view,
)
from schemas.chatwoot import Message
from schemas.records import MessageView, ReadTurn, ScanReplyHistory
from tests.unit.test_fold_driver import BOT, activity, incoming, outgoing


def play(pager: TurnPager | ReplyHistoryScan, messages: list[MessageView]) -> list[int | None]:
    """Serve pages like Chatwoot (20 before `before`, newest first) and return the `before` values asked."""
    asked: list[int | None] = []
    while (request := pager.next_request()) is not None:
        asked.append(request.before)
        older = [
            m for m in sorted(messages, key=lambda m: m.id) if request.before is None or m.id < request.before
        ]
        pager.feed(list(reversed(older[-20:])))
    return asked


def test_read_stops_at_the_newest_status_activity_and_returns_oldest_first() -> None:
    pager = TurnPager()
    asked = play(pager, [incoming(1, "a"), activity(2, "resolved"), incoming(3, "b"), incoming(4, "c")])
    result = pager.result()
    assert asked == [None]
    assert [m.id for m in result.messages] == [3, 4]
    assert result.boundary is not None and result.boundary.id == 2 and result.complete


def test_short_page_without_boundary_means_the_conversation_start() -> None:
    pager = TurnPager()
    play(pager, [incoming(i, "x") for i in range(1, 6)])
    result = pager.result()
    assert result.boundary is None and result.complete and len(result.messages) == 5


def test_pages_back_with_before_and_finds_a_boundary_on_page_two() -> None:
    messages = [activity(1, "open"), *[incoming(i, "x") for i in range(2, 31)]]
    pager = TurnPager()
    asked = play(pager, messages)
    assert asked == [None, 11]
    assert pager.result().boundary is not None and len(pager.result().messages) == 29


def test_five_full_pages_without_boundary_are_incomplete() -> None:
    pager = TurnPager()
    asked = play(pager, [incoming(i, "x") for i in range(1, 121)])
    assert len(asked) == 5
    assert not pager.result().complete and len(pager.result().messages) == 100


def test_deleted_activity_before_any_boundary_is_reported() -> None:
    pager = TurnPager()
    play(pager, [activity(1, "open"), activity(2, "pending", deleted=True), incoming(3, "x")])
    result = pager.result()
    assert result.deleted and result.boundary is None and [m.id for m in result.messages] == [3]


def test_customer_supplied_activity_attributes_on_other_types_are_ignored() -> None:
    fake = incoming(2, "x", activity_type="conversation_status_changed", activity_status="resolved")
    pager = TurnPager()
    play(pager, [incoming(1, "a"), fake])
    assert pager.result().boundary is None and len(pager.result().messages) == 2


def test_a_page_whose_oldest_id_does_not_go_back_stops_incomplete() -> None:
    pager = TurnPager()
    page = [incoming(i, "x") for i in range(100, 120)]
    pager.feed(page)
    pager.feed(page)
    assert pager.next_request() is None and not pager.result().complete
    with pytest.raises(RuntimeError):
        pager.feed(page)


def reply(mid: int, **kw: object) -> MessageView:
    kw.setdefault("status", "sent")
    return outgoing(mid, sender_type="agent_bot", sender_id=BOT, **kw)  # type: ignore[arg-type]


def test_confirmed_brand_reply_predicate() -> None:
    assert is_confirmed_brand_reply(reply(5), BOT)
    assert not is_confirmed_brand_reply(reply(5, private=None), BOT)
    assert not is_confirmed_brand_reply(reply(5, status="failed"), BOT)
    assert not is_confirmed_brand_reply(reply(5, deleted=True), BOT)
    assert not is_confirmed_brand_reply(reply(0), BOT)
    assert not is_confirmed_brand_reply(reply(5), BOT + 1)
    assert not is_confirmed_brand_reply(None, BOT)


@pytest.mark.parametrize(
    ("messages", "expected"),
    [
        ([incoming(1, "x")], "complete_none"),
        ([incoming(1, "x"), reply(2)], "found"),
        (
            [outgoing(1, sender_type="user"), outgoing(2, sender_type="agent_bot", sender_id=5)],
            "complete_none",
        ),
        ([outgoing(1, private=True, sender_type=None)], "complete_none"),
        ([outgoing(1, private=None, sender_type=None)], "unknown"),
        ([reply(1, status="failed"), reply(2)], "unknown"),  # oldest first: the ambiguous one wins
        ([outgoing(1, sender_type="agent_bot", sender_id=None)], "unknown"),
    ],
)
def test_reply_history_scan(messages: list[MessageView], expected: str) -> None:
    scan = ReplyHistoryScan(BOT)
    play(scan, messages)
    assert scan.result() == expected


def test_reply_history_scan_crosses_turns_and_gives_up_after_five_full_pages() -> None:
    scan = ReplyHistoryScan(BOT)
    asked = play(scan, [reply(1), activity(2, "resolved"), *[incoming(i, "x") for i in range(3, 60)]])
    assert scan.result() == "found" and len(asked) == 3
    scan = ReplyHistoryScan(BOT)
    play(scan, [incoming(i, "x") for i in range(1, 121)])
    assert scan.result() == "unknown"
    scan = ReplyHistoryScan(BOT)
    page = [incoming(i, "x") for i in range(100, 120)]
    scan.feed(page)
    scan.feed(page)
    assert scan.result() == "unknown"
    with pytest.raises(RuntimeError):
        ReplyHistoryScan(BOT).result()
    with pytest.raises(RuntimeError):
        scan.feed(page)


def message(**fields: object) -> Message:
    return Message.model_validate({"id": 1, "message_type": 0, **fields})


def test_customer_text_prefers_quoted_bodies_and_keeps_empty_strings() -> None:
    def email(**e: object) -> Message:
        return message(content="whole mail", content_attributes={"email": e})

    assert customer_text(email(subject="Hi", text_content={"quoted": "reply"})) == "Hi\nreply"
    assert customer_text(email(html_content={"quoted": "html"})) == "\nhtml"
    assert customer_text(email(text_content={"quoted": ""})) == "\n"
    assert customer_text(email(subject=None)) == "\nwhole mail"
    assert customer_text(message(content=None, content_attributes="garbage")) == "\n"


def test_parse_message_redacts_incoming_text_with_the_contacts_identities() -> None:
    raw = {
        "id": 7,
        "message_type": 0,
        "content": "I am Jane Doe, mail jane@example.com",
        "private": None,
        "created_at": 1700000000,
        "sender": {"id": 3, "type": "contact"},
        "conversation_id": 2,
        "content_attributes": {"email": {"auto_reply": True}},
    }
    view = message_view(Message.model_validate(raw), name="Jane Doe", email="jane@example.com")
    assert view.text == "I am [REDACTED], mail [REDACTED]"
    assert view.auto_reply and view.private is None and view.created_at == 1700000000.0
    out = message_view(Message.model_validate({**raw, "message_type": 1}), name=None, email=None)
    assert out.text is None


def test_a_message_without_numeric_id_or_type_fails_its_page() -> None:
    with pytest.raises(ValueError):
        Message.model_validate({"id": "7", "message_type": 0})
    with pytest.raises(ValueError):
        Message.model_validate([])


def test_malformed_content_attributes_are_read_as_absent() -> None:
    """§10.2: one malformed key makes the whole `content_attributes` absent (as the page reader always did)."""
    view = message_view(
        message(message_type=2, content_attributes={"activity": "bad", "deleted": True}), name=None, email=None
    )
    assert not view.deleted and view.activity_type is None
    view = message_view(
        message(message_type=2, content_attributes={"activity": {"type": "x"}, "deleted": True}), name=None, email=None
    )
    assert view.deleted and view.activity_type == "x"


def test_the_composite_reads_stay_within_the_requests_their_commands_declare() -> None:
    """The fold budgets a command by `max_requests`; the pagers must never ask for more (§4.6)."""
    endless = [incoming(n, f"m{n}") for n in range(1, 500)]
    assert 1 + len(play(TurnPager(), endless)) == ReadTurn.max_requests  # + the conversation read
    outgoing_only = [outgoing(n) for n in range(1, 500)]
    assert len(play(ReplyHistoryScan(BOT), outgoing_only)) == ScanReplyHistory.max_requests
