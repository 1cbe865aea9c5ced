"""The record and table keys (DESIGN §4): one text form, built and parsed in one place."""

from __future__ import annotations

import pytest

from schemas.keys import (
    ConversationKey,
    SweepKey,
    conversation_key,
    is_conversation_key,
    parse_key,
    parse_partition_slot,
    partition_slot,
    route_command_id,
    run_of_command,
    sweep_command_id,
)


def test_a_conversation_key_round_trips() -> None:
    assert conversation_key(1, 42) == "1:42"
    assert parse_key("1:42") == ConversationKey(1, 42)
    assert is_conversation_key("1:42")


def test_a_sweep_key_round_trips() -> None:
    assert str(SweepKey(3, "open")) == "3:open"
    assert parse_key("3:pending") == SweepKey(3, "pending")
    assert not is_conversation_key("3:open")


@pytest.mark.parametrize("text", ["", "1", "1:", ":2", "a:2", "1:closed", "1:2:3", "-1:2", "1:-2"])
def test_anything_else_is_not_a_key(text: str) -> None:
    with pytest.raises(ValueError):
        parse_key(text)
    assert not is_conversation_key(text)


def test_command_ids_name_their_run() -> None:
    assert route_command_id("1:42", 3, 7) == "1:42:3:7"
    assert run_of_command("1:42:3:7") == 3
    assert run_of_command(sweep_command_id("1:open", 4)) is None


def test_partition_slots_round_trip() -> None:
    assert partition_slot("conversations", 3) == "conversations:3"
    assert parse_partition_slot("sweeps:11") == ("sweeps", 11)


def test_the_partitioner_is_kafkas_default() -> None:
    """A reader of one conversation reads only the partition every writer put it in (aiokafka's partitioner)."""
    from aiokafka.partitioner import DefaultPartitioner

    from schemas.keys import partition_for

    every = list(range(12))
    for account in (1, 2, 17):
        for conversation in range(1, 400, 7):
            key = conversation_key(account, conversation)
            assert partition_for(key, 12) == DefaultPartitioner()(key.encode(), every, every)
    assert partition_for("config", 1) == 0
    with pytest.raises(ValueError):
        partition_for("1:2", 0)
