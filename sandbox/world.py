"""Chatwoot's rules applied to the sandbox's records (chatwoot.md §4.3-§4.5, §4.7, §5).

Every change goes through `_save`, which does what Chatwoot's model callbacks do: it writes the activity
messages an actor's change produces and emits the agent-bot events (`conversation_opened`/`_resolved`,
`conversation_status_changed`, `conversation_updated` with `changed_attributes`, `message_created`) to the
bots that Chatwoot would send them to. Events are handed to `on_event`; delivery is the dispatcher's job.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from sandbox.model import (
    ACTIVITY,
    INCOMING,
    OUTGOING,
    TEMPLATE,
    Account,
    Bot,
    CannedResponse,
    Contact,
    Conversation,
    Inbox,
    Message,
    Sender,
    User,
    iso,
)
from sandbox.realism import Realism

Actor = User | Bot | None
STATUSES = ("open", "resolved", "pending", "snoozed")
TRACKED = (
    "team_id",
    "assignee_id",
    "assignee_agent_bot_id",
    "status",
    "snoozed_until",
    "custom_attributes",
    "label_list",
    "waiting_since",
    "first_reply_created_at",
    "priority",
)
_STATUS_TEXT = {
    "resolved": "Conversation was marked resolved by {}",
    "open": "Conversation was reopened by {}",
    "pending": "Conversation was marked as pending by {}",
    "snoozed": "Conversation was snoozed by {}",
}
BOT_FAILURE_TEXT = "Conversation was marked open by system due to an error with the agent bot."


class ApiError(Exception):
    """An HTTP error answer with Chatwoot's JSON body (chatwoot.md §4.0)."""

    def __init__(self, status: int, body: Any) -> None:
        self.status = status
        self.body = body
        super().__init__(f"HTTP {status}")


NOT_FOUND = {"error": "Resource could not be found"}


@dataclass
class BotEvent:
    """One agent-bot delivery to make: payload built at the moment of the change, as Chatwoot does."""

    event: str
    bot_id: int
    account_id: int
    conversation_id: int
    payload: dict[str, Any]


UNCHANGED: Any = object()
"""`Announcement.changed_attributes` of an event whose payload has no `changed_attributes` at all."""


@dataclass(frozen=True)
class Announcement:
    """A change Chatwoot announces to a conversation's agent bots; `World.render` makes its webhook payload at the
    moment of the change (the sandbox wires it to `views.announcement_payload`: the world never imports its
    views, which only read it)."""

    event: str
    conversation: Conversation
    message: Message | None = None
    changed_attributes: list[dict[str, Any]] | None = UNCHANGED


def _unrendered(world: World, announcement: Announcement) -> dict[str, Any]:
    raise RuntimeError("World.render is not wired (Sandbox sets it to views.announcement_payload)")


NEWEST_CHATWOOT = "4.18.0"


@dataclass
class World:
    """The whole simulated installation."""

    accounts: dict[int, Account] = field(default_factory=dict)
    users: dict[int, User] = field(default_factory=dict)
    bots: dict[int, Bot] = field(default_factory=dict)
    inboxes: dict[int, Inbox] = field(default_factory=dict)
    contacts: dict[int, Contact] = field(default_factory=dict)
    canned: dict[int, CannedResponse] = field(default_factory=dict)
    conversations: dict[tuple[int, int], Conversation] = field(default_factory=dict)
    default_webhook_url: str | None = None
    clock_offset_s: float = 0.0
    activity_delay_s: float = 0.0  # Chatwoot writes activities from a background job, a moment later
    # the Chatwoot release imitated (`GET /api`); older ones lack what the router needs (chatwoot.md §8)
    chatwoot_version: str = NEWEST_CHATWOOT
    # the rough edges switched on (shared with the dispatcher); here: bot replies clearing `waiting_since`
    realism: Realism = field(default_factory=Realism)
    on_event: Callable[[BotEvent], None] = lambda event: None
    render: Callable[[World, Announcement], dict[str, Any]] = _unrendered
    _ids: dict[str, int] = field(default_factory=dict)

    # --- small helpers -------------------------------------------------------------------------------------

    def at_least(self, major: int, minor: int) -> bool:
        """Whether the imitated Chatwoot is this release or newer."""
        parts = [int(p) for p in self.chatwoot_version.split(".")[:2] if p.isdigit()]
        return tuple(parts) >= (major, minor)

    def now(self) -> float:
        return time.time() + self.clock_offset_s

    def next_id(self, kind: str, start: int = 1) -> int:
        value = max(self._ids.get(kind, start - 1) + 1, start)
        self._ids[kind] = value
        return value

    def conversation(self, account_id: int, conversation_id: int) -> Conversation:
        found = self.conversations.get((account_id, conversation_id))
        if found is None:
            raise ApiError(404, NOT_FOUND)
        return found

    def latest_message(self, conversation: Conversation, *, include_internal: bool) -> Message | None:
        for message in reversed(self.sorted_messages(conversation)):
            if include_internal or (message.message_type != ACTIVITY and not message.private):
                return message
        return None

    @staticmethod
    def sorted_messages(conversation: Conversation) -> list[Message]:
        return sorted(conversation.messages, key=lambda m: (m.created_at, m.id))

    def token_owner(self, token: str) -> User | Bot | None:
        for user in self.users.values():
            if user.token == token:
                return user
        for bot in self.bots.values():
            if bot.access_token == token:
                return bot
        return None

    def bot_webhook_url(self, bot: Bot) -> str | None:
        return bot.outgoing_url or self.default_webhook_url

    # --- events --------------------------------------------------------------------------------------------

    def _recipients(self, conversation: Conversation) -> list[Bot]:
        """The assigned bot, and the inbox's bot when its link is active; de-duplicated (§1.1)."""
        found: list[Bot] = []
        if conversation.bot_assignee_id is not None:
            found.append(self.bots[conversation.bot_assignee_id])
        inbox = self.inboxes[conversation.inbox_id]
        if inbox.bot_id is not None and inbox.bot_active and inbox.bot_id != conversation.bot_assignee_id:
            found.append(self.bots[inbox.bot_id])
        return [bot for bot in found if self.bot_webhook_url(bot)]

    def _emit(self, announcement: Announcement) -> None:
        """Render the announcement's payload now (the state at the change) and hand each recipient bot its copy."""
        conversation, event = announcement.conversation, announcement.event
        recipients = self._recipients(conversation)
        if not recipients:
            return
        payload = self.render(self, announcement)
        for bot in recipients:
            self.on_event(
                BotEvent(event, bot.id, conversation.account_id, conversation.id, {**payload, "event": event})
            )

    def _save(self, conversation: Conversation, actor: Actor, **changes: Any) -> None:
        """Apply column changes and do what Chatwoot's callbacks do after the commit."""
        columns = {"assignee_agent_bot_id": "bot_assignee_id", "label_list": "labels"}
        changed: list[dict[str, Any]] = []
        for name, value in changes.items():
            attr = columns.get(name, name)
            previous = getattr(conversation, attr)
            if previous != value:
                setattr(conversation, attr, value)
                changed.append({name: {"previous_value": previous, "current_value": value}})
        if not changed:
            return
        now = self.now()
        changed.append({"updated_at": {"previous_value": conversation.updated_at, "current_value": now}})
        conversation.updated_at = now
        names = {next(iter(entry)) for entry in changed}
        if "status" in names:
            if conversation.status == "open":
                self._emit(Announcement("conversation_opened", conversation))
            if conversation.status == "resolved":
                self._emit(Announcement("conversation_resolved", conversation))
            self._emit(Announcement("conversation_status_changed", conversation, changed_attributes=None))
        if names & set(TRACKED):
            self._emit(Announcement("conversation_updated", conversation, changed_attributes=changed))
        self._write_activities(conversation, actor, changes, changed)

    def _write_activities(
        self, conversation: Conversation, actor: Actor, changes: dict[str, Any], changed: list[dict[str, Any]]
    ) -> None:
        """Activity messages of §5.1; only an actor's changes produce them."""
        if actor is None:
            return
        previous = {name: entry["previous_value"] for item in changed for name, entry in item.items()}
        if "status" in previous:
            status = conversation.status
            attributes = {"activity": {"type": "conversation_status_changed", "status": status}}
            self.add_activity(
                conversation,
                _STATUS_TEXT[status].format(actor.name),
                attributes if self.at_least(4, 17) else None,  # #14433: not before v4.17.0
            )
        if "assignee_id" in previous:
            new = conversation.assignee_id
            if new is None:
                text = f"Conversation unassigned by {actor.name}"
            elif new == actor.id:  # Chatwoot's quirk: compares ids only, whatever the actor's kind
                text = f"{actor.name} self-assigned this conversation"
            else:
                text = f"Assigned to {self.users[new].name} by {actor.name}"
            self.add_activity(conversation, text, {})
        if "label_list" in previous:
            before, after = previous["label_list"], changes["label_list"]
            added = [label for label in after if label not in before]
            removed = [label for label in before if label not in after]
            if added:
                self.add_activity(conversation, f"{actor.name} added {', '.join(added)}", {})
            if removed:
                self.add_activity(conversation, f"{actor.name} removed {', '.join(removed)}", {})

    # --- messages ------------------------------------------------------------------------------------------

    def _new_message(
        self,
        conversation: Conversation,
        message_type: int,
        content: str | None,
        sender: Sender | None,
        *,
        private: bool = False,
        content_type: str = "text",
        content_attributes: dict[str, Any] | None = None,
        status: str = "sent",
    ) -> Message:
        now = self.now()
        message = Message(
            id=self.next_id("message", 1000),
            account_id=conversation.account_id,
            inbox_id=conversation.inbox_id,
            conversation_id=conversation.id,
            message_type=message_type,
            content=content,
            created_at=now,
            sender=sender,
            private=private,
            content_type=content_type,
            content_attributes=content_attributes or {},
            updated_at=now,
            status=status,
        )
        conversation.messages.append(message)
        self._touch(conversation, now)
        return message

    @staticmethod
    def _touch(conversation: Conversation, now: float) -> None:
        """`Message belongs_to :conversation, touch: true`: saving a message moves its conversation's `updated_at`,
        silently (no `conversation_updated`: only `updated_at` changed, docs/chatwoot.md §4.12)."""
        conversation.updated_at = now

    def add_activity(self, conversation: Conversation, text: str, attributes: dict[str, Any] | None) -> None:
        """Writes an activity message now, or after `activity_delay_s` as Chatwoot's job would."""
        if self.activity_delay_s <= 0:
            self._new_message(conversation, ACTIVITY, text, None, content_attributes=attributes)
            return

        def write() -> None:
            if self.conversations.get(conversation.key) is conversation:
                self._new_message(conversation, ACTIVITY, text, None, content_attributes=attributes)

        asyncio.get_running_loop().call_later(self.activity_delay_s, write)

    def expire_snoozes(self) -> None:
        """Snoozed conversations whose time has come reopen: no activity, the bot stays (§5.2)."""
        now = self.now()
        for conversation in list(self.conversations.values()):
            until = conversation.snoozed_until
            if conversation.status == "snoozed" and until is not None and until <= now:
                self._save(conversation, None, status="open", snoozed_until=None)

    def add_message(
        self,
        conversation: Conversation,
        message_type: int,
        content: str | None,
        sender: Sender | None,
        *,
        private: bool = False,
        content_type: str = "text",
        content_attributes: dict[str, Any] | None = None,
        status: str = "sent",
    ) -> Message:
        """A new non-activity message with Chatwoot's side effects, then `message_created` (§5.2)."""
        message = self._new_message(
            conversation,
            message_type,
            content,
            sender,
            private=private,
            content_type=content_type,
            content_attributes=content_attributes,
            status=status,
        )
        if message_type == INCOMING:
            inbox = self.inboxes[conversation.inbox_id]
            if conversation.status == "resolved":
                bot_active = inbox.bot_id is not None and inbox.bot_active
                self._save(conversation, None, status="pending" if bot_active else "open")
            elif conversation.status == "snoozed":
                self._save(conversation, None, status="open", snoozed_until=None)
            if conversation.waiting_since is None:
                self._save(conversation, None, waiting_since=message.created_at)
        elif message_type == OUTGOING and not private and self.human_response(message):
            # only a human response ends the wait and counts as the first reply (bot replies do not)
            changes: dict[str, Any] = {"waiting_since": None}
            if conversation.first_reply_created_at is None:
                changes["first_reply_created_at"] = message.created_at
            self._save(conversation, None, **changes)
        if message_type != ACTIVITY:
            conversation.last_activity_at = message.created_at
            self._emit(Announcement("message_created", conversation, message))
        bot_reply = message_type == OUTGOING and not private and sender is not None and sender[0] == "agent_bot"
        if bot_reply and self.realism.waiting_since_updates and conversation.waiting_since is not None:
            # `Message#update_waiting_since` after `message_created`: a bot response ends the wait too, and
            # the change is announced like any other (`conversation_updated` with `waiting_since`)
            self._save(conversation, None, waiting_since=None)
        return message

    @staticmethod
    def human_response(message: Message) -> bool:
        """`Message#human_response?`: a person's outgoing message, or a native app's echo of one (a WhatsApp or
        Instagram reply sent from the phone, `external_echo`); never an automation's (`automation_rule_id`; the
        sandbox makes no campaigns, whose messages Chatwoot tells by `additional_attributes.campaign_id`)."""
        attributes = message.content_attributes
        if message.message_type != OUTGOING or attributes.get("automation_rule_id"):
            return False
        return (message.sender is not None and message.sender[0] == "user") or bool(attributes.get("external_echo"))

    def delete_message(self, conversation: Conversation, message_id: int) -> Message:
        for message in conversation.messages:
            if message.id == message_id:
                message.content = "This message was deleted"
                message.content_attributes = {**message.content_attributes, "deleted": True}
                message.updated_at = self.now()
                self._touch(conversation, message.updated_at)
                if message.message_type != ACTIVITY:
                    self._emit(Announcement("message_updated", conversation, message))
                return message
        raise ApiError(404, NOT_FOUND)

    def api_create_message(self, conversation: Conversation, actor: User | Bot, body: dict[str, Any]) -> Message:
        """`POST …/messages` (§4.7)."""
        message_type = body.get("message_type") or "outgoing"
        inbox = self.inboxes[conversation.inbox_id]
        types = {"outgoing": OUTGOING, "incoming": INCOMING, "template": TEMPLATE}
        if message_type not in types:
            raise ApiError(422, {"error": f"'{message_type}' is not a valid message_type"})
        if message_type == "incoming" and inbox.channel != "Channel::Api":
            raise ApiError(422, {"error": "Incoming messages are only allowed in Api inboxes"})
        content = body.get("content")
        if content is not None and not isinstance(content, str):
            raise ApiError(422, {"error": "content must be a string"})
        attributes = body.get("content_attributes") or {}
        sender: Sender | None
        if types[message_type] == INCOMING:
            sender = ("contact", conversation.contact_id)
        elif isinstance(actor, Bot):
            sender = ("agent_bot", actor.id)
        else:
            sender = ("user", actor.id)
        return self.add_message(
            conversation,
            types[message_type],
            content,
            sender,
            private=bool(body.get("private", False)),
            content_type=str(body.get("content_type") or "text"),
            content_attributes=attributes if isinstance(attributes, dict) else {},
        )

    # --- conversations -------------------------------------------------------------------------------------

    def create_conversation(
        self,
        account_id: int,
        inbox_id: int,
        contact: Contact,
        *,
        assignee_id: int | None = None,
        additional_attributes: dict[str, Any] | None = None,
    ) -> Conversation:
        """A new conversation (no event until its first message); pending with the bot in a bot inbox."""
        inbox = self.inboxes[inbox_id]
        bot_active = inbox.bot_id is not None and inbox.bot_active
        if contact.blocked:
            status = "resolved"
        elif bot_active:
            status = "pending"
        else:
            status = "open"
        now = self.now()
        conversation = Conversation(
            account_id=account_id,
            id=self.next_id(f"display:{account_id}"),
            uuid=str(uuid.uuid4()),
            inbox_id=inbox_id,
            contact_id=contact.id,
            status=status,
            created_at=now,
            assignee_id=assignee_id,
            # #14875 (v4.16): the inbox bot owns a new conversation; before, it was only pending
            bot_assignee_id=inbox.bot_id if bot_active and assignee_id is None and self.at_least(4, 16) else None,
            last_activity_at=now,
            updated_at=now,
            additional_attributes=additional_attributes or {},
        )
        self.conversations[conversation.key] = conversation
        return conversation

    def delete_conversation(self, account_id: int, conversation_id: int) -> None:
        self.conversation(account_id, conversation_id)
        del self.conversations[(account_id, conversation_id)]

    def toggle_status(
        self, conversation: Conversation, actor: User | Bot, status: str | None, snoozed_until: Any = None
    ) -> dict[str, Any]:
        """`POST …/toggle_status`, rules 1-4 of chatwoot.md §4.3."""
        success: bool | None = True
        if isinstance(actor, Bot) and conversation.status == "pending" and status == "open":
            if conversation.waiting_since is None:
                self._save(conversation, None, waiting_since=self.now())
            self._save(conversation, actor, assignee_agent_bot_id=None, status="open")
            success = None
        elif status:
            if status not in STATUSES:
                raise ApiError(500, None)
            until: float | None = None
            if status == "snoozed" and snoozed_until is not None:
                if not isinstance(snoozed_until, int | float) or isinstance(snoozed_until, bool):
                    raise ApiError(500, None)
                until = float(snoozed_until)
            self._save(conversation, actor, status=status, snoozed_until=until)
        else:
            flipped = {"pending": "open", "snoozed": "open", "open": "resolved", "resolved": "open"}
            self._save(conversation, actor, status=flipped[conversation.status], snoozed_until=None)
        if isinstance(actor, User) and conversation.status == "open":
            changes: dict[str, Any] = {"assignee_agent_bot_id": None}
            if actor.accounts.get(conversation.account_id) == "agent":
                changes["assignee_id"] = actor.id
            self._save(conversation, actor, **changes)
        return {
            "meta": {},
            "payload": {
                "success": success,
                "conversation_id": conversation.id,
                "current_status": conversation.status,
                "snoozed_until": iso(conversation.snoozed_until) if conversation.snoozed_until else None,
            },
        }

    def assign(self, conversation: Conversation, actor: User | Bot, body: dict[str, Any]) -> User | Bot | None:
        """`POST …/assignments` (§4.4); returns the assignee the 200 answer shows (`views.assignee_json`)."""
        assignee_id = body.get("assignee_id")
        if body.get("assignee_type") == "AgentBot" and assignee_id is not None:
            bot = self.bots.get(assignee_id) if isinstance(assignee_id, int) else None
            if bot is None or bot.account_id not in (None, conversation.account_id):
                return None
            self._save(conversation, actor, assignee_id=None, assignee_agent_bot_id=bot.id, status="pending")
            return bot
        if "assignee_id" in body:
            user = self.users.get(assignee_id) if isinstance(assignee_id, int) else None
            if user is None or conversation.account_id not in user.accounts:
                self._save(conversation, actor, assignee_id=None, assignee_agent_bot_id=None)
                return None
            changes: dict[str, Any] = {"assignee_id": user.id, "assignee_agent_bot_id": None}
            if conversation.bot_assignee_id is not None and conversation.status == "pending":
                changes["status"] = "open"
                if conversation.waiting_since is None:
                    changes["waiting_since"] = self.now()
            self._save(conversation, actor, **changes)
            return user
        return None

    def set_labels(self, conversation: Conversation, actor: Actor, labels: list[str]) -> list[str]:
        """`POST …/labels`: replaces the list (§4.5)."""
        unique = list(dict.fromkeys(labels))
        self._save(conversation, actor, label_list=unique)
        return list(conversation.labels)

    def bot_failure(self, account_id: int, conversation_id: int, event: str) -> None:
        """Chatwoot's fallback after a failed message delivery (§2): a pending conversation is opened."""
        conversation = self.conversations.get((account_id, conversation_id))
        if conversation is None or event not in ("message_created", "message_updated"):
            return
        if conversation.status != "pending" or self.accounts[account_id].keep_pending_on_bot_failure:
            return
        self._save(conversation, None, status="open")
        self.add_activity(conversation, BOT_FAILURE_TEXT, {})
