"""Records on the conversation-keyed topics (DESIGN §4).

Every record is a pydantic model with a literal `type` and a schema version `v`; events carry their own time
(`at_ms`, epoch milliseconds) so the fold never reads a clock. The long-lived `conversations` topic holds only
what the rules read: no contact names, no e-mail addresses, no unredacted customer text.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field


class Record(BaseModel):
    """Base of every record: frozen, strict about unknown fields."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    v: int = 1
    at_ms: int = Field(description="event time, epoch milliseconds")


def conversation_key(account_id: int, conversation_id: int) -> str:
    """The partition key shared by every conversation-keyed topic."""
    return f"{account_id}:{conversation_id}"


class Transition(BaseModel):
    """A status transition extracted from a conversation webhook (behavior.md §3.4)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    status: str
    at: float = Field(description="the webhook's updated_at, unix seconds (may be fractional)")


class WebhookReceived(Record):
    """A verified, relevant agent-bot webhook, normalised at the ingress."""

    type: Literal["webhook_received"] = "webhook_received"
    account_id: int
    conversation_id: int
    event: str = Field(description="Chatwoot event name, e.g. message_created")
    transition: Transition | None = None
    updated_at: float | None = None
    delivery_id: str | None = Field(default=None, description="X-Chatwoot-Delivery, kept for audit")

    @property
    def key(self) -> str:
        return conversation_key(self.account_id, self.conversation_id)
