"""The sandbox itself: the world, the fault plan, the webhook dispatcher and the logs of what was called and done.

`Sandbox`'s methods are what the control API (and tests, in-process) use to act as customers and people; the HTTP
layers (`chatwoot_api`, `control`, `server`) find it on the aiohttp app under `SANDBOX` and only call it.
"""

from __future__ import annotations

import itertools
import time
from typing import Any

from aiohttp import web

from sandbox import scenario, views
from sandbox.faults import Fault, FaultPlan
from sandbox.model import INCOMING, OUTGOING, Contact, Conversation, Message
from sandbox.realism import LARGE_EMAIL_BYTES, RateLimiter, Realism, large_email
from sandbox.webhooks import WebhookDispatcher, encode
from sandbox.world import ApiError, World

SYSTEMONE_PATH = "/v1/systemone"


class Sandbox:
    """A simulated Chatwoot installation plus System One."""

    def __init__(
        self,
        scenario_doc: dict[str, Any] | None = None,
        *,
        webhook_url: str | None = None,
        retry_delay_s: float = 3.0,
        webhook_timeout_s: float = 5.0,
        activity_delay_s: float = 0.0,
        realism: Realism | None = None,
    ) -> None:
        # the rough edges switched on (realism.py), one object shared by the world, the dispatcher and the limiter
        self.realism = realism or Realism()
        self.world = World(default_webhook_url=webhook_url, activity_delay_s=activity_delay_s, realism=self.realism)
        self.faults = FaultPlan()
        self.limiter = RateLimiter(self.realism)
        self.dispatcher = WebhookDispatcher(
            self.world, retry_delay_s=retry_delay_s, timeout_s=webhook_timeout_s, realism=self.realism
        )
        self.world.on_event = self.dispatcher.enqueue
        self.world.render = views.announcement_payload
        self.calls: list[dict[str, Any]] = []
        self.systemone_calls: list[dict[str, Any]] = []
        # what customers and people did through the control API, in the same sequence as `calls` (see `log`)
        self.person_actions: list[dict[str, Any]] = []
        self._seq = itertools.count(1)
        self.last_seq = 0
        self.systemone_api_key: str | None = None
        self.url = ""
        if scenario_doc:
            self.load(scenario_doc)

    # --- setup ---------------------------------------------------------------------------------------------

    def load(self, doc: dict[str, Any]) -> None:
        """Replace the world's accounts, users, bots, inboxes and canned responses (conversations go too); the
        document's `settings`, if any, are applied as `configure` does."""
        for table in (self.world.accounts, self.world.users, self.world.bots, self.world.inboxes):
            table.clear()
        self.world.canned.clear()
        self.world.contacts.clear()
        self.world.conversations.clear()
        scenario.load(self.world, doc)
        self.systemone_api_key = (doc.get("systemone") or {}).get("api_key")
        if doc.get("settings"):
            self.configure(doc["settings"])

    def configure(self, settings: dict[str, Any]) -> dict[str, Any]:
        """The settings API (`POST /_sandbox/settings`): the given fields change, the rest stay; returns them all.
        A new `rate_limit` starts counting afresh (the window's counts are forgotten)."""
        names = ("activity_delay_ms", "webhook_retry_delay_ms")
        delays = {name: float(settings[name]) / 1000 for name in names if name in settings}
        limit = self.realism.rate_limit
        self.realism.update(settings)  # after every other value was parsed: a bad value anywhere changes nothing
        if self.realism.rate_limit != limit:
            self.limiter.restart()
        if "activity_delay_ms" in delays:
            self.world.activity_delay_s = delays["activity_delay_ms"]
        if "webhook_retry_delay_ms" in delays:
            self.dispatcher.retry_delay_s = delays["webhook_retry_delay_ms"]
        if "chatwoot_version" in settings:
            self.world.chatwoot_version = str(settings["chatwoot_version"])
        return {
            "chatwoot_version": self.world.chatwoot_version,
            "activity_delay_ms": self.world.activity_delay_s * 1000,
            "webhook_retry_delay_ms": self.dispatcher.retry_delay_s * 1000,
            **self.realism.to_json(),
        }

    @property
    def chatwoot_url(self) -> str:
        return self.url

    @property
    def systemone_url(self) -> str:
        return self.url + SYSTEMONE_PATH

    # --- acting as customers and people --------------------------------------------------------------------

    def create_conversation(
        self,
        account_id: int,
        inbox_id: int,
        *,
        contact_name: str | None = "Sandbox Customer",
        contact_email: str | None = None,
        blocked: bool = False,
        assignee_id: int | None = None,
        subject: str | None = None,
        contact_id: int | None = None,
    ) -> Conversation:
        """A new conversation (of an existing contact with `contact_id`); like in Chatwoot no webhook fires until
        its first message."""
        if account_id not in self.world.accounts:
            raise ApiError(404, {"error": f"no account {account_id}"})
        inbox = self.world.inboxes.get(inbox_id)
        if inbox is None or inbox.account_id != account_id:
            raise ApiError(404, {"error": f"no inbox {inbox_id} in account {account_id}"})
        if contact_id is not None:
            if contact_id not in self.world.contacts:
                raise ApiError(404, {"error": f"no contact {contact_id}"})
            contact = self.world.contacts[contact_id]
        else:
            contact = Contact(self.world.next_id("contact"), account_id, contact_name, contact_email, blocked)
            self.world.contacts[contact.id] = contact
        attributes = {"mail_subject": subject} if subject else {}
        return self.world.create_conversation(
            account_id, inbox_id, contact, assignee_id=assignee_id, additional_attributes=attributes
        )

    def customer_message(
        self,
        account_id: int,
        conversation_id: int,
        content: str | None,
        *,
        email: dict[str, Any] | None = None,
        content_attributes: dict[str, Any] | None = None,
    ) -> Message:
        """An incoming message from the contact; `email` = {subject, quoted_text, quoted_html, html, auto_reply}
        (`html`: the mail's HTML part, which Chatwoot keeps as `html_content.full` and `.reply`). In an inbox with
        an `automation_message`, the conversation's first incoming message is followed by that automation's."""
        conversation = self.world.conversation(account_id, conversation_id)
        attributes = dict(content_attributes or {})
        content_type = "text"
        if email is not None:
            content_type = "incoming_email"
            html = email.get("html")
            attributes["email"] = {
                "subject": email.get("subject"),
                "auto_reply": bool(email.get("auto_reply", False)),
                "text_content": {
                    "full": content,
                    "reply": content,
                    "quoted": email.get("quoted_text", content),
                },
                "html_content": {"full": html, "reply": html, "quoted": email.get("quoted_html")},
            }
        before = self.summary(conversation)
        first = not any(m.message_type == INCOMING for m in conversation.messages)
        message = self.world.add_message(
            conversation,
            INCOMING,
            content,
            ("contact", conversation.contact_id),
            content_type=content_type,
            content_attributes=attributes,
        )
        self._record_action(conversation, "customer_message", None, before, {"message_id": message.id})
        automation = self.world.inboxes[conversation.inbox_id].automation_message
        if first and automation:
            self.automation_message(account_id, conversation_id, automation)
        return message

    def automation_message(
        self, account_id: int, conversation_id: int, content: str, *, automation_rule_id: int = 1
    ) -> Message:
        """An automation rule's "send message": outgoing, public, no sender, `content_attributes.automation_rule_id`
        (chatwoot.md §8); neither a person's reply nor a bot's, so it leaves `waiting_since` alone."""
        conversation = self.world.conversation(account_id, conversation_id)
        before = self.summary(conversation)
        attributes = {"automation_rule_id": automation_rule_id}
        message = self.world.add_message(conversation, OUTGOING, content, None, content_attributes=attributes)
        self._record_action(conversation, "automation_message", None, before, {"message_id": message.id})
        return message

    def external_echo(self, account_id: int, conversation_id: int, content: str) -> Message:
        """A WhatsApp / Instagram echo of a reply a person sent from the phone app: outgoing, public, no sender,
        `content_attributes.external_echo` and already `delivered` (PR #13371). Chatwoot counts it as a human
        response: it ends the wait and can be the first reply."""
        conversation = self.world.conversation(account_id, conversation_id)
        before = self.summary(conversation)
        message = self.world.add_message(
            conversation, OUTGOING, content, None, content_attributes={"external_echo": True}, status="delivered"
        )
        self._record_action(conversation, "external_echo", None, before, {"message_id": message.id})
        return message

    def large_email(
        self,
        account_id: int,
        conversation_id: int,
        *,
        min_webhook_bytes: int = LARGE_EMAIL_BYTES,
        subject: str = "Quarterly report",
    ) -> dict[str, Any]:
        """An incoming HTML e-mail so long that its `message_created` webhook passes `min_webhook_bytes` (3 MiB by
        default: past the router door's 2 MiB, which answers 413, a final failure for Chatwoot). Only in e-mail
        inboxes. Returns the message id and the sizes, not the message (it is megabytes)."""
        conversation = self.world.conversation(account_id, conversation_id)
        if self.world.inboxes[conversation.inbox_id].channel != "Channel::Email":
            raise ApiError(422, {"error": f"inbox {conversation.inbox_id} is not an e-mail inbox (Channel::Email)"})
        text, html = large_email(min_webhook_bytes)
        # a new mail quotes no history: its history-trimmed parts (`quoted`) are the whole text and HTML
        email = {"subject": subject, "html": html, "quoted_text": text, "quoted_html": html}
        message = self.customer_message(account_id, conversation_id, text, email=email)
        sent = [
            encode(d.event.payload)
            for d in self.dispatcher.deliveries
            if d.event.event == "message_created" and d.event.payload.get("id") == message.id
        ]
        return {
            "message_id": message.id,
            "text_bytes": len(text.encode("utf-8")),
            "html_bytes": len(html.encode("utf-8")),
            "webhook_bytes": len(sent[0]) if sent else None,  # None: no bot gets this conversation's events
        }

    def human_reply(
        self, account_id: int, conversation_id: int, user_id: int, content: str, *, private: bool = False
    ) -> Message:
        conversation = self.world.conversation(account_id, conversation_id)
        user = self._user(user_id)
        before = self.summary(conversation)
        message = self.world.add_message(conversation, OUTGOING, content, ("user", user.id), private=private)
        self._record_action(conversation, "reply", user_id, before, {"message_id": message.id, "private": private})
        return message

    def human_status(self, account_id: int, conversation_id: int, user_id: int, status: str | None) -> dict[str, Any]:
        """A person changes the status (§4.3 rule 4: opening clears the bot, agents self-assign)."""
        conversation = self.world.conversation(account_id, conversation_id)
        user = self._user(user_id)
        before = self.summary(conversation)
        result = self.world.toggle_status(conversation, user, status)
        self._record_action(conversation, "status", user_id, before, {"status": status})
        return result

    def human_assign(self, account_id: int, conversation_id: int, user_id: int, assignee_id: int | None) -> Any:
        conversation = self.world.conversation(account_id, conversation_id)
        user = self._user(user_id)
        before = self.summary(conversation)
        assignee = self.world.assign(conversation, user, {"assignee_id": assignee_id})
        self._record_action(conversation, "assign", user_id, before, {"assignee_id": assignee_id})
        return views.assignee_json(assignee, account_id)

    def human_labels(
        self,
        account_id: int,
        conversation_id: int,
        user_id: int,
        *,
        labels: list[str] | None = None,
        add: list[str] | None = None,
        remove: list[str] | None = None,
    ) -> list[str]:
        """A person edits the labels: `labels` replaces the list; else `add` / `remove` change it."""
        conversation = self.world.conversation(account_id, conversation_id)
        user = self._user(user_id)
        before = self.summary(conversation)
        if labels is None:
            labels = [label for label in conversation.labels if label not in (remove or [])]
            labels += [label for label in add or [] if label not in labels]
        result = self.world.set_labels(conversation, user, [str(label) for label in labels])
        self._record_action(conversation, "labels", user_id, before, {"labels": result})
        return result

    def delete_conversation(self, account_id: int, conversation_id: int) -> None:
        self.world.delete_conversation(account_id, conversation_id)

    def delete_message(self, account_id: int, conversation_id: int, message_id: int) -> Message:
        return self.world.delete_message(self.world.conversation(account_id, conversation_id), message_id)

    def add_fault(self, **rule: Any) -> Fault:
        fault = Fault.parse(rule)
        self.faults.add(fault)
        return fault

    async def settle(self, timeout_s: float = 30.0) -> None:
        """Wait until every webhook queued so far has been delivered or has failed."""
        await self.dispatcher.settle(timeout_s)

    def stats(self) -> dict[str, Any]:
        """Counters tests assert on: the rate limiter's (429s per client IP, this window's counts) and the
        webhook jobs' (runs, second runs, unfinished)."""
        return {
            **self.limiter.to_json(),
            "webhook_deliveries": len(self.dispatcher.deliveries),
            "webhook_duplicates": sum(1 for d in self.dispatcher.deliveries if d.duplicate),
            "webhooks_pending": self.dispatcher.pending,
            "realism": self.realism.to_json(),
        }

    def next_seq(self) -> int:
        """One sequence shared by API calls (arrival and application) and control-API actions: their order."""
        self.last_seq = next(self._seq)
        return self.last_seq

    @staticmethod
    def summary(conversation: Conversation) -> dict[str, Any]:
        """The fields people and the router change, as the request log records them before and after."""
        return {
            "status": conversation.status,
            "assignee_id": conversation.assignee_id,
            "bot_assignee_id": conversation.bot_assignee_id,
            "labels": list(conversation.labels),
        }

    def _record_action(
        self, conversation: Conversation, action: str, user_id: int | None, before: dict[str, Any], args: Any
    ) -> None:
        self.person_actions.append(
            {
                "seq": self.next_seq(),
                "at": time.time(),
                "action": action,
                "user_id": user_id,
                "account_id": conversation.account_id,
                "conversation_id": conversation.id,
                "args": args,
                "before": before,
                "after": self.summary(conversation),
            }
        )

    def _user(self, user_id: int) -> Any:
        user = self.world.users.get(user_id)
        if user is None:
            raise ApiError(404, {"error": f"no user {user_id}"})
        return user

    # --- reading back --------------------------------------------------------------------------------------

    def conversation_state(self, conversation: Conversation) -> dict[str, Any]:
        return {
            "account_id": conversation.account_id,
            "id": conversation.id,
            "inbox_id": conversation.inbox_id,
            "status": conversation.status,
            "assignee_id": conversation.assignee_id,
            "bot_assignee_id": conversation.bot_assignee_id,
            "labels": list(conversation.labels),
            "contact": views.contact_push(self.world.contacts[conversation.contact_id]),
            "waiting_since": conversation.waiting_since,
            "messages": [views.message_rest(self.world, m) for m in self.world.sorted_messages(conversation)],
        }

    def snapshot(self) -> dict[str, Any]:
        """Everything a test or the demo report wants to check, as JSON."""
        return {
            "conversations": [self.conversation_state(c) for c in self.world.conversations.values()],
            "webhooks": [d.to_json() for d in self.dispatcher.deliveries],
            "api_calls": list(self.calls),
            "systemone_calls": list(self.systemone_calls),
            "faults": [f.to_json() for f in self.faults.rules],
            "clock_offset_s": self.world.clock_offset_s,
        }

    def log(self, since_seq: int = 0, include: frozenset[str] | None = None) -> dict[str, Any]:
        """The request log without the conversations: API calls and control-API actions with `seq` above
        `since_seq` (an API call counts by its arrival), every webhook delivery and System One call; `include`
        names the parts wanted (default all); `last_seq` is always there."""
        parts: dict[str, Any] = {
            "api_calls": lambda: [c for c in self.calls if c.get("seq", 0) > since_seq],
            "person_actions": lambda: [a for a in self.person_actions if a["seq"] > since_seq],
            "webhooks": lambda: [d.to_json() for d in self.dispatcher.deliveries],
            "systemone_calls": lambda: list(self.systemone_calls),
        }
        result = {name: build() for name, build in parts.items() if include is None or name in include}
        result["last_seq"] = self.last_seq
        return result


SANDBOX: web.AppKey[Sandbox] = web.AppKey("sandbox")
