"""Chatwoot REST responses, reduced to the fields the router relies on (behavior.md §10.2).

Chatwoot's JSON carries far more than the rules read and changes between releases, so every model ignores
extra keys. Required fields fail the whole response when missing or mistyped (the caller retries); optional
fields that arrive mistyped are read as absent, the way the earlier router's readers treated them.
"""

from __future__ import annotations

from enum import IntEnum
from typing import Annotated, Any, Literal, TypeVar

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    StrictBool,
    StrictInt,
    StrictStr,
    ValidationError,
    ValidatorFunctionWrapHandler,
    WrapValidator,
    model_validator,
)

T = TypeVar("T")


def _or_none(value: Any, handler: ValidatorFunctionWrapHandler) -> Any:
    """A value of the wrong shape is treated as absent instead of failing the whole response."""
    try:
        return handler(value)
    except ValidationError:
        return None


Lenient = Annotated[T | None, WrapValidator(_or_none)]
Number = Annotated[float, Field(strict=True, allow_inf_nan=False)]


class _Model(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True, strict=True)


# --- messages ---------------------------------------------------------------------------------------------


class QuotedText(_Model):
    quoted: StrictStr | None = None


class EmailAttributes(_Model):
    subject: StrictStr | None = None
    auto_reply: StrictBool | None = None
    text_content: QuotedText | None = None
    html_content: QuotedText | None = None


class Activity(_Model):
    type: StrictStr | None = None
    status: StrictStr | None = None


class ContentAttributes(_Model):
    """The keys the rules read; any of them malformed makes the whole object count as absent."""

    email: EmailAttributes | None = None
    deleted: StrictBool | None = None
    activity: Activity | None = None
    external_echo: Lenient[StrictBool] = None
    """A WhatsApp/Instagram reply a person sent from the phone app, echoed into Chatwoot without a sender
    (docs/decisions.md, Decisions 12); lenient: a malformed value must not hide `activity` or `deleted`."""


class MessageSender(_Model):
    id: Lenient[StrictInt] = None
    type: Lenient[StrictStr] = None


class MessageType(IntEnum):
    """`message_type` (behavior.md §10.2). Fields stay plain ints: a type Chatwoot adds later must not fail a
    page; the rules compare against these names."""

    INCOMING = 0
    OUTGOING = 1
    ACTIVITY = 2
    TEMPLATE = 3


class Message(_Model):
    """A REST message (chatwoot.md §4.12); `id` and `message_type` are required, the rest tolerant."""

    id: StrictInt
    message_type: StrictInt
    content: Lenient[StrictStr] = None
    status: Lenient[StrictStr] = None
    created_at: Lenient[Number] = None
    private: Lenient[StrictBool] = None
    conversation_id: Lenient[StrictInt] = None
    content_attributes: Lenient[ContentAttributes] = None
    sender: Lenient[MessageSender] = None


class MessagePage(_Model):
    """One page of `GET …/messages`, oldest first."""

    payload: list[Message]


# --- conversations ----------------------------------------------------------------------------------------


class Assignee(_Model):
    id: StrictInt


class Contact(_Model):
    """The conversation's contact; its name and e-mail are for redaction only, never for the event log."""

    id: Lenient[StrictInt] = None
    name: Lenient[StrictStr] = None
    email: Lenient[StrictStr] = None
    blocked: Lenient[StrictBool] = None


class ConversationMeta(_Model):
    """`has_assignee` says whether an assignee object was there at all, even one without a usable id."""

    assignee: Lenient[Assignee] = None
    assignee_type: Lenient[StrictStr] = None
    sender: Lenient[Contact] = None
    has_assignee: bool = False

    @model_validator(mode="before")
    @classmethod
    def _note_assignee(cls, data: Any) -> Any:
        if isinstance(data, dict):
            return {**data, "has_assignee": data.get("assignee") is not None}
        return data


Status = Literal["pending", "open", "resolved", "snoozed"]


class Conversation(_Model):
    """`GET …/conversations/{c}` (chatwoot.md §4.12), the fields of the snapshot (behavior.md §9.1)."""

    id: StrictInt
    inbox_id: StrictInt
    status: Status
    labels: Annotated[list[StrictStr], BeforeValidator(lambda v: [] if v is None else v)] = []
    meta: ConversationMeta = ConversationMeta()
    updated_at: Lenient[Number] = None


class ConversationRow(_Model):
    """An item of the conversation list, as the sweep reads it."""

    id: StrictInt
    meta: ConversationMeta = ConversationMeta()


class ConversationPage(_Model):
    """`GET …/conversations` reduced to its rows; a missing `data.payload` is an empty page."""

    payload: list[ConversationRow] = []

    @classmethod
    def from_response(cls, body: Any) -> ConversationPage:
        data = body.get("data") if isinstance(body, dict) else None
        payload = data.get("payload") if isinstance(data, dict) else None
        return cls.model_validate({"payload": [] if payload is None else payload})


# --- account resources ------------------------------------------------------------------------------------


class InboxBot(_Model):
    """The agent bot linked to an inbox; `account_id` is None for a system bot."""

    id: Annotated[int, Field(strict=True, gt=0)]
    account_id: Annotated[int, Field(strict=True, gt=0)] | None = None


class CannedResponse(_Model):
    short_code: StrictStr
    content: Lenient[StrictStr] = None


class Agent(_Model):
    id: StrictInt
