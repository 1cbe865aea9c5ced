"""Pure paging logic for the composite reads (behavior.md §6.1 turn read, §9.7 step 1 reply-history scan).

The effect executor does the HTTP; these classes decide which page to ask for next and what the pages mean,
so the paging rules are tested without a network and the executor stays a thin loop:

    pager = TurnPager()
    while (before := pager.next_request()) is not None:
        pager.feed(await list_messages(before=before.value))
    result = pager.result()
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from projections.redaction import sanitize
from schemas.chatwoot import Message, MessageType
from schemas.records import MAX_PAGES, Boundary, MessageView, TurnResult

PAGE_SIZE = 20  # Chatwoot's MESSAGE_HISTORY_PAGE_SIZE
MAX_SAFE_INTEGER = 2**53 - 1


@dataclass(frozen=True)
class PageRequest:
    """The next page to read: `before` None = the latest page."""

    before: int | None


class TurnPager:
    """behavior.md §6.1: read back from the latest message to the newest status activity, at most 5 pages."""

    def __init__(self) -> None:
        self._collected: list[MessageView] = []  # newest first
        self._before: int | None = None
        self._boundary: MessageView | None = None
        self._complete = False
        self._deleted = False
        self._pages = 0
        self._done = False

    def next_request(self) -> PageRequest | None:
        """The page to fetch next, or None when the read is over."""
        return None if self._done else PageRequest(self._before)

    def feed(self, page: Sequence[MessageView]) -> None:
        """Take one page (any order; it is sorted by id) and decide whether to read on."""
        if self._done:
            raise RuntimeError("the turn read is over")
        batch = sorted(page, key=lambda m: m.id)
        self._pages += 1
        for message in reversed(batch):
            if message.message_type == MessageType.ACTIVITY and message.deleted:
                self._deleted = True
                break
            if message.message_type == MessageType.ACTIVITY and message.activity_type == "conversation_status_changed":
                self._boundary = message
                break
            self._collected.append(message)
        self._complete = self._boundary is not None or len(batch) < PAGE_SIZE
        if self._complete or self._deleted or self._pages >= MAX_PAGES:
            self._done = True
            return
        oldest = batch[0].id if batch else None
        if oldest is None or (self._before is not None and oldest >= self._before):
            self._done = True
            return
        self._before = oldest

    def result(self) -> TurnResult:
        """Messages after the boundary, oldest first, with the boundary and how the read ended."""
        boundary = None
        if self._boundary is not None:
            b = self._boundary
            boundary = Boundary(id=b.id, created_at=b.created_at, activity_status=b.activity_status)
        return TurnResult(
            messages=tuple(reversed(self._collected)),
            boundary=boundary,
            complete=self._complete,
            deleted=self._deleted,
        )


def is_confirmed_brand_reply(message: MessageView | None, bot_id: int) -> bool:
    """behavior.md §9.7 "confirmed brand reply": created by our bot, public, not failed, not deleted."""
    return (
        message is not None
        and 0 < message.id <= MAX_SAFE_INTEGER
        and message.message_type == MessageType.OUTGOING
        and message.private is False
        and message.sender_type == "agent_bot"
        and message.sender_id == bot_id
        and message.status != "failed"
        and not message.deleted
    )


ScanResult = Literal["found", "unknown", "complete_none"]


class ReplyHistoryScan:
    """behavior.md §9.7 step 1: look for our earlier reply across turns, at most 5 pages of 20."""

    def __init__(self, bot_id: int) -> None:
        self._bot_id = bot_id
        self._before: int | None = None
        self._pages = 0
        self._result: ScanResult | None = None

    def next_request(self) -> PageRequest | None:
        return None if self._result is not None else PageRequest(self._before)

    def feed(self, page: Sequence[MessageView]) -> None:
        if self._result is not None:
            raise RuntimeError("the reply-history scan is over")
        batch = sorted(page, key=lambda m: m.id)
        self._pages += 1
        for message in batch:
            if is_confirmed_brand_reply(message, self._bot_id):
                self._result = "found"
                return
            if message.message_type != MessageType.OUTGOING or message.private is True:
                continue
            if message.sender_type is None or (
                message.sender_type == "agent_bot"
                and (message.sender_id is None or message.sender_id == self._bot_id)
            ):
                self._result = "unknown"
                return
        if len(batch) < PAGE_SIZE:
            self._result = "complete_none"
            return
        oldest = batch[0].id
        if self._before is not None and oldest >= self._before:
            self._result = "unknown"
            return
        if self._pages >= MAX_PAGES:
            self._result = "unknown"
            return
        self._before = oldest

    def result(self) -> ScanResult:
        if self._result is None:
            raise RuntimeError("the reply-history scan is not over")
        return self._result


# --- a Chatwoot message as the rules read it (§6.5, §10.2 list messages) ---


def customer_text(message: Message) -> str:
    """behavior.md §6.5 steps 1–2, unredacted: subject + "\\n" + body (only null/absent falls through)."""
    attributes = message.content_attributes
    email = attributes.email if attributes is not None else None
    subject = (email.subject if email is not None else None) or ""
    body = None
    if email is not None:
        body = email.text_content.quoted if email.text_content is not None else None
        if body is None and email.html_content is not None:
            body = email.html_content.quoted
    if body is None:
        body = message.content
    return subject + "\n" + (body or "")


def message_view(message: Message, *, name: str | None, email: str | None) -> MessageView:
    """One Chatwoot message as a view; incoming text is redacted here, with the contact's identities.

    The `Message` model already failed a page whose message lacks a numeric `id` or `message_type`, and reads
    malformed `content_attributes` as absent (§10.2).
    """
    attributes = message.content_attributes
    activity = attributes.activity if attributes is not None else None
    mail = attributes.email if attributes is not None else None
    sender = message.sender
    sender_type = sender.type if sender is not None else None
    if sender_type is None and attributes is not None and attributes.external_echo is True:
        sender_type = "user"  # Decisions 12: a person's reply from the phone app, echoed without a sender
    return MessageView(
        id=message.id,
        message_type=message.message_type,
        private=message.private,
        status=message.status,
        created_at=message.created_at,
        sender_type=sender_type,
        sender_id=sender.id if sender is not None else None,
        deleted=bool(attributes is not None and attributes.deleted),
        auto_reply=bool(mail is not None and mail.auto_reply),
        activity_type=activity.type if activity is not None else None,
        activity_status=activity.status if activity is not None else None,
        conversation_id=message.conversation_id,
        text=sanitize(customer_text(message), name, email) if message.message_type == MessageType.INCOMING else None,
    )
