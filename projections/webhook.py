"""The pure part of the webhook ingress (behavior.md §3.2–§3.4 with Decisions 3 and 7).

Given the raw body, the signing headers, the secrets and a receive time, `evaluate` decides what the door
answers and, for a verified relevant event, the normalised record to make durable. No I/O and no clock: the
HTTP handler supplies "now", so the timestamp window is testable to the second.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import re
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from pydantic import ValidationError

from schemas.records import Transition, WebhookReceived
from schemas.webhook import WebhookPayload

MAX_BODY_BYTES = 2 * 1024 * 1024
"""Largest accepted body (exactly 2 MiB is accepted; Decisions 1)."""

TIMESTAMP_TOLERANCE_S = 300
"""Allowed clock difference between Chatwoot and us, inclusive (§3.3)."""

_TIMESTAMP = re.compile(r"[0-9]{1,12}")  # not \d: Python's \d also matches non-ASCII digits
_SIGNATURE = re.compile(r"sha256=([0-9a-f]{64})", re.IGNORECASE)
CONVERSATION_EVENTS = frozenset(
    {"conversation_opened", "conversation_resolved", "conversation_updated", "conversation_status_changed"}
)


class Outcome(StrEnum):
    """What the door decided; the HTTP layer maps each to a status and body."""

    ACCEPTED = "accepted"
    IGNORED = "ignored"
    STALE_TIMESTAMP = "stale_timestamp"
    BAD_SIGNATURE = "bad_signature"
    BAD_REQUEST = "bad_request"
    FORBIDDEN = "forbidden"


@dataclass(frozen=True)
class Verdict:
    """The outcome, the normalised record when accepted, and ids that are safe to log."""

    outcome: Outcome
    record: WebhookReceived | None = None
    signing_account: int | None = None
    event: str | None = None


@dataclass(frozen=True)
class Target:
    """The conversation a relevant event is about (§3.4), with its optional status transition."""

    account_id: int
    conversation_id: int
    event: str
    transition: Transition | None
    updated_at: float | None


# --- signing (§3.3) ---------------------------------------------------------------------------------------


def timestamp_fresh(header: str | None, now_ms: int, tolerance_s: int = TIMESTAMP_TOLERANCE_S) -> bool:
    """True when the timestamp header is 1–12 decimal digits within ±tolerance of floor(now)."""
    if header is None or not _TIMESTAMP.fullmatch(header):
        return False
    return abs(now_ms // 1000 - int(header)) <= tolerance_s


def signature_valid(header: str | None, timestamp: str, body: bytes, secret: str) -> bool:
    """Constant-time check of `sha256=<hex>` against HMAC-SHA256(secret, "<ts>." + raw body)."""
    if header is None:
        return False
    match = _SIGNATURE.fullmatch(header)
    if match is None:
        return False
    expected = hmac.new(secret.encode("utf-8"), timestamp.encode("utf-8") + b"." + body, hashlib.sha256)
    return hmac.compare_digest(expected.digest(), bytes.fromhex(match.group(1)))


def signing_account(header: str | None, timestamp: str, body: bytes, secrets: Mapping[int, str]) -> int | None:
    """The first account, in ascending id order, whose secret verifies the signature; None if none does."""
    for account_id, secret in sorted(secrets.items()):
        if signature_valid(header, timestamp, body, secret):
            return account_id
    return None


def sign(secret: str, timestamp: str, body: bytes) -> str:
    """The `X-Chatwoot-Signature` value Chatwoot would send (used by tests, the sandbox and benchmarks)."""
    mac = hmac.new(secret.encode("utf-8"), timestamp.encode("utf-8") + b"." + body, hashlib.sha256)
    return "sha256=" + mac.hexdigest()


# --- what a payload means (§3.4) -----------------------------------------------------------------------


def _transition(payload: WebhookPayload) -> Transition | None:
    """The status transition of §3.4, from the first `changed_attributes` entry that has a status."""
    if payload.updated_at is None:
        return None
    status = next((c.status for c in payload.changed_attributes or [] if c.status is not None), None)
    if status is None or status.previous_value is None or status.current_value is None:
        return None
    previous, current = status.previous_value, status.current_value
    if previous == "pending" or current == "resolved" or (current == "pending" and previous != "resolved"):
        return Transition(status=current, at=payload.updated_at)
    return None


def _incoming_from_contact(payload: WebhookPayload) -> bool:
    sender_type = payload.sender.type if payload.sender is not None else None
    return (
        payload.message_type in ("incoming", 0)
        and not payload.private
        and (sender_type is None or sender_type == "contact")
    )


def extract_target(document: Any) -> Target | None:
    """The target of a relevant event, or None when the event is irrelevant (§3.4)."""
    try:
        payload = WebhookPayload.model_validate(document)
    except ValidationError:
        return None
    if payload.event in CONVERSATION_EVENTS and payload.id is not None:
        return Target(payload.account.id, payload.id, payload.event, _transition(payload), payload.updated_at)
    if (
        payload.event == "message_created"
        and payload.id is not None
        and payload.conversation is not None
        and _incoming_from_contact(payload)
    ):
        return Target(payload.account.id, payload.conversation.id, payload.event, None, payload.updated_at)
    return None


def conversation_of(document: Any) -> tuple[int, int, str] | None:
    """(account id, conversation id, event) of any webhook that names a conversation, relevant or not: what an
    operator needs to find the conversation of a refused body (Chatwoot opens it instead). Ids only."""
    if not isinstance(document, dict):
        return None
    event = document.get("event")
    account = document.get("account")
    conversation = document.get("conversation")
    account_id = account.get("id") if isinstance(account, dict) else None
    if isinstance(conversation, dict):
        conversation_id = conversation.get("id")
    else:
        conversation_id = document.get("id") if event in CONVERSATION_EVENTS else None
    if not isinstance(account_id, int) or not isinstance(conversation_id, int) or not isinstance(event, str):
        return None
    return account_id, conversation_id, event


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")  # Python's json accepts NaN/Infinity; JSON (and Chatwoot) do not


def parse_json(body: bytes) -> Any:
    """Strict UTF-8 and strict JSON; raises ValueError otherwise (also for absurdly deep nesting)."""
    try:
        return json.loads(body.decode("utf-8"), parse_constant=_reject_constant)
    except RecursionError:
        raise ValueError("JSON nested too deeply") from None


# --- the whole door (§3.2 steps 2–6) ----------------------------------------------------------------------


def evaluate(
    *,
    body: bytes,
    timestamp: str | None,
    signature: str | None,
    delivery_id: str | None,
    secrets: Mapping[int, str],
    routed: Collection[int],
    now_ms: int,
    tolerance_s: int = TIMESTAMP_TOLERANCE_S,
) -> Verdict:
    """Decide a webhook in the order of §3.2; the body-size and settings steps happen before this."""
    if timestamp is None or not timestamp_fresh(timestamp, now_ms, tolerance_s):
        return Verdict(Outcome.STALE_TIMESTAMP)
    account = signing_account(signature, timestamp, body, secrets)
    if account is None:
        return Verdict(Outcome.BAD_SIGNATURE)
    try:
        document = parse_json(body)
    except ValueError:  # UnicodeDecodeError and JSONDecodeError are ValueErrors
        return Verdict(Outcome.BAD_REQUEST, signing_account=account)
    target = extract_target(document)
    if target is None:
        return Verdict(Outcome.IGNORED, signing_account=account)
    if target.account_id != account or target.account_id not in routed:
        return Verdict(Outcome.FORBIDDEN, signing_account=account, event=target.event)
    record = WebhookReceived(
        at_ms=now_ms,
        account_id=target.account_id,
        conversation_id=target.conversation_id,
        event=target.event,
        transition=target.transition,
        updated_at=target.updated_at,
        delivery_id=delivery_id,
    )
    return Verdict(Outcome.ACCEPTED, record=record, signing_account=account, event=target.event)
