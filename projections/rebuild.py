"""Rebuilding the router's tables from its event log with the current fold (DESIGN §8 `replay state`).

Pure: it is fed the records of `<app>.conversations` and `<app>.sweeps` (each partition in offset order) and
gives the table values a worker would hold after folding them: conversation and sweep states (their due times
included), the keys that have a due time and the configuration version of each partition. No effect is
executed and no command is kept: the rebuilt state is what a worker starts from; a run that was waiting for an
outcome was issued by no live process, so the first worker resumes it at once (its read or idempotent
mutation, never a reply).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from projections.fold import fold_under, wakeup_of
from projections.sweep import fold_sweep, sweep_wakeup
from projections.versions import PartitionVersions
from schemas.codec import Undecodable, decode_conversation_event, decode_sweep_event
from schemas.configs import ConfigBook
from schemas.keys import parse_partition_slot
from schemas.state import ConversationState, SweepState


@dataclass
class TableBuilder:
    """Folds an event log into table values; `undecodable` counts what a worker would have dead-lettered."""

    book: ConfigBook
    states: dict[str, ConversationState] = field(default_factory=dict)
    sweep_states: dict[str, SweepState] = field(default_factory=dict)
    partition_of: dict[str, int] = field(default_factory=dict)
    records: int = 0
    undecodable: int = 0
    switches: PartitionVersions = field(init=False)

    def __post_init__(self) -> None:
        self.switches = PartitionVersions(self.book)

    def feed_conversation(self, value: bytes | None, partition: int, offset: int) -> None:
        self.records += 1
        if self.switches.switch(value, partition, "conversations"):
            return
        try:
            event = decode_conversation_event(value)
        except Undecodable:
            self.undecodable += 1
            return
        document = self.switches.document(partition, "conversations")
        assert document is not None, "a book with at least one version"
        state = self.states.get(event.key, ConversationState())
        result = fold_under(document, state, event, offset)
        self.states[event.key] = result.state
        self.partition_of[event.key] = partition

    def feed_sweep(self, value: bytes | None, partition: int, offset: int) -> None:
        self.records += 1
        if self.switches.switch(value, partition, "sweeps"):
            return
        try:
            event = decode_sweep_event(value)
        except Undecodable:
            self.undecodable += 1
            return
        document = self.switches.document(partition, "sweeps")
        assert document is not None, "a book with at least one version"
        state = self.sweep_states.get(event.key, SweepState())
        result = fold_sweep(state, event, offset, document.config, retry_base_ms=document.fold.retry_base_ms)
        self.sweep_states[event.key] = result.state
        self.partition_of[event.key] = partition

    def runs_in_flight(self) -> int:
        return sum(1 for s in self.states.values() if s.run is not None)

    def tables(self) -> dict[str, dict[str, tuple[int, Any]]]:
        """Table name -> key -> (partition, JSON value), as the worker's tables hold them."""
        timers: dict[str, tuple[int, Any]] = {}
        for key, state in self.states.items():
            if wakeup_of(state) is not None:
                timers[key] = (self.partition_of[key], {"p": self.partition_of[key]})
        for key, sweep in self.sweep_states.items():
            if sweep_wakeup(sweep) is not None:
                timers[key] = (self.partition_of[key], {"p": self.partition_of[key]})
        versions = {slot: (parse_partition_slot(slot)[1], version) for slot, version in self.switches.slots.items()}
        return {
            "conversation_state": {
                k: (self.partition_of[k], s.model_dump(mode="json")) for k, s in self.states.items()
            },
            "sweep_state": {k: (self.partition_of[k], s.model_dump(mode="json")) for k, s in self.sweep_states.items()},
            "timers": timers,
            "partition_configs": versions,
        }
