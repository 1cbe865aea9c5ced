"""Outgoing public messages without a sender (docs/decisions.md, Decisions 12): a WhatsApp/Instagram echo of a
person's reply from the phone app hands the conversation to people; an automation or campaign message is neither
a person's reply nor the router's, and the reply-history scan stays `unknown` on it (no canned reply is risked)."""

from __future__ import annotations

from typing import Any

from projections.rules import requires_handoff
from projections.turn import ReplyHistoryScan, message_view
from schemas.chatwoot import Message

BOT = 5


def view(**fields: Any) -> Any:
    raw = {"id": 40, "message_type": 1, "private": False, "status": "sent", "content": "Thanks!", **fields}
    return message_view(Message.model_validate(raw), name=None, email=None)


def test_an_echo_of_a_persons_phone_reply_is_a_persons_public_reply() -> None:
    echo = view(sender=None, content_attributes={"external_echo": True})
    assert echo.sender_type == "user"
    assert requires_handoff([echo], BOT)


def test_an_automation_message_is_nobodys_reply_and_does_not_hand_off() -> None:
    automation = view(sender=None, content_attributes={})
    assert automation.sender_type is None
    assert not requires_handoff([automation], BOT)
    scan = ReplyHistoryScan(BOT)
    scan.feed([automation])
    assert scan.result() == "unknown"  # it might have been ours: the canned reply is not risked


def test_an_echo_attribute_on_a_message_with_a_sender_changes_nothing() -> None:
    bot_reply = view(sender={"id": BOT, "type": "agent_bot"}, content_attributes={"external_echo": True})
    assert bot_reply.sender_type == "agent_bot" and not requires_handoff([bot_reply], BOT)


def test_a_malformed_echo_attribute_hides_nothing_else() -> None:
    deleted = view(sender=None, content_attributes={"external_echo": "yes", "deleted": True})
    assert deleted.deleted and deleted.sender_type is None
