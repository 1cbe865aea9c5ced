"""Pure paging logic for the composite reads (behavior.md §6.1 turn read, §9.7 step 1 reply-history scan).

The effect executor does the HTTP; these classes decide which page to ask for next and what the pages mean,
so the paging rules are tested without a network and the executor stays a thin loop:

    pager = TurnPager()
    while (before := pager.next_request()) is not None:
        pager.feed(await list_messages(before=before.value))
    result = pager.result()
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from projections.redaction import sanitize
from schemas.records import Boundary, MessageView, TurnResult

PAGE_SIZE = 20  # Chatwoot's MESSAGE_HISTORY_PAGE_SIZE
MAX_PAGES = 5
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
            if message.message_type == 2 and message.deleted:
                self._deleted = True
                break
            if message.message_type == 2 and message.activity_type == "conversation_status_changed":
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
        and message.message_type == 1
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
            if message.message_type != 1 or message.private is True:
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


# --- reading Chatwoot's message JSON (§10.2 list messages) ---


def _obj(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _number(value: Any) -> float | None:
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


def _str(value: Any) -> str | None:
    return value if isinstance(value, str) else None


def customer_text(message: Mapping[str, Any]) -> str:
    """behavior.md §6.5 steps 1–2, unredacted: subject + "\\n" + body (only null/absent falls through)."""
    email = _obj(_obj(message.get("content_attributes")).get("email"))
    subject = _str(email.get("subject")) or ""
    body = _str(_obj(email.get("text_content")).get("quoted"))
    if body is None:
        body = _str(_obj(email.get("html_content")).get("quoted"))
    if body is None:
        body = _str(message.get("content"))
    return subject + "\n" + (body or "")


def parse_message(raw: Any, *, name: str | None, email: str | None) -> MessageView:
    """One Chatwoot message as a view; incoming text is redacted here, with the contact's identities.

    A message without a numeric `id` or `message_type` raises ValueError (the whole page is a failure);
    malformed `content_attributes` count as absent.
    """
    if not isinstance(raw, Mapping):
        raise ValueError("message is not an object")
    message_id, message_type = _int(raw.get("id")), _int(raw.get("message_type"))
    if message_id is None or message_type is None:
        raise ValueError("message without numeric id or message_type")
    attrs = _obj(raw.get("content_attributes"))
    activity = _obj(attrs.get("activity"))
    sender = _obj(raw.get("sender"))
    created = raw.get("created_at")
    private = raw.get("private")
    return MessageView(
        id=message_id,
        message_type=message_type,
        private=private if isinstance(private, bool) else None,
        status=_str(raw.get("status")),
        created_at=float(created)
        if isinstance(created, int | float) and not isinstance(created, bool)
        else None,
        sender_type=_str(sender.get("type")),
        sender_id=_int(sender.get("id")),
        deleted=bool(attrs.get("deleted")),
        auto_reply=bool(_obj(attrs.get("email")).get("auto_reply")),
        activity_type=_str(activity.get("type")),
        activity_status=_str(activity.get("status")),
        conversation_id=_int(raw.get("conversation_id")),
        text=sanitize(customer_text(raw), name, email) if message_type == 0 else None,
    )
