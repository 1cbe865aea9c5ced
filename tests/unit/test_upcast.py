"""The upcaster seam of `schemas/codec.py`: how a release reads records an earlier release wrote in another shape.

No record shape has changed yet, so the registry is empty in production; these tests register a hypothetical
upcaster (an old `webhook_received` that named the conversation `conversation`) for their own duration.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from schemas import codec
from schemas.codec import Undecodable, decode_command, decode_conversation_event, decode_sweep_event
from schemas.records import EffectCommand, GetConversation, SweepRequested, TimerFired, WebhookReceived

OLD_WEBHOOK = b'{"v": 0, "at_ms": 5, "type": "webhook_received", "account_id": 1, "conversation": 42, "event": "m"}'
TODAY = WebhookReceived(at_ms=5, account_id=1, conversation_id=42, event="m")


def webhook_v0_to_v1(record: dict[str, Any]) -> dict[str, Any]:
    if record["v"] != 0:
        return record
    record = dict(record, v=1, conversation_id=record["conversation"])
    del record["conversation"]
    return record


@pytest.fixture
def registered(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(codec.UPCASTERS, "webhook_received", webhook_v0_to_v1)


def test_without_an_upcaster_an_old_shape_is_undecodable() -> None:
    with pytest.raises(Undecodable, match="conversation_id"):
        decode_conversation_event(OLD_WEBHOOK)


@pytest.mark.usefixtures("registered")
def test_a_registered_upcaster_is_applied_before_validation() -> None:
    assert decode_conversation_event(OLD_WEBHOOK) == TODAY
    assert decode_conversation_event(TODAY.model_dump_json().encode()) == TODAY  # today's shape: left as it is


@pytest.mark.usefixtures("registered")
def test_records_of_other_types_pass_unchanged() -> None:
    timer = TimerFired(at_ms=1, key="1:42", due_ms=9)
    quoting = TimerFired(at_ms=1, key='"webhook_received"', due_ms=9)  # names the type, is another record
    command = EffectCommand(at_ms=1, key="1:42", account_id=1, command_id="1:42:1:1", params=GetConversation())
    sweep = SweepRequested(at_ms=1, account_id=1, status="open")
    assert decode_conversation_event(timer.model_dump_json().encode()) == timer
    assert decode_conversation_event(quoting.model_dump_json().encode()) == quoting
    assert decode_command(command.model_dump_json().encode()) == command
    assert decode_sweep_event(sweep.model_dump_json().encode()) == sweep


@pytest.mark.usefixtures("registered")
def test_bad_bytes_are_still_reported_by_validation() -> None:
    with pytest.raises(Undecodable, match="json_invalid"):
        decode_conversation_event(b'{"type": "webhook_received", ')


def test_an_upcaster_that_cannot_read_a_record_makes_it_undecodable(monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(record: dict[str, Any]) -> dict[str, Any]:
        return {**record, "conversation_id": record["missing"]}

    monkeypatch.setitem(codec.UPCASTERS, "webhook_received", broken)
    with pytest.raises(Undecodable, match="upcasting webhook_received: KeyError") as caught:
        decode_conversation_event(OLD_WEBHOOK)
    assert "42" not in str(caught.value)  # no record content in the message (it goes to logs and DLQ headers)


@pytest.mark.usefixtures("registered")
def test_upcast_is_what_a_containers_upcaster_applies_to_its_nested_records() -> None:
    old = json.loads(OLD_WEBHOOK)
    assert WebhookReceived.model_validate(codec.upcast(old)) == TODAY
    assert "conversation" in old  # the stored object itself is left as it was read
    assert codec.upcast({"type": "timer_fired", "v": 1}) == {"type": "timer_fired", "v": 1}


def test_the_registry_is_consulted_only_when_it_has_entries(monkeypatch: pytest.MonkeyPatch) -> None:
    """The worker decodes every record: with no upcaster registered, the bytes go straight to validation."""

    def never(raw: bytes, what: str) -> bytes:
        raise AssertionError("consulted")

    monkeypatch.setattr(codec, "_upcast_raw", never)
    assert decode_conversation_event(TODAY.model_dump_json().encode()) == TODAY
