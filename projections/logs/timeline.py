"""A conversation's timeline: the one model `audit` and the console read a conversation's history with (DESIGN §8,
§11).

`Timeline.apply` folds a conversation's records with the worker's own fold, part by part (`fold_parts`), and
says what each fold step meant as entries, in the order they happened: the configuration version that came into
force, what arrived (a webhook, a sweep's find, a timer), the answer to a call, the run that started, the turns
that ended, the decision the run took, the commands issued. Across steps it keeps each command's call and what
became of it (`Call`), each decision with the redacted input System One saw (`DecisionCard`), the labels, the
canned replies sent and the configuration versions in force.

`audit --conversation` prints the entries as lines (projections/logs/audit.py); the console draws them on lanes
and bars (projections/console/model.py, layout.py); `audit --html` draws the console's page from the timeline the
text came from. So what a record means on a timeline is decided here, once, and so is which customer text a
timeline holds: only the input System One saw, redacted (`Timeline.inputs`, `DecisionCard.input_text`).

`TimelineReader` is the log side both readers share: the records of `<app>.conversations` in offset order,
markers switching a partition's configuration as the worker does, records that are not conversation events
counted. Nothing here does I/O or reads a clock.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Literal

from projections.fold import DEFAULT_RETRY_BASE_MS, Event, FoldResult, SingleEvent, fold_parts, wakeup_of
from projections.inputs import ERASED, TEXT_EXPIRED, WITHHELD, decide_command, turn_input
from projections.logs.scan import conversation_scan
from projections.logs.versions import PartitionVersions
from schemas.config import RouterConfig
from schemas.configs import ConfigBook, ConfigDocument, FoldSettings
from schemas.decision import Decision
from schemas.keys import run_of_command
from schemas.records import (
    Assign,
    CreateMessage,
    Decide,
    DecideResult,
    EffectCommand,
    EffectOutcome,
    ForgetRequested,
    Forgotten,
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

Opener = Callable[[str, Decide], str]
"""Opens a sealed System One input for a conversation key: its text, or what the reader shows instead."""

SYSTEM_ONE_OPS = ("decide",)
# results that only confirm, postpone or retry a turn; the others end it
QUIET_RESULTS = ("nothing", "deferred", "retry")


# --- what a timeline is made of ---


def waited(ms: int) -> str:
    """A wait for people: "12 s", "3 min 5 s"."""
    seconds = round(ms / 1000)
    return f"{seconds // 60} min {seconds % 60} s" if seconds >= 60 else f"{seconds} s"


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
    result: str = "pending"  # ok | an error kind (missing, failed, timeout, ...) | overdue | pending
    status: int | None = None
    reason: str | None = None
    requests: int = 0
    ignored: bool = False  # its outcome came when the run no longer waited for it
    seq: int = 0
    rate_wait_ms: int = 0  # how long its requests waited for Chatwoot's rate limit (issue 30)

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
        if self.rate_wait_ms >= 1000:
            text += f", waited {waited(self.rate_wait_ms)} for Chatwoot's rate limit"
        return text


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


@dataclass(frozen=True)
class Entry:
    """One thing that happened to the conversation, at `at_ms`; `seq` orders entries of the same time."""

    at_ms: int
    seq: int


@dataclass(frozen=True)
class VersionInForce(Entry):
    """The configuration version the conversation is folded under from here on (`first`: the first one it met)."""

    version: str
    first: bool


@dataclass(frozen=True)
class Arrived(Entry):
    """A record that came from outside the router's calls: a webhook, a sweep's find, a durable timer."""

    event: WebhookReceived | SweepFound | TimerFired | ForgetRequested | Forgotten


@dataclass(frozen=True)
class Answered(Entry):
    """A call's outcome came back (`call` as it stands once closed by it; a new call for a late duplicate)."""

    call: Call
    decision: Decision | None  # System One's answer, when the outcome is one


@dataclass(frozen=True)
class RunStarted(Entry):
    run: int


@dataclass(frozen=True)
class TurnEnded(Entry):
    outcome: TurnOutcome


@dataclass(frozen=True)
class Decided(Entry):
    """The run took a decision: System One's answer, or one remembered for the same input (`card.source`)."""

    card: DecisionCard


@dataclass(frozen=True)
class Issued(Entry):
    """The fold issued a command (a re-issue after its deadline is the next `call.attempt`)."""

    call: Call


# --- the model ---


@dataclass
class Timeline:
    """One conversation's replayed history: its entries, calls and decisions, and what they add up to."""

    key: str
    state: ConversationState = field(default_factory=ConversationState)
    entries: list[Entry] = field(default_factory=list)
    calls: list[Call] = field(default_factory=list)
    decisions: list[DecisionCard] = field(default_factory=list)
    outcomes: list[TurnOutcome] = field(default_factory=list)
    labels: tuple[str, ...] | None = None
    inputs: dict[str, str] = field(default_factory=dict)  # decide command id -> the redacted text it carried
    replies_sent: int = 0  # canned replies whose sending Chatwoot confirmed to the run that waited for it
    events: int = 0
    first_ms: int | None = None
    last_ms: int | None = None
    config_versions: list[str] = field(default_factory=list)  # every version it was folded under, in order
    seq: int = 0
    # opens a sealed input (issue 32) for a reader that has the key-encryption key; None: shown as withheld
    opener: Opener | None = field(default=None, repr=False, compare=False)

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
        (`fold_parts`) as its own step; returns its turn outcomes. An offset already applied changes nothing."""
        if offset <= self.state.offset:
            return []
        outcomes: list[TurnOutcome] = []
        parts = fold_parts(
            self.state, event, offset, config, retry_base_ms=retry_base_ms, config_version=config_version
        )
        for part, result in parts:
            self._step(part, result, config, config_version)
            outcomes += result.outcomes
        return outcomes

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

    # --- one fold step, in the order things happened ---

    def _step(self, event: SingleEvent, result: FoldResult, config: RouterConfig, config_version: str | None) -> None:
        before = self.state
        self.state = result.state
        self.events += 1
        self._seen(event.at_ms)
        if config_version is not None and config_version not in self.config_versions[-1:]:
            self._add(VersionInForce(event.at_ms, self._next_seq(), config_version, not self.config_versions))
            self.config_versions.append(config_version)
        if isinstance(event, EffectOutcome):
            self._answered(event, before)
        else:
            self._add(Arrived(event.at_ms, self._next_seq(), event))
            if isinstance(event, Forgotten):
                self._erase(whole=event.scope == "conversation")
        started = result.state.runs if result.state.runs > before.runs else None
        for outcome in result.outcomes:  # a run that ends here, and perhaps the next one that starts at once
            if outcome.run == started:
                self._add(RunStarted(event.at_ms, self._next_seq(), started))
                started = None
            self._ended(outcome)
        if started is not None:
            self._add(RunStarted(event.at_ms, self._next_seq(), started))
        self._decision(event, before, result.state, config)
        for command in result.commands:
            self._issued(command)

    def _next_seq(self) -> int:
        self.seq += 1
        return self.seq

    def _add(self, entry: Entry) -> None:
        self.entries.append(entry)

    def _seen(self, at_ms: int) -> None:
        self.first_ms = at_ms if self.first_ms is None else min(self.first_ms, at_ms)
        self.last_ms = at_ms if self.last_ms is None else max(self.last_ms, at_ms)

    def _answered(self, event: EffectOutcome, before: ConversationState) -> None:
        """What an effect's outcome says of its call. This is the one place an outcome becomes timeline facts, for
        `audit` and the console alike: a further fact of the outcome about its call is read here into `Call` (and
        the `Answered` entry), as how long its requests waited for Chatwoot's rate limit (`rate_wait_ms`, shown from
        a second on by `Call.summary`, the console's bar, and by `audit`'s line for the answer, `trail_line`)."""
        run = before.run
        awaited = run is not None and run.pending is not None and run.pending.command_id == event.command_id
        seq = self._next_seq()
        call = next((c for c in reversed(self.calls) if c.command_id == event.command_id and c.ended_ms is None), None)
        if call is None:  # a late duplicate of a call already closed: show it, it did nothing
            call = Call(event.command_id, event.op, "late duplicate outcome", _run_of(event.command_id), 0, event.at_ms)
            call.seq = seq
            self.calls.append(call)
        call.ended_ms = event.at_ms
        call.requests = event.requests
        call.rate_wait_ms = event.rate_wait_ms
        call.ignored = not awaited
        decision = None
        if event.error is not None:
            call.result, call.status, call.reason = event.error.kind, event.error.status, event.error.code
        else:
            call.result = "ok"
            if event.op == "create_message" and awaited:
                self.replies_sent += 1
            if isinstance(event.result, DecideResult):
                decision = event.result.decision
        self._add(Answered(event.at_ms, seq, call, decision))

    def _issued(self, command: EffectCommand) -> None:
        earlier = [c for c in self.calls if c.command_id == command.command_id]
        for stale in earlier:
            if stale.ended_ms is None:  # re-issued because no outcome came by the deadline
                stale.ended_ms, stale.result = command.at_ms, "overdue"
        params = command.params
        if isinstance(params, SetLabels):
            self.labels = params.labels
        elif isinstance(params, Decide):
            self.inputs[command.command_id] = self._opened(params)
        call = Call(
            command.command_id,
            params.op,
            describe_params(command),
            _run_of(command.command_id),
            len(earlier) + 1,
            command.at_ms,
            seq=self._next_seq(),
        )
        self.calls.append(call)
        self._add(Issued(command.at_ms, call.seq, call))

    def _ended(self, outcome: TurnOutcome) -> None:
        self.outcomes.append(outcome)
        if outcome.result == "handed_off" and outcome.reason == "reply_unconfirmed":
            for call in self.calls:  # the reply's receipt never came: §9.7 hands off instead of sending again
                if call.op == "create_message" and call.ended_ms is None:
                    call.ended_ms, call.result = outcome.at_ms, "overdue"
        self._add(TurnEnded(outcome.at_ms, self._next_seq(), outcome))

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
        self._add(Decided(event.at_ms, self._next_seq(), card))

    def _erase(self, *, whole: bool) -> None:
        """The conversation was forgotten (issue 32): what this reader holds of its text goes too, the decisions
        and everything else stay. Only its text so far, when `whole` is False (ROUTER_TEXT_RETENTION_DAYS): what
        comes after is sealed under a new key and opened as before."""
        shown = ERASED if whole else TEXT_EXPIRED
        self.inputs = dict.fromkeys(self.inputs, shown)
        self.decisions = [replace(card, input_text=shown) for card in self.decisions]
        self.entries = [
            replace(entry, card=replace(entry.card, input_text=shown)) if isinstance(entry, Decided) else entry
            for entry in self.entries
        ]
        if whole:
            self.opener = None

    def _opened(self, params: Decide) -> str:
        """The text a decide command carried: in clear (before issue 32), opened by the reader's key, or withheld."""
        if self.state.forgotten_ms is not None:
            return ERASED
        if params.text is not None:
            return params.text
        return self.opener(self.key, params) if self.opener is not None else WITHHELD

    def _input_text(self, run: Run) -> str:
        """The redacted text System One saw: the decide command's, else (a memo hit) rebuilt from the turn read."""
        prefix = f"{self.key}:{run.number}:"
        for command_id, text in reversed(self.inputs.items()):
            if command_id.startswith(prefix):
                return text
        if run.first_turn is not None:
            return self._opened(decide_command(turn_input(run.first_turn.messages, run.current)))
        return ""


def _run_of(command_id: str) -> int:
    return run_of_command(command_id) or 0


# --- what the facts say, in words both readers use ---


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


# --- the log side ---


class TimelineReader:
    """Records of `<app>.conversations` in offset order, each folded under the configuration its partition had.

    With a `book` (the documents of `<app>.configs`), a partition's records are folded under the version its last
    `ConfigApplied` marker named, exactly as the worker did (DESIGN §8); without one (a log from before
    configurations were events), under `config`, and no version is recorded."""

    def __init__(
        self,
        config: RouterConfig | None = None,
        *,
        retry_base_ms: int = DEFAULT_RETRY_BASE_MS,
        book: ConfigBook | None = None,
    ) -> None:
        self.config = config
        self.retry_base_ms = retry_base_ms
        self.book = book if book is not None else ConfigBook()
        if config is None and not len(self.book):
            raise ValueError("a timeline needs a configuration or the applied configuration versions")
        self.scan = conversation_scan(self.book)

    @property
    def versions(self) -> PartitionVersions:
        return self.scan.versions

    @property
    def undecodable(self) -> int:
        return self.scan.undecodable

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

    def fold(self, into: Timeline, event: Event, offset: int, partition: int) -> list[TurnOutcome]:
        """Fold `event` (read at `offset` of `partition`) into a timeline; returns its turn outcomes."""
        document = self.in_force(partition)
        # a log from before configurations were events is folded as the worker did then: no version recorded
        version = document.version if len(self.book) else None
        return into.apply(
            event, offset, document.config, retry_base_ms=document.fold.retry_base_ms, config_version=version
        )
