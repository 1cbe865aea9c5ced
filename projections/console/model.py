"""The operator console's read model: the event log folded into timelines and overview counts (DESIGN §11).

`ConsoleModel.feed` takes the raw records of `<app>.conversations` in offset order, exactly as the audit replay
does, and folds each conversation's records into its `Timeline` (projections/logs/timeline.py: the one model of a
conversation's history, which `audit` prints as text), so what the console shows is what the worker did and what
`audit` says. This module draws that timeline the console's way:

- marks on lanes (webhooks and sweep finds, router steps, timers), each call as a bar (the timeline's `Call`s, a
  re-issue a new call with a higher `attempt`), timer spans (backoffs after a failure, and the next wake-up), and
  the timeline's `DecisionCard`s with the redacted input System One saw;
- overview counts: turns per hour by result, handoff reasons, canned replies, recent turns, and the
  conversations whose runs keep failing (the same rule as the worker's stuck gauge).

Nothing here does I/O or reads a clock: the overview takes "now" as an argument. The log holds only redacted
text (DESIGN §4), and the model keeps no other customer text.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import Literal

from projections.console.overview import RECENT, Ending, Overview, OverviewCounts
from projections.fold import DEFAULT_RETRY_BASE_MS
from projections.logs.timeline import (
    Arrived,
    Decided,
    Entry,
    Opener,
    RunStarted,
    Timeline,
    TimelineReader,
    TurnEnded,
    VersionInForce,
    describe_outcome,
)
from schemas.config import RouterConfig
from schemas.configs import ConfigBook
from schemas.decision import Decision
from schemas.keys import ConversationKey, parse_key
from schemas.records import MARKER_KEY, ForgetRequested, Forgotten, SweepFound, WebhookReceived

MARKER = MARKER_KEY.encode()

RESULTS = ("assigned", "ended", "handed_off", "waited", "dropped", "nothing", "deferred", "retry")

Lane = Literal["webhooks", "router", "timers"]
Tone = Literal["ok", "warn", "bad", "info"]


@dataclass(frozen=True)
class Mark:
    """A point on a lane of the timeline: a webhook, a router step, a timer firing."""

    at_ms: int
    lane: Lane
    label: str
    detail: str = ""
    tone: Tone = "info"
    seq: int = 0  # order of recording, for ties in time


@dataclass(frozen=True)
class TimerSpan:
    """A durable timer: set at `start_ms`, due at `end_ms`."""

    start_ms: int
    end_ms: int
    label: str
    kind: Literal["backoff", "next"]


class ConversationTimeline(Timeline):
    """One conversation's `Timeline`, with the marks and timer spans the console draws of it."""

    @property
    def marks(self) -> list[Mark]:
        return marks_of(self)

    @property
    def timers(self) -> list[TimerSpan]:
        return backoffs_of(self)

    def timer_spans(self) -> list[TimerSpan]:
        return timer_spans_of(self)


def mark_of(entry: Entry) -> Mark | None:
    """The point a timeline entry is on its lane (None: drawn otherwise, as a call's bar)."""
    at, seq = entry.at_ms, entry.seq
    if isinstance(entry, VersionInForce):
        what = "configuration" if entry.first else "configuration changed"
        return Mark(at, "router", f"{what} {entry.version}", "the version in force from here on", seq=seq)
    if isinstance(entry, Arrived):
        event = entry.event
        if isinstance(event, WebhookReceived):
            label = event.event + (f" → {event.transition.status}" if event.transition is not None else "")
            detail = f"delivery {event.delivery_id}" if event.delivery_id else ""
            return Mark(at, "webhooks", label, detail, seq=seq)
        if isinstance(event, SweepFound):
            return Mark(at, "webhooks", "sweep found", f"{event.status} pass", "warn", seq=seq)
        if isinstance(event, ForgetRequested):
            return Mark(at, "router", "forget requested", event.reason, "warn", seq=seq)
        if isinstance(event, Forgotten):
            if event.scope == "text":
                return Mark(at, "router", "text erased", f"{event.reason}: the text so far is erased", seq=seq)
            return Mark(at, "router", "forgotten", f"{event.reason}: text and contact data erased", "warn", seq=seq)
        what = "resume after a partition move" if event.resume else "timer fired"
        return Mark(at, "timers", what, f"due {event.due_ms}", seq=seq)
    if isinstance(entry, RunStarted):
        return Mark(at, "router", f"run {entry.run} started", seq=seq)
    if isinstance(entry, TurnEnded):
        outcome = entry.outcome
        return Mark(at, "router", f"run {outcome.run}: {describe_outcome(outcome)}", "", _tone(outcome.result), seq)
    if isinstance(entry, Decided):
        card = entry.card
        what = "System One decided" if card.source == "System One" else "decision from memo"
        return Mark(at, "router", what, describe_decision_short(card.decision), "ok", seq)
    return None  # a call issued or answered: its bar


def _tone(result: str) -> Tone:
    if result in ("assigned", "ended"):
        return "ok"
    if result in ("handed_off", "dropped"):
        return "warn"
    return "bad" if result == "retry" else "info"


def marks_of(timeline: Timeline) -> list[Mark]:
    return [mark for entry in timeline.entries if (mark := mark_of(entry)) is not None]


def backoffs_of(timeline: Timeline) -> list[TimerSpan]:
    """The backoff after each failed run."""
    spans = []
    for entry in timeline.entries:
        if not isinstance(entry, TurnEnded):
            continue
        o, delay = entry.outcome, entry.outcome.delay_ms
        if o.result == "retry" and delay:
            label = f"backoff {delay / 1000:g} s after failure {o.failures}"
            spans.append(TimerSpan(o.at_ms, o.at_ms + delay, label, "backoff"))
    return spans


def timer_spans_of(timeline: Timeline) -> list[TimerSpan]:
    """The recorded backoffs plus the timer still pending at the end of the log, if any."""
    spans = backoffs_of(timeline)
    due = timeline.next_wakeup_ms
    if due is not None and timeline.last_ms is not None:
        spans.append(TimerSpan(timeline.last_ms, max(due, timeline.last_ms), "next wake-up (pending)", "next"))
    return spans


def describe_decision_short(d: Decision) -> str:
    parts = [f"owner {d.owner or 'unclear'} {d.owner_confidence:.2f}"]
    if d.topic is not None:
        parts.append(f"topic {d.topic} {d.topic_confidence:.2f}")
    parts.append(f"kind {d.kind or 'none'} {d.kind_confidence:.2f}")
    return ", ".join(parts)


class ConsoleModel(TimelineReader):
    """Every conversation's timeline and the overview counts, fed incrementally from the raw log.

    It keeps every timeline in memory: a live console uses it for one conversation, tests for a small log; the
    console process keeps the overview without timelines (`projections.console.overview.OverviewFold`) and builds
    a conversation's timeline with this model when it is asked for (handlers/console/live.py)."""

    def __init__(
        self,
        config: RouterConfig | None = None,
        *,
        retry_base_ms: int = DEFAULT_RETRY_BASE_MS,
        book: ConfigBook | None = None,
        recent: int = RECENT,
        only_key: str | None = None,
        opener: Opener | None = None,
    ) -> None:
        super().__init__(config, retry_base_ms=retry_base_ms, book=book)
        self.only_key = only_key
        self.opener = opener  # opens sealed inputs (issue 32) when the console has the key-encryption key
        self.timelines: dict[str, ConversationTimeline] = {}
        self.counts = OverviewCounts(recent=deque(maxlen=recent))
        self.endings: dict[str, Ending] = {}  # conversation -> its ending so far
        self.version = 0  # bumped on every record applied: lets pollers skip unchanged pages

    @property
    def records(self) -> int:
        return self.counts.records

    def feed(self, value: bytes | None, offset: int, partition: int = 0, key: bytes | None = None) -> str | None:
        """Apply one record of `<app>.conversations`; returns the conversation key it changed, if any.

        A `ConfigApplied` marker switches its partition's configuration; a record that is not a conversation
        event is counted, as the worker dead-letters it."""
        if self.only_key is not None and key is not None and key != self.only_key.encode() and key != MARKER:
            return None
        undecodable = self.scan.undecodable
        event = self.scan.event(value, partition)
        self.version += 1
        if event is None:
            if self.scan.undecodable > undecodable:
                self.counts.records += 1
                self.counts.undecodable += 1
            return None
        self.counts.records += 1
        if self.only_key is not None and event.key != self.only_key:
            return None
        timeline = self.timelines.get(event.key)
        if timeline is None:
            timeline = self.timelines[event.key] = ConversationTimeline(key=event.key, opener=self.opener)
            self.counts.conversations += 1
        replies = timeline.replies_sent
        outcomes = self.fold(timeline, event, offset, partition)
        ending = self.endings.get(event.key, Ending())
        for outcome in outcomes:
            self.counts.count(outcome)
            after = ending.after(outcome)
            self.counts.ended(ending.result, after.result)
            ending = after
        if outcomes:
            self.endings[event.key] = ending
        self.counts.replies_sent += timeline.replies_sent - replies
        return event.key

    def timeline(self, key: str) -> ConversationTimeline | None:
        return self.timelines.get(key)

    def overview(self, now_ms: int, *, hours: int = 24, recent: int = 20) -> Overview:
        return self.counts.overview(now_ms, hours=hours, recent=recent)


def parse_conversation_key(text: str) -> str | None:
    """`"1:42"` (also `"1/42"`, `"1 42"`, with spaces around) as the log's key `"1:42"`; None if it is not one."""
    cleaned = text.strip().replace("/", ":").replace(" ", ":")
    try:
        key = parse_key(cleaned)
    except ValueError:
        return None
    return str(key) if isinstance(key, ConversationKey) else None


CAUSES = {
    "foreign_bot": "the inbox is linked to a system bot or to another account's bot: link this account's agent bot",
    "malformed_page": "a message page from Chatwoot cannot be read",
    "activity_pending": "the status change the turn read expects has not appeared in Chatwoot yet",
}


def describe_cause(reason: str) -> str:
    """A failure reason as a person reads it: a named cause, else "<op> <class> (HTTP <status>)"."""
    if reason in CAUSES:
        return CAUSES[reason]
    for kind in ("missing", "failed", "timeout", "unconfirmed", "no_result"):
        op, sep, rest = reason.partition(f"_{kind}")
        if sep and op:
            status = rest.lstrip("_")
            return f"{op} {kind.replace('_', ' ')}" + (f" (HTTP {status})" if status else "")
    return reason.replace("_", " ")


@dataclass(frozen=True)
class StuckRow:
    key: str
    reason: str
    cause: str
    sources: tuple[str, ...]


def merge_stuck(from_log: dict[str, str], from_workers: list[tuple[str, dict[str, str]]]) -> list[StuckRow]:
    """One row per stuck conversation: the workers' lists (their own view) and the log's, with who saw it."""
    reasons: dict[str, str] = {}
    sources: dict[str, list[str]] = {}
    for source, stuck in from_workers:
        for key, reason in stuck.items():
            reasons.setdefault(key, reason)
            sources.setdefault(key, []).append(source)
    for key, reason in from_log.items():
        reasons.setdefault(key, reason)
        sources.setdefault(key, []).append("log")
    return [
        StuckRow(key, reasons[key], describe_cause(reasons[key]), tuple(sources[key]))
        for key in sorted(reasons, key=_key_order)
    ]


def _key_order(key: str) -> tuple[int, int]:
    try:
        parsed = parse_key(key)
    except ValueError:
        return (0, 0)
    return (parsed.account_id, parsed.conversation_id if isinstance(parsed, ConversationKey) else 0)
