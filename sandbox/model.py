"""The simulated Chatwoot installation's records, and the scenario format that seeds them.

Plain dataclasses: the sandbox is a test double, its state is read and changed directly by tests and by the
control API, and only `world.World` applies Chatwoot's rules to it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Literal

Role = Literal["administrator", "agent"]


@dataclass
class Account:
    id: int
    name: str
    keep_pending_on_bot_failure: bool = False


@dataclass
class User:
    """A human agent or administrator; `accounts` maps account id -> role there."""

    id: int
    name: str
    email: str
    token: str
    accounts: dict[int, Role] = field(default_factory=dict)
    availability_status: str = "online"
    inbox_ids: set[int] | None = None  # an agent's inbox memberships; None = every inbox

    def can_see(self, account_id: int, inbox_id: int) -> bool:
        """Administrators see every conversation; agents only those of their inboxes (§4.0)."""
        if self.accounts.get(account_id) == "administrator" or self.inbox_ids is None:
            return True
        return inbox_id in self.inbox_ids


@dataclass
class Bot:
    """An agent bot; `account_id` None makes it a system bot."""

    id: int
    name: str
    account_id: int | None
    access_token: str
    secret: str
    outgoing_url: str | None = None
    description: str = ""


@dataclass
class Inbox:
    id: int
    account_id: int
    name: str
    channel: str = "Channel::WebWidget"
    bot_id: int | None = None
    bot_active: bool = True
    # an automation rule "send message" on a new conversation: its text, sent after the first incoming message
    automation_message: str | None = None


@dataclass
class Contact:
    id: int
    account_id: int
    name: str | None
    email: str | None
    blocked: bool = False


@dataclass
class CannedResponse:
    id: int
    account_id: int
    short_code: str
    content: str
    created_at: float = 0.0


Sender = tuple[Literal["contact", "user", "agent_bot"], int]

INCOMING, OUTGOING, ACTIVITY, TEMPLATE = 0, 1, 2, 3
MESSAGE_TYPE_NAMES = {INCOMING: "incoming", OUTGOING: "outgoing", ACTIVITY: "activity", TEMPLATE: "template"}


@dataclass
class Message:
    id: int
    account_id: int
    inbox_id: int
    conversation_id: int  # display id
    message_type: int
    content: str | None
    created_at: float
    sender: Sender | None = None
    private: bool = False
    status: str = "sent"
    content_type: str = "text"
    content_attributes: dict[str, Any] = field(default_factory=dict)
    updated_at: float = 0.0


@dataclass
class Conversation:
    account_id: int
    id: int  # display id
    uuid: str
    inbox_id: int
    contact_id: int
    status: str
    created_at: float
    assignee_id: int | None = None
    bot_assignee_id: int | None = None
    labels: list[str] = field(default_factory=list)
    snoozed_until: float | None = None
    waiting_since: float | None = None
    first_reply_created_at: float | None = None
    last_activity_at: float = 0.0
    updated_at: float = 0.0
    additional_attributes: dict[str, Any] = field(default_factory=dict)
    messages: list[Message] = field(default_factory=list)

    @property
    def key(self) -> tuple[int, int]:
        return (self.account_id, self.id)


def iso(ts: float) -> str:
    """ISO-8601 UTC with milliseconds, as Rails writes `created_at` in message webhooks."""
    moment = datetime.fromtimestamp(ts, UTC)
    return moment.strftime("%Y-%m-%dT%H:%M:%S.") + f"{moment.microsecond // 1000:03d}Z"
