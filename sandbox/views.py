"""Chatwoot's JSON shapes (chatwoot.md §1.3-§1.4 webhooks, §4.12 REST) rendered from sandbox records.

The REST and webhook views differ on purpose, as Chatwoot's do: the REST conversation omits `meta.assignee`
when unassigned while the webhook sends it as null; webhook messages use string types and ISO times at the top
level but integer types and unix seconds inside `conversation.messages`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from sandbox.model import (
    ACTIVITY,
    MESSAGE_TYPE_NAMES,
    Bot,
    CannedResponse,
    Contact,
    Conversation,
    Message,
    User,
    iso,
)
from sandbox.world import UNCHANGED

if TYPE_CHECKING:
    from sandbox.world import Announcement, World


def contact_push(contact: Contact, with_type: bool = True) -> dict[str, Any]:
    data: dict[str, Any] = {
        "additional_attributes": {},
        "custom_attributes": {},
        "email": contact.email,
        "id": contact.id,
        "identifier": None,
        "name": contact.name,
        "phone_number": None,
        "thumbnail": "",
        "blocked": contact.blocked,
    }
    if with_type:
        data["type"] = "contact"
    return data


def user_push(user: User) -> dict[str, Any]:
    return {
        "id": user.id,
        "name": user.name,
        "available_name": user.name,
        "avatar_url": "",
        "type": "user",
        "availability_status": user.availability_status,
        "thumbnail": "",
    }


def bot_push(bot: Bot) -> dict[str, Any]:
    return {"id": bot.id, "name": bot.name, "avatar_url": "", "type": "agent_bot"}


def agent_json(user: User, account_id: int) -> dict[str, Any]:
    return {
        "id": user.id,
        "account_id": account_id,
        "availability_status": user.availability_status,
        "auto_offline": True,
        "confirmed": True,
        "email": user.email,
        "provider": "email",
        "available_name": user.name,
        "name": user.name,
        "role": user.accounts.get(account_id, "agent"),
        "thumbnail": "",
    }


def bot_slim(bot: Bot) -> dict[str, Any]:
    data: dict[str, Any] = {"id": bot.id, "name": bot.name, "description": bot.description, "thumbnail": ""}
    if bot.account_id is not None:
        data["outgoing_url"] = bot.outgoing_url
    data["bot_type"] = "webhook"
    return data


def canned_json(canned: CannedResponse) -> dict[str, Any]:
    return {
        "id": canned.id,
        "short_code": canned.short_code,
        "content": canned.content,
        "account_id": canned.account_id,
        "created_at": iso(canned.created_at),
        "updated_at": iso(canned.created_at),
    }


def _sender_push(world: World, message: Message) -> dict[str, Any] | None:
    if message.sender is None:
        return None
    kind, sender_id = message.sender
    if kind == "contact":
        return contact_push(world.contacts[sender_id])
    if kind == "user":
        return user_push(world.users[sender_id])
    return bot_push(world.bots[sender_id])


_SENDER_TYPES = {"contact": "Contact", "user": "User", "agent_bot": "AgentBot"}


def message_rest(world: World, message: Message) -> dict[str, Any]:
    """The REST message (list, create)."""
    data: dict[str, Any] = {
        "id": message.id,
        "content": message.content,
        "inbox_id": message.inbox_id,
        "conversation_id": message.conversation_id,
        "message_type": message.message_type,
        "content_type": message.content_type,
        "status": message.status,
        "content_attributes": message.content_attributes,
        "created_at": int(message.created_at),
        "private": message.private,
        "source_id": None,
    }
    sender = _sender_push(world, message)
    if sender is not None:
        data["sender"] = sender
    return data


def message_push(world: World, message: Message, conversation: Conversation) -> dict[str, Any]:
    """Push data: the `messages[0]` entry of conversation payloads."""
    data = message_rest(world, message)
    data.update(
        {
            "account_id": message.account_id,
            "sender_type": _SENDER_TYPES[message.sender[0]] if message.sender else None,
            "sender_id": message.sender[1] if message.sender else None,
            "external_source_ids": {},
            "additional_attributes": {},
            "processed_message_content": message.content,
            "sentiment": {},
            "updated_at": iso(message.updated_at or message.created_at),
            "conversation": {
                "assignee_id": conversation.assignee_id,
                "unread_count": 0,
                "last_activity_at": int(conversation.last_activity_at),
                "contact_inbox": {"source_id": f"src-{conversation.contact_id}"},
            },
        }
    )
    data.setdefault("sender", None)
    return data


def _assignee(world: World, conversation: Conversation) -> tuple[dict[str, Any] | None, str | None]:
    if conversation.assignee_id is not None:
        return user_push(world.users[conversation.assignee_id]), "User"
    if conversation.bot_assignee_id is not None:
        return bot_push(world.bots[conversation.bot_assignee_id]), "AgentBot"
    return None, None


def _rest_assignee(world: World, conversation: Conversation) -> tuple[dict[str, Any] | None, str | None]:
    if conversation.assignee_id is not None:
        return agent_json(world.users[conversation.assignee_id], conversation.account_id), "User"
    if conversation.bot_assignee_id is not None:
        return bot_slim(world.bots[conversation.bot_assignee_id]), "AgentBot"
    return None, None


def conversation_rest(world: World, conversation: Conversation) -> dict[str, Any]:
    """The REST conversation (show, list items): `meta.assignee`/`assignee_type` absent when unassigned."""
    contact = world.contacts[conversation.contact_id]
    sender = contact_push(contact, with_type=False)
    sender.update({"availability_status": "offline", "last_activity_at": None, "created_at": None})
    meta: dict[str, Any] = {"sender": sender, "channel": world.inboxes[conversation.inbox_id].channel}
    assignee, assignee_type = _rest_assignee(world, conversation)
    if assignee is not None:
        meta["assignee"] = assignee
        meta["assignee_type"] = assignee_type
    meta["hmac_verified"] = False
    latest = world.latest_message(conversation, include_internal=True)
    last_public = world.latest_message(conversation, include_internal=False)
    return {
        "meta": meta,
        "id": conversation.id,
        "messages": [message_push(world, latest, conversation)] if latest else [],
        "account_id": conversation.account_id,
        "uuid": conversation.uuid,
        "additional_attributes": conversation.additional_attributes,
        "agent_last_seen_at": 0,
        "assignee_last_seen_at": 0,
        "can_reply": True,
        "contact_last_seen_at": 0,
        "custom_attributes": {},
        "inbox_id": conversation.inbox_id,
        "labels": list(conversation.labels),
        "muted": False,
        "snoozed_until": iso(conversation.snoozed_until) if conversation.snoozed_until else None,
        "status": conversation.status,
        "created_at": int(conversation.created_at),
        "updated_at": conversation.updated_at,
        "timestamp": int(conversation.last_activity_at),
        "first_reply_created_at": int(conversation.first_reply_created_at or 0),
        "unread_count": 0,
        "last_non_activity_message": message_push(world, last_public, conversation) if last_public else None,
        "last_activity_at": int(conversation.last_activity_at),
        "priority": None,
        "waiting_since": int(conversation.waiting_since or 0),
        "sla_policy_id": None,
    }


def conversation_webhook(world: World, conversation: Conversation) -> dict[str, Any]:
    """Conversation webhook data (§1.4): assignee keys always present, null when unassigned."""
    contact = world.contacts[conversation.contact_id]
    inbox = world.inboxes[conversation.inbox_id]
    account = world.accounts[conversation.account_id]
    assignee, assignee_type = _assignee(world, conversation)
    last_public = world.latest_message(conversation, include_internal=False)
    return {
        "additional_attributes": conversation.additional_attributes,
        "can_reply": True,
        "channel": inbox.channel,
        "contact_inbox": {
            "id": conversation.contact_id,
            "contact_id": conversation.contact_id,
            "inbox_id": inbox.id,
            "source_id": f"src-{conversation.contact_id}",
            "created_at": iso(conversation.created_at),
            "updated_at": iso(conversation.created_at),
            "hmac_verified": False,
            "pubsub_token": f"pubsub-{conversation.contact_id}",
        },
        "id": conversation.id,
        "inbox_id": inbox.id,
        "messages": [message_push(world, last_public, conversation)] if last_public else [],
        "labels": list(conversation.labels),
        "meta": {
            "sender": contact_push(contact),
            "assignee": assignee,
            "assignee_type": assignee_type,
            "team": None,
            "hmac_verified": False,
        },
        "status": conversation.status,
        "custom_attributes": {},
        "snoozed_until": iso(conversation.snoozed_until) if conversation.snoozed_until else None,
        "unread_count": 0,
        "first_reply_created_at": iso(conversation.first_reply_created_at)
        if conversation.first_reply_created_at
        else None,
        "priority": None,
        "waiting_since": int(conversation.waiting_since or 0),
        "agent_last_seen_at": 0,
        "contact_last_seen_at": 0,
        "last_activity_at": int(conversation.last_activity_at),
        "timestamp": int(conversation.last_activity_at),
        "created_at": int(conversation.created_at),
        "updated_at": conversation.updated_at,
        "account": {"id": account.id, "name": account.name},
    }


def message_webhook(world: World, message: Message, conversation: Conversation) -> dict[str, Any]:
    """Message webhook data (§1.3), without the `event` key."""
    account = world.accounts[message.account_id]
    inbox = world.inboxes[message.inbox_id]
    sender: dict[str, Any] | None = None
    if message.sender is not None:
        kind, sender_id = message.sender
        if kind == "contact":
            contact = world.contacts[sender_id]
            sender = {"account": {"id": account.id, "name": account.name}, **contact_push(contact, False)}
            sender["avatar"] = ""
        elif kind == "user":
            user = world.users[sender_id]
            sender = {"id": user.id, "name": user.name, "email": user.email, "type": "user"}
        else:
            bot = world.bots[sender_id]
            sender = {"id": bot.id, "name": bot.name, "type": "agent_bot"}
    assert message.message_type != ACTIVITY, "activity messages are never sent to bots"
    return {
        "account": {"id": account.id, "name": account.name},
        "additional_attributes": {},
        "content_attributes": message.content_attributes,
        "content_type": message.content_type,
        "content": message.content,
        "conversation": conversation_webhook(world, conversation),
        "created_at": iso(message.created_at),
        "id": message.id,
        "inbox": {"id": inbox.id, "name": inbox.name},
        "message_type": MESSAGE_TYPE_NAMES[message.message_type],
        "private": message.private,
        "sender": sender,
        "source_id": None,
    }


def announcement_payload(world: World, announcement: Announcement) -> dict[str, Any]:
    """The webhook payload of a change the world announces (without `event`, which each copy gets)."""
    if announcement.message is not None:
        return message_webhook(world, announcement.message, announcement.conversation)
    payload = conversation_webhook(world, announcement.conversation)
    if announcement.changed_attributes is not UNCHANGED:
        payload = {**payload, "changed_attributes": announcement.changed_attributes}
    return payload


def assignee_json(assignee: User | Bot | None, account_id: int) -> dict[str, Any] | None:
    """The body of an assignment's 200 answer (§4.4): the bot's slim view, the agent's, or null."""
    if isinstance(assignee, Bot):
        return bot_slim(assignee)
    return agent_json(assignee, account_id) if assignee is not None else None
