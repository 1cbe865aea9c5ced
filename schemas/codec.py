"""Bytes <-> records for the worker's topics, and the DLQ record of one that cannot be handled (DESIGN §4, §9).

Topics carry raw bytes (Faust's raw serializer) so that decoding happens here, inside the agent's own
error handling: a bad record becomes a DLQ record instead of an exception that Faust would swallow.
"""

from __future__ import annotations

from pydantic import TypeAdapter, ValidationError

from schemas.records import ConfigApplied, ConversationEvent, EffectCommand, Record, SweepEvent, parse_marker

_conversation_events: TypeAdapter[ConversationEvent] = TypeAdapter(ConversationEvent)
_sweep_events: TypeAdapter[SweepEvent] = TypeAdapter(SweepEvent)
_commands: TypeAdapter[EffectCommand] = TypeAdapter(EffectCommand)


class Undecodable(ValueError):
    """A record that is not a valid record of its topic; `str()` is safe (no record content)."""


def _decode(adapter: TypeAdapter, raw: bytes | None, what: str):  # type: ignore[no-untyped-def]
    if raw is None:
        raise Undecodable(f"{what}: empty value")
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
