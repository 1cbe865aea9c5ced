"""Rebuilding the router's tables from its event log with the current fold (DESIGN §8 `replay state`).

Pure: it is fed the records of `<app>.conversations` and `<app>.sweeps` (each partition in offset order) and
gives the table values a worker would hold after folding them: conversation and sweep states (their due times
included), the keys that have a due time and the configuration version of each partition. No effect is
executed and no command is kept: the rebuilt state is what a worker starts from; a run that was waiting for an
outcome was issued by no live process, so the first worker resumes it at once (its read or idempotent
mutation, never a reply).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from projections.fold import fold, fold_under, wakeup_of
from projections.logs.scan import LogScan, conversation_scan, sweep_scan
from projections.sweep import fold_sweep, sweep_wakeup
from schemas.config import RouterConfig
from schemas.configs import ConfigBook
from schemas.keys import parse_partition_slot
from schemas.records import ConversationEvent, SweepEvent
from schemas.state import ConversationState, SweepState


@dataclass
class TableBuilder:
    """Folds an event log into table values; `undecodable` counts what a worker would have dead-lettered.

    `replay state` makes one per partition (the states of one partition, never of the topic, are in memory)."""

    book: ConfigBook
    legacy: tuple[RouterConfig, int] | None = None  # a log from before configurations were events: (config, retry base)
    states: dict[str, ConversationState] = field(default_factory=dict)
    sweep_states: dict[str, SweepState] = field(default_factory=dict)
    partition_of: dict[str, int] = field(default_factory=dict)
    conversations: LogScan[ConversationEvent] = field(init=False)
    sweeps: LogScan[SweepEvent] = field(init=False)

    def __post_init__(self) -> None:
        self.conversations = conversation_scan(self.book)
        self.sweeps = sweep_scan(self.book)

    @property
    def records(self) -> int:
        return self.conversations.records + self.sweeps.records

    @property
    def undecodable(self) -> int:
        return self.conversations.undecodable + self.sweeps.undecodable

    def feed_conversation(self, value: bytes | None, partition: int, offset: int) -> None:
        event = self.conversations.event(value, partition)
        if event is None:
            return
        document = self.conversations.document(partition)
        state = self.states.get(event.key, ConversationState())
        if document is None:
            assert self.legacy is not None, "a book with at least one version, or the legacy configuration"
            config, retry_base_ms = self.legacy
            result = fold(state, event, offset, config, retry_base_ms=retry_base_ms)
        else:
            result = fold_under(document, state, event, offset)
        self.states[event.key] = result.state
        self.partition_of[event.key] = partition

    def feed_sweep(self, value: bytes | None, partition: int, offset: int) -> None:
        event = self.sweeps.event(value, partition)
        if event is None:
            return
        document = self.sweeps.document(partition)
        assert document is not None, "a book with at least one version"
        state = self.sweep_states.get(event.key, SweepState())
        result = fold_sweep(state, event, offset, document.config, retry_base_ms=document.fold.retry_base_ms)
        self.sweep_states[event.key] = result.state
        self.partition_of[event.key] = partition

    def runs_in_flight(self) -> int:
        return sum(1 for s in self.states.values() if s.run is not None)

    def tables(self) -> dict[str, dict[str, tuple[int, Any]]]:
        """Table name -> key -> (partition, JSON value), as the worker's tables hold them."""
        return {
            "conversation_state": {
                k: (self.partition_of[k], s.model_dump(mode="json")) for k, s in self.states.items()
            },
            "sweep_state": {k: (self.partition_of[k], s.model_dump(mode="json")) for k, s in self.sweep_states.items()},
            "timers": self._timers(),
            "partition_configs": self._versions(),
        }

    def encoded_tables(self) -> dict[str, list[tuple[bytes, int, bytes]]]:
        """`tables()` as changelog records, (JSON key, partition, JSON value), the way Faust writes them."""

        def rows(values: dict[str, tuple[int, Any]]) -> list[tuple[bytes, int, bytes]]:
            return [(changelog_key(k), p, json.dumps(v).encode()) for k, (p, v) in values.items()]

        return {
            "conversation_state": [
                (changelog_key(k), self.partition_of[k], s.model_dump_json().encode()) for k, s in self.states.items()
            ],
            "sweep_state": [
                (changelog_key(k), self.partition_of[k], s.model_dump_json().encode())
                for k, s in self.sweep_states.items()
            ],
            "timers": rows(self._timers()),
            "partition_configs": rows(self._versions()),
        }

    def _timers(self) -> dict[str, tuple[int, Any]]:
        timers: dict[str, tuple[int, Any]] = {}
        for key, state in self.states.items():
            if wakeup_of(state) is not None:
                timers[key] = (self.partition_of[key], {"p": self.partition_of[key]})
        for key, sweep in self.sweep_states.items():
            if sweep_wakeup(sweep) is not None:
                timers[key] = (self.partition_of[key], {"p": self.partition_of[key]})
        return timers

    def _versions(self) -> dict[str, tuple[int, Any]]:
        slots = {**self.conversations.versions.slots, **self.sweeps.versions.slots}
        return {slot: (parse_partition_slot(slot)[1], version) for slot, version in slots.items()}


def changelog_key(key: str) -> bytes:
    """A table key as Faust writes it to the changelog: a JSON string."""
    return json.dumps(key).encode()
