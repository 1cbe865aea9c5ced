"""The operator console's read model: the event log folded into timelines and overview counts (DESIGN §11).

`ConsoleModel.feed` takes the raw records of `<app>.conversations` in offset order, exactly as the audit replay
does, and runs each conversation's events through the worker's own fold (`projections.fold.fold`), so what the
console shows is what the worker did. From each fold step it keeps what a person wants to see:

- a `ConversationTimeline` per conversation: points on lanes (webhooks and sweep finds, router steps, timers),
  one `Call` per command the router issued (a re-issue is a new call with a higher `attempt`), timer spans
  (backoffs after a failure, and the next wake-up), and a `DecisionCard` per decided run with the redacted input
  System One saw;
- overview counts: turns per hour by result, handoff reasons, canned replies, recent turns, and the
  conversations whose runs keep failing (the same rule as the worker's stuck gauge).

Nothing here does I/O or reads a clock: the overview takes "now" as an argument. The log holds only redacted
text (DESIGN §4), and the model keeps no other customer text.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field, replace
from typing import Literal

from projections.console.overview import (
    QUIET_RESULTS,
    RECENT,
    Ending,
    Overview,
    OverviewCounts,
)
from projections.fold import DEFAULT_RETRY_BASE_MS, Event, FoldResult, SingleEvent, fold_parts, wakeup_of
from projections.inputs import build_input
from projections.logs.audit import describe_outcome
from projections.logs.scan import conversation_scan
from projections.logs.versions import PartitionVersions
from schemas.config import RouterConfig
from schemas.configs import ConfigBook, ConfigDocument, FoldSettings
from schemas.decision import Decision
from schemas.keys import ConversationKey, parse_key, run_of_command
from schemas.records import (
    MARKER_KEY,
    Assign,
    CreateMessage,
    Decide,
    DecideResult,
    EffectCommand,
    EffectOutcome,
    GetInboxBot,
    ListCanned,
    ScanReplyHistory,
    SetLabels,
    SweepFound,
    TimerFired,
    ToggleStatus,
    TurnOutcome,
    WebhookReceived,
    parse_marker,
)
from schemas.state import ConversationState, Run

MARKER = MARKER_KEY.encode()

RESULTS = ("assigned", "ended", "handed_off", "waited", "dropped", "nothing", "deferred", "retry")

Lane = Literal["webhooks", "router", "timers"]
Tone = Literal["ok", "warn", "bad", "info"]
SYSTEM_ONE_OPS = ("decide",)


@dataclass(frozen=True)
class Mark:
    """A point on a lane of the timeline: a webhook, a router step, a timer firing."""

    at_ms: int
    lane: Lane
    label: str
    detail: str = ""
    tone: Tone = "info"
    seq: int = 0  # order of recording, for ties in time


@dataclass
class Call:
    """One outbound call the router issued and what became of it (`result` "pending" until its outcome)."""

    command_id: str
    op: str
    detail: str
    run: int
    attempt: int
    issued_ms: int
    ended_ms: int | None = None
    result: str = "pending"  # ok | missing | failed | timeout | unconfirmed | overdue | pending
    status: int | None = None
    reason: str | None = None
    requests: int = 0
    ignored: bool = False  # its outcome came when the run no longer waited for it
    seq: int = 0

    @property
    def target(self) -> str:
        return "System One" if self.op in SYSTEM_ONE_OPS else "Chatwoot"

    @property
    def duration_ms(self) -> int | None:
        return None if self.ended_ms is None else max(0, self.ended_ms - self.issued_ms)

    @property
    def summary(self) -> str:
        """e.g. "ok", "failed HTTP 503", "pending"."""
        text = self.result
        if self.status is not None:
            text += f" HTTP {self.status}"
        if self.reason:
            text += f" ({self.reason})"
        if self.ignored:
            text += ", ignored: the run had moved on"
        return text


@dataclass(frozen=True)
class TimerSpan:
    """A durable timer: set at `start_ms`, due at `end_ms`."""

    start_ms: int
    end_ms: int
    label: str
    kind: Literal["backoff", "next"]


@dataclass(frozen=True)
class DecisionCard:
    """What System One answered for one run, on which redacted input, and what the rules made of it."""

    run: int
    at_ms: int
    decision: Decision
    source: Literal["System One", "memo"]
    input_key: str | None
    input_text: str
    min_confidence: float
    kind: str | None = None  # the actionable kind the rules took, if any
    assignee: int | None = None  # the confident owner's user id, if any


@dataclass
class ConversationTimeline:
    """One conversation's replayed history, in the shapes the console draws."""

    key: str
    state: ConversationState = field(default_factory=ConversationState)
    marks: list[Mark] = field(default_factory=list)
    calls: list[Call] = field(default_factory=list)
    timers: list[TimerSpan] = field(default_factory=list)
    decisions: list[DecisionCard] = field(default_factory=list)
    outcomes: list[TurnOutcome] = field(default_factory=list)
    labels: tuple[str, ...] | None = None
    inputs: dict[str, str] = field(default_factory=dict)  # decide command id -> the redacted text it carried
    replies_sent: int = 0
    events: int = 0
    first_ms: int | None = None
    last_ms: int | None = None
    config_versions: list[str] = field(default_factory=list)  # every version it was folded under, in order
    seq: int = 0

    def apply(
        self,
        event: Event,
        offset: int,
        config: RouterConfig,
        *,
        retry_base_ms: int = DEFAULT_RETRY_BASE_MS,
        config_version: str | None = None,
    ) -> list[TurnOutcome]:
        """Fold one record's event under configuration `config_version` and record what it did, each part of it
        (`fold_parts`) as its own step; an offset already applied changes nothing."""
        if offset <= self.state.offset:
            return []
        outcomes: list[TurnOutcome] = []
        parts = fold_parts(
            self.state, event, offset, config, retry_base_ms=retry_base_ms, config_version=config_version
        )
        for part, result in parts:
            outcomes += self._record_part(part, result, config, config_version)
        return outcomes

    def _record_part(
        self, event: SingleEvent, result: FoldResult, config: RouterConfig, config_version: str | None
    ) -> list[TurnOutcome]:
        before = self.state
        self.state = result.state
        self.events += 1
        self._seen(event.at_ms)
        if config_version is not None and config_version not in self.config_versions[-1:]:
            what = "configuration" if not self.config_versions else "configuration changed"
            self._mark(Mark(event.at_ms, "router", f"{what} {config_version}", "the version in force from here on"))
            self.config_versions.append(config_version)
        self._event(event, before)
        started = result.state.runs if result.state.runs > before.runs else None
        for outcome in result.outcomes:  # a run that ends here, and perhaps the next one that starts at once
            if outcome.run == started:
                self._mark(Mark(event.at_ms, "router", f"run {started} started"))
                started = None
            self._ended(outcome)
        if started is not None:
            self._mark(Mark(event.at_ms, "router", f"run {started} started"))
        self._decision(event, before, result.state, config)
        for command in result.commands:
            self._issued(command)
        return result.outcomes

    # --- what each fold step did ---

    def _mark(self, mark: Mark) -> None:
        self.marks.append(replace(mark, seq=self._next_seq()))

    def _next_seq(self) -> int:
        self.seq += 1
        return self.seq

    def _seen(self, at_ms: int) -> None:
        self.first_ms = at_ms if self.first_ms is None else min(self.first_ms, at_ms)
        self.last_ms = at_ms if self.last_ms is None else max(self.last_ms, at_ms)

    def _event(self, event: SingleEvent, before: ConversationState) -> None:
        if isinstance(event, WebhookReceived):
            label = event.event + (f" → {event.transition.status}" if event.transition is not None else "")
            detail = f"delivery {event.delivery_id}" if event.delivery_id else ""
            self._mark(Mark(event.at_ms, "webhooks", label, detail))
        elif isinstance(event, SweepFound):
            self._mark(Mark(event.at_ms, "webhooks", "sweep found", f"{event.status} pass", "warn"))
        elif isinstance(event, TimerFired):
            what = "resume after a partition move" if event.resume else "timer fired"
            self._mark(Mark(event.at_ms, "timers", what, f"due {event.due_ms}"))
        else:
            self._outcome(event, before)

    def _outcome(self, event: EffectOutcome, before: ConversationState) -> None:
        run = before.run
        awaited = run is not None and run.pending is not None and run.pending.command_id == event.command_id
        call = next((c for c in reversed(self.calls) if c.command_id == event.command_id and c.ended_ms is None), None)
        if call is None:  # a late duplicate of a call already closed: show it, it did nothing
            call = Call(event.command_id, event.op, "late duplicate outcome", _run_of(event.command_id), 0, event.at_ms)
            call.seq = self._next_seq()
            self.calls.append(call)
        call.ended_ms = event.at_ms
        call.requests = event.requests
        call.ignored = not awaited
        if event.error is not None:
            call.result, call.status, call.reason = event.error.kind, event.error.status, event.error.code
        else:
            call.result = "ok"
            if event.op == "create_message" and awaited:
                self.replies_sent += 1

    def _issued(self, command: EffectCommand) -> None:
        earlier = [c for c in self.calls if c.command_id == command.command_id]
        for stale in earlier:
            if stale.ended_ms is None:  # re-issued because no outcome came by the deadline
                stale.ended_ms, stale.result = command.at_ms, "overdue"
        params = command.params
        if isinstance(params, SetLabels):
            self.labels = params.labels
        elif isinstance(params, Decide):
            self.inputs[command.command_id] = params.text
        self.calls.append(
            Call(
                command.command_id,
                params.op,
                describe_params(command),
                _run_of(command.command_id),
                len(earlier) + 1,
                command.at_ms,
                seq=self._next_seq(),
            )
        )

    def _ended(self, outcome: TurnOutcome) -> None:
        self.outcomes.append(outcome)
        tone: Tone = "ok" if outcome.result in ("assigned", "ended") else "info"
        if outcome.result in ("handed_off", "dropped"):
            tone = "warn"
        if outcome.result == "retry":
            tone = "bad"
        if outcome.result == "handed_off" and outcome.reason == "reply_unconfirmed":
            for call in self.calls:  # the reply's receipt never came: §9.7 hands off instead of sending again
                if call.op == "create_message" and call.ended_ms is None:
                    call.ended_ms, call.result = outcome.at_ms, "overdue"
        self._mark(Mark(outcome.at_ms, "router", f"run {outcome.run}: {describe_outcome(outcome)}", "", tone))
        if outcome.result == "retry" and outcome.delay_ms:
            label = f"backoff {outcome.delay_ms / 1000:g} s after failure {outcome.failures}"
            self.timers.append(TimerSpan(outcome.at_ms, outcome.at_ms + outcome.delay_ms, label, "backoff"))

    def _decision(
        self,
        event: Event,
        before: ConversationState,
        after: ConversationState,
        config: RouterConfig,
    ) -> None:
        run = after.run
        if run is None or run.decision is None:
            return
        previous = before.run
        if previous is not None and previous.number == run.number and previous.decision is not None:
            return  # decided earlier in this run
        from_jev = isinstance(event, EffectOutcome) and isinstance(event.result, DecideResult)
        card = DecisionCard(
            run=run.number,
            at_ms=event.at_ms,
            decision=run.decision,
            source="System One" if from_jev else "memo",
            input_key=run.input_key,
            input_text=self._input_text(run),
            min_confidence=config.routing.min_confidence,
            kind=run.kind,
            assignee=run.assignee,
        )
        self.decisions.append(card)
        what = "System One decided" if from_jev else "decision from memo"
        self._mark(Mark(event.at_ms, "router", what, describe_decision_short(run.decision), "ok"))

    def _input_text(self, run: Run) -> str:
        """The redacted text System One saw: the decide command's, else (a memo hit) rebuilt from the turn read."""
        prefix = f"{self.key}:{run.number}:"
        for command_id, text in reversed(self.inputs.items()):
            if command_id.startswith(prefix):
                return text
        if run.first_turn is not None:
            domain = run.current.email_domain if run.current is not None else None
            return build_input(run.first_turn.messages, domain).text
        return ""

    # --- derived views ---

    @property
    def ending(self) -> TurnOutcome | None:
        """The outcome that tells what happened: the last one that did something, else the last one."""
        for outcome in reversed(self.outcomes):
            if outcome.result not in QUIET_RESULTS:
                return outcome
        return self.outcomes[-1] if self.outcomes else None

    @property
    def next_wakeup_ms(self) -> int | None:
        return wakeup_of(self.state)

    def timer_spans(self) -> list[TimerSpan]:
        """The recorded backoffs plus the timer still pending at the end of the log, if any."""
        spans = list(self.timers)
        due = self.next_wakeup_ms
        if due is not None and self.last_ms is not None:
            spans.append(TimerSpan(self.last_ms, max(due, self.last_ms), "next wake-up (pending)", "next"))
        return spans


def _run_of(command_id: str) -> int:
    return run_of_command(command_id) or 0


def describe_params(command: EffectCommand) -> str:
    """A short, safe description of a command's parameters (ids and names, never customer text)."""
    p = command.params
    if isinstance(p, Decide):
        return f"input {p.input_key}"
    if isinstance(p, SetLabels):
        return ", ".join(p.labels) or "(no labels)"
    if isinstance(p, ToggleStatus):
        return f"status → {p.status}"
    if isinstance(p, Assign):
        return f"user {p.assignee_id}"
    if isinstance(p, CreateMessage):
        return "canned reply"
    if isinstance(p, ListCanned):
        return f"short code {p.short_code}"
    if isinstance(p, GetInboxBot):
        return f"inbox {p.inbox_id}"
    if isinstance(p, ScanReplyHistory):
        return f"bot {p.bot_id}"
    return ""


def describe_decision_short(d: Decision) -> str:
    parts = [f"owner {d.owner or 'unclear'} {d.owner_confidence:.2f}"]
    if d.topic is not None:
        parts.append(f"topic {d.topic} {d.topic_confidence:.2f}")
    parts.append(f"kind {d.kind or 'none'} {d.kind_confidence:.2f}")
    return ", ".join(parts)


class ConsoleModel:
    """Every conversation's timeline and the overview counts, fed incrementally from the raw log.

    It keeps every timeline in memory: `audit --html` and tests use it for one conversation or a small log; the
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
    ) -> None:
        self.config = config
        self.retry_base_ms = retry_base_ms
        self.book = book if book is not None else ConfigBook()
        if config is None and not len(self.book):
            raise ValueError("the console needs a configuration or the applied configuration versions")
        self.only_key = only_key
        self.scan = conversation_scan(self.book)
        self.timelines: dict[str, ConversationTimeline] = {}
        self.counts = OverviewCounts(recent=deque(maxlen=recent))
        self.endings: dict[str, Ending] = {}  # conversation -> its ending so far
        self.version = 0  # bumped on every record applied: lets pollers skip unchanged pages

    @property
    def versions(self) -> PartitionVersions:
        return self.scan.versions

    @property
    def undecodable(self) -> int:
        return self.scan.undecodable

    @property
    def records(self) -> int:
        return self.counts.records

    def needs_version(self, value: bytes | None) -> str | None:
        """The version a `ConfigApplied` record names when the book lacks it (the caller reads the book first)."""
        marker = parse_marker(value)
        return marker.version if marker is not None and marker.version not in self.book else None

    def add_documents(self, documents: list[ConfigDocument]) -> None:
        self.scan.add_documents(documents)

    def in_force(self, partition: int) -> ConfigDocument:
        """The document a partition's next record is folded under, as the worker does (DESIGN §8)."""
        document = self.scan.document(partition)
        if document is not None:
            return document
        assert self.config is not None
        return ConfigDocument.of(self.config, FoldSettings(retry_base_ms=self.retry_base_ms))

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
            timeline = self.timelines[event.key] = ConversationTimeline(key=event.key)
            self.counts.conversations += 1
        document = self.in_force(partition)
        # a log from before configurations were events is folded as the worker did then: no version recorded
        version = document.version if len(self.book) else None
        replies = timeline.replies_sent
        outcomes = timeline.apply(
            event, offset, document.config, retry_base_ms=document.fold.retry_base_ms, config_version=version
        )
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
