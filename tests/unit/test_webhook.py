"""The pure webhook door (behavior.md §3.2–§3.4, Decisions 3 and 7): what Chatwoot's deliveries turn into."""

from __future__ import annotations

import json
from typing import Any

import pytest

from projections.webhook import (
    Outcome,
    evaluate,
    extract_target,
    sign,
    signature_valid,
    signing_account,
    timestamp_fresh,
)
from schemas.records import Transition, WebhookReceived

NOW_MS = 1_790_000_000_500  # floor(now) = 1_790_000_000
NOW_S = "1790000000"
SECRETS = {1: "secret-one", 2: "secret-two"}


def message(**overrides: Any) -> dict[str, Any]:
    payload: dict[str, Any] = {
        "event": "message_created",
        "account": {"id": 1, "name": "Acme"},
        "id": 4321,
        "conversation": {"id": 42, "status": "pending"},
        "message_type": "incoming",
        "private": False,
        "content": "Hi, I need help",
        "sender": {"id": 9, "name": "Jo", "email": "jo@example.com"},
    }
    payload.update(overrides)
    return payload


def status_change(previous: Any, current: Any, **overrides: Any) -> dict[str, Any]:
    payload: dict[str, Any] = {
        "event": "conversation_updated",
        "account": {"id": 1},
        "id": 42,
        "status": current,
        "updated_at": 1723975200.123,
        "changed_attributes": [
            {"assignee_agent_bot_id": {"previous_value": 5, "current_value": None}},
            {"status": {"previous_value": previous, "current_value": current}},
        ],
    }
    payload.update(overrides)
    return payload


def decide(body: bytes, *, secret: str = "secret-one", ts: str = NOW_S, **kwargs: Any) -> Any:
    args: dict[str, Any] = {
        "body": body,
        "timestamp": ts,
        "signature": sign(secret, ts, body),
        "delivery_id": "5f0c6a4e-1d2b-4c3d-9e8f-0a1b2c3d4e5f",
        "secrets": SECRETS,
        "routed": {1, 2},
        "now_ms": NOW_MS,
    }
    args.update(kwargs)
    return evaluate(**args)


# --- timestamp window ------------------------------------------------------------------------------------


@pytest.mark.parametrize("offset", [-300, 0, 300])
def test_timestamp_within_300_seconds_inclusive_is_fresh(offset: int) -> None:
    assert timestamp_fresh(str(1_790_000_000 + offset), NOW_MS)


@pytest.mark.parametrize("offset", [-301, 301, 10_000])
def test_timestamp_outside_the_window_is_stale(offset: int) -> None:
    assert not timestamp_fresh(str(1_790_000_000 + offset), NOW_MS)


def test_window_is_measured_from_floor_of_now() -> None:
    # now = 1790000000.999 s floors to 1790000000, so ts = now_s + 300 is still inside
    assert timestamp_fresh("1790000300", 1_790_000_000_999)
    assert not timestamp_fresh("1789999699", 1_790_000_000_999)


@pytest.mark.parametrize(
    "header", [None, "", "17900000.0", "+1790000000", " 1790000000", "1790000000x", "1234567890123", "١٢٣"]
)
def test_timestamp_must_be_1_to_12_ascii_digits(header: str | None) -> None:
    assert not timestamp_fresh(header, NOW_MS)


def test_short_timestamps_are_digits_but_stale() -> None:
    assert not timestamp_fresh("0", NOW_MS)
    assert timestamp_fresh("0", 299_000)


# --- signature -------------------------------------------------------------------------------------------


def test_signature_is_hmac_sha256_over_timestamp_dot_raw_body() -> None:
    # reference value computed independently: HMAC-SHA256("s3cr3t", b"1700000000.{}")
    import hashlib
    import hmac

    expected = hmac.new(b"s3cr3t", b"1700000000.{}", hashlib.sha256).hexdigest()
    assert sign("s3cr3t", "1700000000", b"{}") == "sha256=" + expected
    assert signature_valid("sha256=" + expected, "1700000000", b"{}", "s3cr3t")


def test_signature_header_is_matched_case_insensitively() -> None:
    header = sign("s3cr3t", NOW_S, b"{}")
    assert signature_valid(header.upper(), NOW_S, b"{}", "s3cr3t")
    assert signature_valid("SHA256=" + header[7:], NOW_S, b"{}", "s3cr3t")


@pytest.mark.parametrize(
    "mangle",
    [
        lambda h: h[7:],  # no prefix
        lambda h: h + "0",  # 65 hex digits
        lambda h: h[:-1],  # 63 hex digits
        lambda h: "sha1=" + h[7:],
        lambda h: " " + h,
        lambda h: h + "\n",
        lambda h: h[:-1] + ("0" if h[-1] != "0" else "1"),  # one digit off
    ],
)
def test_malformed_or_wrong_signatures_do_not_verify(mangle: Any) -> None:
    header = sign("s3cr3t", NOW_S, b"{}")
    assert not signature_valid(mangle(header), NOW_S, b"{}", "s3cr3t")


def test_signature_covers_the_exact_bytes_and_the_timestamp() -> None:
    header = sign("s3cr3t", NOW_S, b'{"a":1}')
    assert not signature_valid(header, NOW_S, b'{"a": 1}', "s3cr3t")  # re-serialised body
    assert not signature_valid(header, "1790000001", b'{"a":1}', "s3cr3t")


def test_secrets_are_tried_in_ascending_account_order() -> None:
    same = {7: "shared", 3: "shared", 5: "other"}
    assert signing_account(sign("shared", NOW_S, b"x"), NOW_S, b"x", same) == 3
    assert signing_account(sign("other", NOW_S, b"x"), NOW_S, b"x", same) == 5
    assert signing_account(sign("nobody", NOW_S, b"x"), NOW_S, b"x", same) is None


# --- relevance and target extraction (§3.4) ------------------------------------------------------------


def test_incoming_contact_message_targets_its_conversation() -> None:
    target = extract_target(message())
    assert target is not None
    assert (target.account_id, target.conversation_id, target.event, target.transition) == (
        1,
        42,
        "message_created",
        None,
    )


@pytest.mark.parametrize(
    "overrides",
    [
        {"message_type": 0},
        {"message_type": 0.0},
        {"private": None},  # Decisions 3
        {"sender": None},
        {"sender": {"id": 9, "type": "contact"}},
        {"sender": {"id": 9, "type": None}},  # Decisions 3: null type = missing type = contact
        {"updated_at": None},
        {"account": {"id": 1.0}},  # JSON numbers: 1.0 is the integer 1
    ],
)
def test_incoming_message_variants_that_stay_relevant(overrides: dict[str, Any]) -> None:
    assert extract_target(message(**overrides)) is not None


@pytest.mark.parametrize(
    "overrides",
    [
        {"message_type": "outgoing"},
        {"message_type": 1},
        {"message_type": "template"},
        {"message_type": False},  # a boolean is not a number
        {"message_type": None},
        {"private": True},
        {"private": "false"},
        {"sender": {"id": 3, "type": "user"}},
        {"sender": {"id": 3, "type": "agent_bot"}},
        {"sender": "contact"},
        {"conversation": None},
        {"conversation": {"id": 0}},
        {"conversation": {"id": "42"}},
        {"id": None},
        {"event": "message_updated"},
        {"account": {"id": -1}},
        {"account": {"id": True}},
        {"account": None},
        {"updated_at": "yesterday"},
        {"changed_attributes": [None]},
    ],
)
def test_messages_that_are_irrelevant(overrides: dict[str, Any]) -> None:
    assert extract_target(message(**overrides)) is None


@pytest.mark.parametrize(
    "document", [[], "message_created", 42, None, {"event": "message_created"}, {"account": {"id": 1}}]
)
def test_payloads_not_fitting_the_shape_are_irrelevant(document: Any) -> None:
    assert extract_target(document) is None


def test_message_missing_id_is_irrelevant() -> None:
    payload = message()
    del payload["id"]
    assert extract_target(payload) is None


@pytest.mark.parametrize(
    "event",
    ["conversation_opened", "conversation_resolved", "conversation_updated", "conversation_status_changed"],
)
def test_conversation_events_target_the_display_id(event: str) -> None:
    target = extract_target({"event": event, "account": {"id": 2}, "id": 77})
    assert target is not None
    assert (target.account_id, target.conversation_id, target.event) == (2, 77, event)


@pytest.mark.parametrize("event", ["conversation_created", "webwidget_triggered", "conversation_typing_on"])
def test_other_events_are_irrelevant(event: str) -> None:
    assert extract_target({"event": event, "account": {"id": 2}, "id": 77}) is None


def test_status_changed_with_null_changed_attributes_is_still_relevant() -> None:
    # Decisions 3: Chatwoot sends changed_attributes: null on conversation_status_changed
    target = extract_target(
        {
            "event": "conversation_status_changed",
            "account": {"id": 1},
            "id": 42,
            "changed_attributes": None,
            "updated_at": 1723975200.5,
        }
    )
    assert target is not None
    assert target.transition is None
    assert target.updated_at == 1723975200.5


@pytest.mark.parametrize(
    ("previous", "current"),
    [
        ("pending", "open"),
        ("pending", "resolved"),
        ("pending", "snoozed"),
        ("open", "resolved"),
        ("snoozed", "resolved"),
        ("open", "pending"),
        ("snoozed", "pending"),
    ],
)
def test_transitions_that_are_attached(previous: str, current: str) -> None:
    target = extract_target(status_change(previous, current))
    assert target is not None
    assert target.transition == Transition(status=current, at=1723975200.123)


@pytest.mark.parametrize(
    ("previous", "current"),
    [("resolved", "pending"), ("open", "snoozed"), ("snoozed", "open"), ("resolved", "open")],
)
def test_transitions_that_are_not_attached(previous: str, current: str) -> None:
    target = extract_target(status_change(previous, current))
    assert target is not None
    assert target.transition is None


def test_no_transition_without_updated_at() -> None:
    payload = status_change("pending", "open")
    del payload["updated_at"]
    target = extract_target(payload)
    assert target is not None and target.transition is None


def test_first_status_entry_decides_the_transition() -> None:
    payload = status_change("open", "snoozed")
    payload["changed_attributes"].append({"status": {"previous_value": "pending", "current_value": "open"}})
    target = extract_target(payload)
    assert target is not None and target.transition is None


def test_status_entry_with_a_null_value_keeps_the_event_without_transition() -> None:
    target = extract_target(status_change(None, "pending"))
    assert target is not None and target.transition is None


def test_status_entry_with_a_non_string_value_makes_the_event_irrelevant() -> None:
    assert extract_target(status_change(3, "pending")) is None


# --- the whole door ------------------------------------------------------------------------------------


def test_accepted_message_becomes_the_normalised_record() -> None:
    verdict = decide(json.dumps(message()).encode())
    assert verdict.outcome is Outcome.ACCEPTED
    assert verdict.record == WebhookReceived(
        at_ms=NOW_MS,
        account_id=1,
        conversation_id=42,
        event="message_created",
        delivery_id="5f0c6a4e-1d2b-4c3d-9e8f-0a1b2c3d4e5f",
    )
    # nothing of the customer or the text reaches the record
    dumped = verdict.record.model_dump_json()
    assert "Hi, I need help" not in dumped and "jo@example.com" not in dumped and "Jo" not in dumped


def test_accepted_status_change_carries_transition_and_updated_at() -> None:
    verdict = decide(json.dumps(status_change("pending", "open")).encode())
    assert verdict.record == WebhookReceived(
        at_ms=NOW_MS,
        account_id=1,
        conversation_id=42,
        event="conversation_updated",
        transition=Transition(status="open", at=1723975200.123),
        updated_at=1723975200.123,
        delivery_id="5f0c6a4e-1d2b-4c3d-9e8f-0a1b2c3d4e5f",
    )


def test_missing_delivery_header_is_kept_as_none() -> None:
    verdict = decide(json.dumps(message()).encode(), delivery_id=None)
    assert verdict.outcome is Outcome.ACCEPTED and verdict.record.delivery_id is None


def test_stale_timestamp_is_checked_before_the_signature() -> None:
    verdict = decide(b"not json", ts="1790000301", signature="garbage")
    assert verdict.outcome is Outcome.STALE_TIMESTAMP


def test_missing_timestamp_is_stale() -> None:
    assert decide(b"{}", timestamp=None).outcome is Outcome.STALE_TIMESTAMP


def test_unknown_secret_is_a_bad_signature_even_for_garbage_bodies() -> None:
    assert decide(b"\xff\xfe", secret="not-configured").outcome is Outcome.BAD_SIGNATURE
    assert decide(b"{}", signature=None).outcome is Outcome.BAD_SIGNATURE


@pytest.mark.parametrize(
    "body", [b"\xff\xfe{}", b"{", b"", b'{"a": NaN}', b'{"a": Infinity}', b"[" * 100_000, b"1" * 5000]
)
def test_signed_but_undecodable_bodies_are_bad_requests(body: bytes) -> None:
    assert decide(body).outcome is Outcome.BAD_REQUEST


def test_irrelevant_event_is_ignored_before_the_account_check() -> None:
    # signed by account 1 but naming account 2: still 200 ignored (§3.2 notes)
    body = json.dumps(message(message_type="outgoing", account={"id": 2})).encode()
    assert decide(body).outcome is Outcome.IGNORED


def test_relevant_event_for_another_account_is_forbidden() -> None:
    body = json.dumps(message(account={"id": 2})).encode()
    assert decide(body, secret="secret-one").outcome is Outcome.FORBIDDEN
    assert decide(body, secret="secret-two").outcome is Outcome.ACCEPTED


def test_relevant_event_for_an_unrouted_account_is_forbidden() -> None:
    body = json.dumps(message(account={"id": 2})).encode()
    assert decide(body, secret="secret-two", routed={1}).outcome is Outcome.FORBIDDEN
