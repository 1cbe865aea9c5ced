"""The decision rules (behavior.md §8), the public-reply test (§9.2) and the labels (§9.6), all pure."""

from __future__ import annotations

from collections.abc import Sequence

from projections.inputs import is_customer_message
from schemas.chatwoot import MessageType
from schemas.config import Kind, RouterConfig
from schemas.decision import Decision
from schemas.records import ConversationView, MessageView

WAIT_S = 1800


def requires_handoff(messages: Sequence[MessageView], bot_id: int) -> bool:
    """§9.2: a person answered publicly, or our own reply failed or was deleted."""
    for m in messages:
        if m.message_type != MessageType.OUTGOING or m.private:
            continue
        if m.sender_type == "user" and not m.deleted:
            return True
        if m.sender_type == "agent_bot" and m.sender_id == bot_id and (m.status == "failed" or m.deleted):
            return True
    return False


def actionable_kind(decision: Decision, config: RouterConfig, account_id: int) -> tuple[str, Kind] | None:
    """§8: the configured kind Jev chose with enough confidence, if any."""
    kinds = config.kinds_of(account_id) or {}
    if decision.kind is None or decision.kind_confidence < config.routing.min_confidence:
        return None
    kind = kinds.get(decision.kind)
    return None if kind is None else (decision.kind, kind)


def confident_assignee(decision: Decision, config: RouterConfig, account_id: int) -> int | None:
    """§8: the Chatwoot user id of the confident owner, if any."""
    owners = config.routing.accounts.get(account_id, {})
    if decision.owner is None or decision.owner_confidence < config.routing.min_confidence:
        return None
    owner = owners.get(decision.owner)
    return None if owner is None else owner.assignee


def person_assigned(c: ConversationView) -> bool:
    """§9.1: `meta.assignee` with assignee_type "User" or null/absent."""
    return c.has_assignee and c.assignee_type in (None, "User")


def owns(c: ConversationView, bot_id: int) -> bool:
    """§9.1 owns(c): assigned to this account's brand bot."""
    return c.assignee_type == "AgentBot" and c.assignee_id == bot_id


def should_wait(
    *,
    decision: Decision,
    kind: str | None,
    count: int,
    current: ConversationView,
    messages: Sequence[MessageView],
    now_ms: int,
) -> bool:
    """§8 rule 3: a greeting-only turn younger than 30 minutes stays pending (now = the event's time)."""
    if kind is not None or not decision.no_request or count >= 3 or person_assigned(current):
        return False
    created = [m.created_at for m in messages if is_customer_message(m)]
    if any(c is None for c in created):
        return True  # a message without created_at counts as infinitely recent
    latest = max((c for c in created if c is not None), default=None)
    if latest is None:
        return False
    return now_ms / 1000 - latest < WAIT_S


def new_labels(
    *,
    decision: Decision,
    kind: tuple[str, Kind] | None,
    current: ConversationView,
    config: RouterConfig,
    account_id: int,
) -> tuple[str, ...] | None:
    """§9.6: the label list to send, or None when nothing would be added."""
    kind_names = set(config.kinds_of(account_id) or {})
    topics = config.routing.topics or {}
    additions: list[str] = []
    if (
        (kind is None or kind[1].status is None)
        and decision.topic is not None
        and decision.topic in topics
        and decision.topic_confidence >= config.routing.min_confidence
        and all(label in kind_names for label in current.labels)
    ):
        additions.append(decision.topic)
    if kind is not None and kind[1].label:
        additions.append(kind[0])
    merged = tuple(dict.fromkeys([*current.labels, *additions]))
    return merged if len(merged) > len(dict.fromkeys(current.labels)) else None
