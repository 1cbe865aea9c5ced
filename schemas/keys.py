"""The keys of the router's records and tables, built and parsed here only (DESIGN §4).

Every conversation-keyed topic and table uses "acct:conv" (both numbers); the sweep topic and its state use
"acct:status"; a command id is "<key>:<run>:<step>" (route runs) or "<key>:<page>" (sweep pages). Kafka
partitions by the key's bytes, so the text form is part of the contract and never changes.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from typing import Literal

SweepStatus = Literal["pending", "open"]
SWEEP_STATUSES: tuple[SweepStatus, ...] = ("pending", "open")


@dataclass(frozen=True, slots=True)
class ConversationKey:
    """One conversation: the key of its events, commands, state, timers and reply attempts."""

    account_id: int
    conversation_id: int

    def __str__(self) -> str:
        return f"{self.account_id}:{self.conversation_id}"


@dataclass(frozen=True, slots=True)
class SweepKey:
    """One sweep pass (an account and the status it lists)."""

    account_id: int
    status: SweepStatus

    def __str__(self) -> str:
        return f"{self.account_id}:{self.status}"


# the fold builds the key of every record it folds: the conversations in flight repeat
@lru_cache(maxsize=4096, typed=True)
def conversation_key(account_id: int, conversation_id: int) -> str:
    """The partition key shared by every conversation-keyed topic."""
    return str(ConversationKey(account_id, conversation_id))


def parse_key(key: str) -> ConversationKey | SweepKey:
    """The typed form of a record or table key; ValueError for anything else."""
    account, sep, rest = key.partition(":")
    if not sep or not account.isdigit():
        raise ValueError(f"not a router key: {key!r}")
    if rest.isdigit():
        return ConversationKey(int(account), int(rest))
    if rest in SWEEP_STATUSES:
        return SweepKey(int(account), rest)
    raise ValueError(f"not a router key: {key!r}")


# the fold parses every record's key (a ValueError is not kept: it is raised again each time)
@lru_cache(maxsize=4096, typed=True)
def conversation_key_of(key: str) -> ConversationKey:
    """The typed form of a conversation key; ValueError for anything else (a sweep key included)."""
    parsed = parse_key(key)
    if not isinstance(parsed, ConversationKey):
        raise ValueError(f"not a conversation key: {key!r}")
    return parsed


def is_conversation_key(key: str) -> bool:
    """Whether `key` names a conversation ("acct:conv") rather than a sweep ("acct:open")."""
    try:
        return isinstance(parse_key(key), ConversationKey)
    except ValueError:
        return False


def route_command_id(key: str, run: int, step: int) -> str:
    """The id of a route run's step: unique per conversation, so an outcome names the step it answers."""
    return f"{key}:{run}:{step}"


def sweep_command_id(key: str, page_command: int) -> str:
    return f"{key}:{page_command}"


def run_of_command(command_id: str) -> int | None:
    """The run number a route command id names; None for a sweep page's id."""
    parts = command_id.split(":")
    return int(parts[2]) if len(parts) == 4 and parts[2].isdigit() else None


def partition_slot(topic: str, partition: int) -> str:
    """The `partition_configs` key of a source partition ("conversations:3")."""
    return f"{topic}:{partition}"


def parse_partition_slot(slot: str) -> tuple[str, int]:
    topic, _, partition = slot.rpartition(":")
    return topic, int(partition)


def _murmur2(data: bytes) -> int:
    """Kafka's murmur2 hash (the Java client's `Utils.murmur2`), 32 bits unsigned."""
    mask, m = 0xFFFFFFFF, 0x5BD1E995
    h = (0x9747B28C ^ len(data)) & mask
    whole = len(data) - len(data) % 4
    for i in range(0, whole, 4):
        k = int.from_bytes(data[i : i + 4], "little")
        k = (k * m) & mask
        k ^= k >> 24
        k = (k * m) & mask
        h = ((h * m) & mask) ^ k
    tail = data[whole:]
    if tail:
        for index in range(len(tail) - 1, -1, -1):
            h ^= tail[index] << (8 * index)
        h = (h * m) & mask
    h ^= h >> 13
    h = (h * m) & mask
    h ^= h >> 15
    return h


def partition_for(key: str, partitions: int) -> int:
    """The partition Kafka's default partitioner gives `key` on a topic of `partitions` (every writer of the
    router's topics uses it: the ingress, the workers, `config apply`), so a reader of one conversation reads only
    that partition."""
    if partitions < 1:
        raise ValueError("a topic has at least one partition")
    return (_murmur2(key.encode()) & 0x7FFFFFFF) % partitions
