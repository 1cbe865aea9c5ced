"""Bytes <-> records for the worker's topics, and the DLQ record of one that cannot be handled (DESIGN §4, §9).

Topics carry raw bytes (Faust's raw serializer) so that decoding happens here, inside the agent's own
error handling: a bad record becomes a DLQ record instead of an exception that Faust would swallow.

Records outlive releases (behavior.md §12.1-§12.2): the `conversations` topic is kept forever and every reader
(the worker, `replay`, `audit`, `whatif`, the console, the golden histories) decodes it here. A release that
changes a record's shape must still read what earlier releases wrote, so it registers an *upcaster* for that
record `type` in `UPCASTERS`: a function from the stored record's JSON object (whatever its `v`) to the object
today's model validates, setting `v` to the model's current version. It runs before validation, on every decode
path below (conversation events, sweep events, effect commands; not on `ConfigApplied` markers). A record nested
in another (a `ChainedOutcomes`' outcomes) is upgraded by its container's upcaster, which can call `upcast` on
each. An upcaster that cannot read a record raises (`ValueError`, `KeyError`): the record is undecodable (DLQ). The
registry is empty today; while it is, decoding costs nothing more than before (no extra JSON parse), and with
entries only records whose bytes name a registered type are parsed twice. A golden history
(`tests/golden/`) shows whether old records still decode.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from pydantic import TypeAdapter, ValidationError

from schemas.records import ConfigApplied, ConversationEvent, EffectCommand, Record, SweepEvent, parse_marker

_conversation_events: TypeAdapter[ConversationEvent] = TypeAdapter(ConversationEvent)
_sweep_events: TypeAdapter[SweepEvent] = TypeAdapter(SweepEvent)
_commands: TypeAdapter[EffectCommand] = TypeAdapter(EffectCommand)


class Undecodable(ValueError):
    """A record that is not a valid record of its topic; `str()` is safe (no record content)."""


Upcaster = Callable[[dict[str, Any]], dict[str, Any]]

UPCASTERS: dict[str, Upcaster] = {}
"""Per record `type`: the function that turns a stored record of an older shape into today's (module docstring).
Register it in this module, below, e.g. `UPCASTERS["webhook_received"] = webhook_received_v1_to_v2`, with a test
that decodes a record of the old shape as an earlier release wrote it (`tests/unit/test_upcast.py`)."""


def upcast(record: dict[str, Any]) -> dict[str, Any]:
    """`record` as today's model reads it: its type's upcaster applied, or `record` itself when there is none."""
    kind = record.get("type")
    upcaster = UPCASTERS.get(kind) if isinstance(kind, str) else None
    return record if upcaster is None else upcaster(record)


def _upcast_raw(raw: bytes, what: str) -> bytes:
    """`raw`, or the JSON of its upcast object when its `type` has an upcaster (only called with some registered)."""
    if not any(f'"{name}"'.encode() in raw for name in UPCASTERS):
        return raw  # no registered type is even mentioned: the bytes are validated as they are
    try:
        record = json.loads(raw)
    except ValueError:
        return raw  # validation says what is wrong with it
    kind = record.get("type") if isinstance(record, dict) else None
    if not isinstance(kind, str) or kind not in UPCASTERS:
        return raw  # the name was quoted elsewhere in the record (a text, a nested record)
    try:
        return json.dumps(upcast(record)).encode()
    except (ValueError, KeyError, TypeError) as exc:  # an old record the upcaster cannot read: the DLQ, not a crash
        raise Undecodable(f"{what}: upcasting {kind}: {type(exc).__name__}") from None


def _decode(adapter: TypeAdapter, raw: bytes | None, what: str):  # type: ignore[no-untyped-def]
    if raw is None:
        raise Undecodable(f"{what}: empty value")
    if UPCASTERS:
        raw = _upcast_raw(raw, what)
    try:
        return adapter.validate_json(raw)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"]) or "record"
        raise Undecodable(f"{what}: {where}: {first['type']}") from None


def decode_conversation_event(raw: bytes | None) -> ConversationEvent:
    event: ConversationEvent = _decode(_conversation_events, raw, "conversation event")
    return event


def decode_sweep_event(raw: bytes | None) -> SweepEvent:
    event: SweepEvent = _decode(_sweep_events, raw, "sweep event")
    return event


def decode_marker(raw: bytes | None) -> ConfigApplied | None:
    """The `ConfigApplied` marker `raw` holds, or None for any other record (DESIGN §8)."""
    return parse_marker(raw)


def decode_command(raw: bytes | None) -> EffectCommand:
    command: EffectCommand = _decode(_commands, raw, "effect command")
    return command


def encode(record: Record) -> bytes:
    return record.model_dump_json().encode()


def check_key(key: bytes | None, expected: str) -> None:
    """A record whose Kafka key is not the key it names would be folded into the wrong state."""
    if key is None or key.decode(errors="replace") != expected:
        raise Undecodable("record key does not match its content")


def dlq_headers(error: str, topic: str, partition: int, offset: int, attempts: int = 1) -> list[tuple[str, bytes]]:
    """Headers of a DLQ record: why, and where it came from (so `replay` can re-publish it)."""
    return [
        ("error", error[:500].encode()),
        ("source_topic", topic.encode()),
        ("source_partition", str(partition).encode()),
        ("source_offset", str(offset).encode()),
        ("attempts", str(attempts).encode()),
    ]
