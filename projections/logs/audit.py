"""Audit trails: replay a conversation's event log through the same fold and say what happened (DESIGN §8).

Replaying never executes effects: it re-derives the state, the commands the router issued and the outcome of
each turn from the recorded events alone, so the trail of a conversation is exactly what the live worker did.
The demo report and `chatwoot-router audit` both read trails; `audit --verify` compares replayed states with the
live table.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from projections.fold import DEFAULT_RETRY_BASE_MS, Event, SingleEvent, fold_parts
from projections.logs.scan import conversation_scan
from projections.logs.versions import PartitionVersions
from schemas.config import RouterConfig
from schemas.configs import ConfigBook
from schemas.decision import Decision
from schemas.records import (
    Assign,
    CreateMessage,
    Decide,
    DecideResult,
    EffectCommand,
    EffectOutcome,
    SetLabels,
    SweepFound,
    TimerFired,
    ToggleStatus,
    TurnOutcome,
    WebhookReceived,
)
from schemas.state import ConversationState


@dataclass(frozen=True)
class TrailEntry:
    """One line of a conversation's timeline."""

    at_ms: int
    what: str
    detail: str = ""


@dataclass
class ConversationTrail:
    """Everything an auditor wants to know about one conversation, rebuilt from its events."""

    key: str
    state: ConversationState = field(default_factory=ConversationState)
    entries: list[TrailEntry] = field(default_factory=list)
    outcomes: list[TurnOutcome] = field(default_factory=list)
    inputs: list[str] = field(default_factory=list)
    decisions: list[Decision] = field(default_factory=list)
    labels: tuple[str, ...] | None = None
    replies_sent: int = 0
    events: int = 0
    config_version: str | None = None

    def apply(
        self,
        event: Event,
        offset: int,
        config: RouterConfig,
        *,
        retry_base_ms: int = DEFAULT_RETRY_BASE_MS,
        config_version: str | None = None,
    ) -> list[TurnOutcome]:
        """Fold one record's event into the trail under configuration `config_version`, each part of it
        (`fold_parts`) as its own step; returns its turn outcomes."""
        if offset <= self.state.offset:
            return []
        if config_version is not None and config_version != self.config_version:
            what = "configuration" if self.config_version is None else "configuration changed"
            self.entries.append(TrailEntry(event.at_ms, what, f"version {config_version} in force"))
            self.config_version = config_version
        outcomes: list[TurnOutcome] = []
        parts = fold_parts(
            self.state, event, offset, config, retry_base_ms=retry_base_ms, config_version=config_version
        )
        for part, result in parts:
            self.events += 1
            self._describe_event(part)
            self.state = result.state
            for command in result.commands:
                self._describe_command(command)
            for outcome in result.outcomes:
                self.outcomes.append(outcome)
                self.entries.append(TrailEntry(outcome.at_ms, "turn ended", describe_outcome(outcome)))
            outcomes += result.outcomes
        return outcomes

    def _describe_event(self, event: SingleEvent) -> None:
        if isinstance(event, WebhookReceived):
            detail = event.event
            if event.transition is not None:
                detail += f" (status → {event.transition.status})"
            self.entries.append(TrailEntry(event.at_ms, "webhook", detail))
        elif isinstance(event, SweepFound):
            self.entries.append(TrailEntry(event.at_ms, "sweep found", f"{event.status} pass"))
        elif isinstance(event, TimerFired):
            self.entries.append(TrailEntry(event.at_ms, "timer", "due"))
        else:
            self._describe_effect_outcome(event)

    def _describe_effect_outcome(self, event: EffectOutcome) -> None:
        if event.error is not None:
            status = f" HTTP {event.error.status}" if event.error.status is not None else ""
            self.entries.append(TrailEntry(event.at_ms, f"{event.op} failed", f"{event.error.kind}{status}"))
            return
        if isinstance(event.result, DecideResult):
            d = event.result.decision
            self.decisions.append(d)
            self.entries.append(TrailEntry(event.at_ms, "Jev decided", describe_decision(d)))
        else:
            self.entries.append(TrailEntry(event.at_ms, f"{event.op} ok", f"{event.requests} request(s)"))

    def _describe_command(self, command: EffectCommand) -> None:
        params = command.params
        detail = ""
        if isinstance(params, Decide):
            self.inputs.append(params.text)
            detail = f"input {params.input_key}"
        elif isinstance(params, SetLabels):
            self.labels = params.labels
            detail = ", ".join(params.labels)
        elif isinstance(params, ToggleStatus):
            detail = f"status → {params.status}"
        elif isinstance(params, Assign):
            detail = f"user {params.assignee_id}"
        elif isinstance(params, CreateMessage):
            self.replies_sent += 1
            detail = "canned reply"
        self.entries.append(TrailEntry(command.at_ms, f"→ {params.op}", detail))


class LogReplay:
    """Every conversation's trail, rebuilt from the raw records of `<app>.conversations` in offset order.

    With a `book` (the documents of `<app>.configs`), each partition is folded under the version its last
    `ConfigApplied` marker named, exactly as the worker did (DESIGN §8); without one, under `config`.
    """

    def __init__(
        self,
        config: RouterConfig | None = None,
        *,
        retry_base_ms: int = DEFAULT_RETRY_BASE_MS,
        book: ConfigBook | None = None,
    ) -> None:
        self.config = config
        self.retry_base_ms = retry_base_ms
        self.book = book if book is not None and len(book) else None
        if self.config is None and self.book is None:
            raise ValueError("a replay needs a configuration or the applied configuration versions")
        self.scan = conversation_scan(self.book or ConfigBook())
        self.trails: dict[str, ConversationTrail] = {}

    @property
    def versions(self) -> PartitionVersions:
        return self.scan.versions

    @property
    def undecodable(self) -> int:
        return self.scan.undecodable

    def feed(self, value: bytes | None, offset: int, partition: int = 0) -> None:
        """Apply one record of `partition` (`LogScan`: a marker switches the partition's configuration, a record
        that is not a conversation event is counted, as the worker dead-letters it)."""
        event = self.scan.event(value, partition)
        if event is None:
            return
        trail = self.trails.setdefault(event.key, ConversationTrail(key=event.key))
        document = self.scan.document(partition)
        if document is None:
            assert self.config is not None
            trail.apply(event, offset, self.config, retry_base_ms=self.retry_base_ms)
        else:
            trail.apply(
                event,
                offset,
                document.config,
                retry_base_ms=document.fold.retry_base_ms,
                config_version=document.version,
            )

    def trail(self, key: str) -> ConversationTrail:
        return self.trails.get(key) or ConversationTrail(key=key)


def describe_decision(d: Decision) -> str:
    parts = [
        f"owner={d.owner or 'unclear'} ({d.owner_confidence:.2f})",
        f"topic={d.topic} ({d.topic_confidence:.2f})" if d.topic is not None else "",
        f"kind={d.kind or 'none'} ({d.kind_confidence:.2f})",
        f"request={'none' if d.no_request else 'yes'}",
    ]
    return ", ".join(p for p in parts if p)


def describe_outcome(o: TurnOutcome) -> str:
    if o.result == "assigned":
        return f"assigned to user {o.assignee_id}"
    if o.result == "ended":
        return f"ended with status {o.status}"
    if o.result == "handed_off":
        return f"handed off ({o.reason})"
    if o.result == "retry":
        return f"failed, will retry ({o.reason})"
    return f"{o.result}" + (f" ({o.reason})" if o.reason else "")


def render_text(trail: ConversationTrail) -> str:
    """A plain-text timeline: one line per entry, times in seconds since the first event."""
    if not trail.entries:
        return f"conversation {trail.key}: no events\n"
    start = trail.entries[0].at_ms
    lines = [f"conversation {trail.key} ({trail.events} events)"]
    for entry in trail.entries:
        lines.append(f"  +{(entry.at_ms - start) / 1000:8.3f}s  {entry.what:<24} {entry.detail}".rstrip())
    return "\n".join(lines) + "\n"
