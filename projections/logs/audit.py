"""Audit trails: replay a conversation's event log through the same fold and say what happened (DESIGN §8).

Replaying never executes effects: it re-derives the state, the commands the router issued and the outcome of
each turn from the recorded events alone, so the trail of a conversation is exactly what the live worker did.
The demo report and `chatwoot-router audit` both read trails; `audit --verify` compares replayed states with the
live table. A trail is `audit`'s view of the conversation's `Timeline` (projections/logs/timeline.py), the model
the console draws its page from: the text says the same entries as lines.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from projections.fold import DEFAULT_RETRY_BASE_MS
from projections.logs.timeline import (
    Answered,
    Arrived,
    Entry,
    Issued,
    Opener,
    Timeline,
    TimelineReader,
    TurnEnded,
    VersionInForce,
    describe_outcome,
    waited,
)
from schemas.config import RouterConfig
from schemas.configs import ConfigBook
from schemas.decision import Decision
from schemas.records import ForgetRequested, Forgotten, SweepFound, TimerFired, TurnOutcome, WebhookReceived
from schemas.state import ConversationState


@dataclass(frozen=True)
class TrailEntry:
    """One line of a conversation's timeline."""

    at_ms: int
    what: str
    detail: str = ""


@dataclass
class ConversationTrail:
    """Everything an auditor wants to know about one conversation, rebuilt from its events: `audit`'s view of its
    `Timeline` (projections/logs/timeline.py), which the console's page of it is drawn from too."""

    key: str
    timeline: Timeline = field(init=False)

    def __post_init__(self) -> None:
        self.timeline = Timeline(key=self.key)

    @property
    def state(self) -> ConversationState:
        return self.timeline.state

    @property
    def outcomes(self) -> list[TurnOutcome]:
        return self.timeline.outcomes

    @property
    def labels(self) -> tuple[str, ...] | None:
        return self.timeline.labels

    @property
    def replies_sent(self) -> int:
        return self.timeline.replies_sent

    @property
    def events(self) -> int:
        return self.timeline.events

    @property
    def inputs(self) -> list[str]:
        """The redacted texts sent to System One, in the order they were sent."""
        return list(self.timeline.inputs.values())

    @property
    def decisions(self) -> list[Decision]:
        """System One's answers, in the order they came."""
        return [e.decision for e in self.timeline.entries if isinstance(e, Answered) and e.decision is not None]

    @property
    def entries(self) -> list[TrailEntry]:
        """The timeline as lines: what arrived, each call's answer, each command, each ended turn."""
        return [line for entry in self.timeline.entries if (line := trail_line(entry)) is not None]


def trail_line(entry: Entry) -> TrailEntry | None:
    """The line `audit` prints for a timeline entry (None: an entry the text leaves to the console's page)."""
    if isinstance(entry, VersionInForce):
        what = "configuration" if entry.first else "configuration changed"
        return TrailEntry(entry.at_ms, what, f"version {entry.version} in force")
    if isinstance(entry, Arrived):
        return _arrived(entry.at_ms, entry.event)
    if isinstance(entry, Answered):
        call = entry.call
        throttled = (
            f", waited {waited(call.rate_wait_ms)} for Chatwoot's rate limit" if call.rate_wait_ms >= 1000 else ""
        )
        if call.result != "ok":
            status = f" HTTP {call.status}" if call.status is not None else ""
            return TrailEntry(entry.at_ms, f"{call.op} failed", f"{call.result}{status}{throttled}")
        if entry.decision is not None:
            return TrailEntry(entry.at_ms, "Jev decided", describe_decision(entry.decision))
        return TrailEntry(entry.at_ms, f"{call.op} ok", f"{call.requests} request(s){throttled}")
    if isinstance(entry, Issued):
        return TrailEntry(entry.at_ms, f"→ {entry.call.op}", entry.call.detail)
    if isinstance(entry, TurnEnded):
        return TrailEntry(entry.outcome.at_ms, "turn ended", describe_outcome(entry.outcome))
    return None  # a run started, a decision taken: the console's page shows them


def _arrived(at_ms: int, event: WebhookReceived | SweepFound | TimerFired | ForgetRequested | Forgotten) -> TrailEntry:
    if isinstance(event, ForgetRequested):
        return TrailEntry(at_ms, "forget requested", event.reason)
    if isinstance(event, Forgotten) and event.scope == "text":
        return TrailEntry(at_ms, "text erased", f"{event.reason}; its text so far is erased, its decisions kept")
    if isinstance(event, Forgotten):
        return TrailEntry(at_ms, "forgotten", f"{event.reason}; its text and contact data are erased (issue 32)")
    if isinstance(event, WebhookReceived):
        detail = event.event
        if event.transition is not None:
            detail += f" (status → {event.transition.status})"
        return TrailEntry(at_ms, "webhook", detail)
    if isinstance(event, SweepFound):
        return TrailEntry(at_ms, "sweep found", f"{event.status} pass")
    return TrailEntry(at_ms, "timer", "due")


class LogReplay(TimelineReader):
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
        opener: Opener | None = None,
    ) -> None:
        super().__init__(config, retry_base_ms=retry_base_ms, book=book)
        self.trails: dict[str, ConversationTrail] = {}
        self.opener = opener  # opens sealed inputs (issue 32) for a reader with the key-encryption key

    def feed(self, value: bytes | None, offset: int, partition: int = 0) -> None:
        """Apply one record of `partition` (`LogScan`: a marker switches the partition's configuration, a record
        that is not a conversation event is counted, as the worker dead-letters it)."""
        event = self.scan.event(value, partition)
        if event is None:
            return
        trail = self.trails.get(event.key)
        if trail is None:
            trail = self.trails[event.key] = ConversationTrail(key=event.key)
            trail.timeline.opener = self.opener
        self.fold(trail.timeline, event, offset, partition)

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


def render_text(trail: ConversationTrail) -> str:
    """A plain-text timeline: one line per entry, times in seconds since the first event."""
    entries = trail.entries
    if not entries:
        return f"conversation {trail.key}: no events\n"
    start = entries[0].at_ms
    lines = [f"conversation {trail.key} ({trail.events} events)"]
    for entry in entries:
        lines.append(f"  +{(entry.at_ms - start) / 1000:8.3f}s  {entry.what:<24} {entry.detail}".rstrip())
    return "\n".join(lines) + "\n"
