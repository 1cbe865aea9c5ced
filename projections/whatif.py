"""What-if: re-decide recorded turns under a candidate configuration (DESIGN §8 `whatif`). Pure: no I/O, no clock.

`TurnRecorder` folds `<app>.conversations` under the configuration versions that were in force (as the worker
did) and keeps every route run that reached a decision: the state right after the run started, the events
folded until it ended, and which recorded outcome answered which of its commands. `compare_turn` then replays
that run through the *same fold* under the candidate configuration, answering each command it issues:

- with the recorded outcome of the same command at the same point of the procedure (same op and parameters,
  same phase and purpose), when there is one; other events of the window (webhooks, sweeps, timers) are folded
  in their recorded order in between;
- for System One, with the recorded answer when the candidate asks exactly the question the live run asked
  (same owners, topics, kinds and model, hence the same request body); otherwise the turn "needs a new
  decision", unless `answers` holds System One's answer to the new question (`whatif --ask`);
- otherwise as the world most likely answered: a mutation succeeds (and later re-reads see it), a re-read the
  live run did not make sees what the live run's last read of that kind saw; a reply-history scan follows the
  reply ledger, canned responses exist, and the agents are the last list recorded for the account (these
  three are named as the side's assumptions).

So the identity candidate reproduces every live turn exactly, and any change is evaluated by the live rules.
Each turn is compared on its own, from the live state before it: a difference in one turn does not carry
over to the next.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from projections.fold import Event, SingleEvent, fold_under, parts_of
from projections.jev import JevError, asked_options, build_request, encode_request, read_decision
from projections.log_scan import conversation_scan
from schemas.chatwoot import MessageType
from schemas.codec import Undecodable, decode_conversation_event
from schemas.config import RouterConfig
from schemas.configs import ConfigBook, ConfigDocument
from schemas.decision import Decision
from schemas.keys import conversation_key_of, run_of_command
from schemas.records import (
    AgentsResult,
    CannedResult,
    CommandParams,
    ConversationResult,
    CreateMessage,
    CreateMessageResult,
    Decide,
    DecideResult,
    DoneResult,
    EffectCommand,
    EffectOutcome,
    InboxBotResult,
    MessageView,
    OutcomeResult,
    ReplyHistoryResult,
    SetLabels,
    TurnOutcome,
    TurnResult,
)
from schemas.state import ConversationState

MAX_STEPS = 200  # a route run takes at most ~20 commands; this only stops a replay that could not end
SYNTHETIC_MESSAGE_ID = 2**53 - 1  # the receipt of a reply the candidate would send (never a real id)
CANNED_PLACEHOLDER = "(canned response)"

Slot = tuple[str, str]  # (phase, purpose) of the run when it waited for a command


# --- what the log recorded -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Step:
    """One event of a run's window; `slot`/`params` say which command of the live run it answered, if any."""

    event: SingleEvent
    slot: Slot | None = None
    params: CommandParams | None = None


@dataclass
class RecordedTurn:
    """A live route run that reached a decision, with everything needed to run it again."""

    key: str
    account_id: int
    run: int
    started_ms: int
    live: ConfigDocument
    start_state: ConversationState
    steps: list[Step]
    decision: Decision
    outcome: TurnOutcome
    labels: tuple[str, ...] | None
    replied: bool
    agents: tuple[int, ...] | None = None


@dataclass
class _Window:
    start_state: ConversationState
    started_ms: int
    document: ConfigDocument
    steps: list[Step] = field(default_factory=list)
    decision: Decision | None = None
    decided_under: ConfigDocument | None = None
    labels: tuple[str, ...] | None = None
    replied: bool = False


def _run_of(command: EffectCommand) -> int:
    return run_of_command(command.command_id) or 0


class TurnRecorder:
    """Folds the log like the worker (each partition under the version its last marker named) and keeps every
    decided run as a `RecordedTurn`; runs that ended before a decision are counted in `undecided`."""

    def __init__(self, book: ConfigBook, on_turn: Callable[[RecordedTurn], None] | None = None) -> None:
        """`on_turn`, when given, gets each decided run as it ends instead of `turns` keeping it (a what-if of a
        year of history compares each turn as it ends and keeps only the report's counts and rows)."""
        if not len(book):
            raise ValueError("a what-if needs the configuration versions that were in force")
        self.on_turn = on_turn
        self.book = book
        self.scan = conversation_scan(book)
        self.states: dict[str, ConversationState] = {}
        self.windows: dict[tuple[str, int], _Window] = {}
        self.agents: dict[int, tuple[int, ...]] = {}
        self.turns: list[RecordedTurn] = []
        self.undecided = 0

    @property
    def undecodable(self) -> int:
        return self.scan.undecodable

    def feed(self, value: bytes | None, offset: int, partition: int = 0) -> None:
        event = self.scan.event(value, partition)
        if event is None:
            return
        document = self.scan.document(partition)
        assert document is not None
        self.apply(event, offset, document)

    def observe(self, value: bytes | None) -> None:
        """A record of a conversation this recorder does not fold (another pass's share, or outside a window): only
        an agents list is taken from it, since a candidate that lists agents where the live run did not is answered
        with the last list recorded for the account."""
        if value is None or b'"list_agents"' not in value:
            return
        try:
            event = decode_conversation_event(value)
        except Undecodable:
            return
        for part in parts_of(event):
            if isinstance(part, EffectOutcome) and isinstance(part.result, AgentsResult):
                self.agents[part.account_id] = part.result.agent_ids

    def apply(self, event: Event, offset: int, document: ConfigDocument) -> None:
        """Fold one record's event of `event.key` under `document` and update the run windows, each part of it
        (`parts_of`) as its own step."""
        if offset <= self.states.get(event.key, ConversationState()).offset:
            return
        for index, part in enumerate(parts_of(event)):
            self._apply_part(part, offset, document, continuing=index > 0)

    def _apply_part(self, event: SingleEvent, offset: int, document: ConfigDocument, *, continuing: bool) -> None:
        key = event.key
        before = self.states.get(key, ConversationState())
        result = fold_under(document, before, event, offset, continuing=continuing)
        self.states[key] = result.state
        if isinstance(event, EffectOutcome) and isinstance(event.result, AgentsResult):
            self.agents[event.account_id] = event.result.agent_ids
        run = before.run
        if run is not None and (window := self.windows.get((key, run.number))) is not None:
            pending = run.pending
            if isinstance(event, EffectOutcome) and pending is not None and event.command_id == pending.command_id:
                window.steps.append(Step(event, (run.phase, run.purpose), pending.params))
            else:
                window.steps.append(Step(event))
        after = result.state.run
        if after is not None and (run is None or run.number != after.number):
            self.windows[(key, after.number)] = _Window(result.state, event.at_ms, document)
        for command in result.commands:
            window = self.windows.get((key, _run_of(command)))
            if window is None:
                continue
            if isinstance(command.params, SetLabels):
                window.labels = command.params.labels
            elif isinstance(command.params, CreateMessage):
                window.replied = True
        if after is not None and after.decision is not None:
            window = self.windows.get((key, after.number))
            if window is not None and window.decision is None:
                window.decision, window.decided_under = after.decision, document
        for outcome in result.outcomes:
            self._close(key, outcome)

    def _close(self, key: str, outcome: TurnOutcome) -> None:
        window = self.windows.pop((key, outcome.run), None)
        if window is None:
            return
        if window.decision is None:
            self.undecided += 1
            return
        account = conversation_key_of(key).account_id
        turn = RecordedTurn(
            key=key,
            account_id=account,
            run=outcome.run,
            started_ms=window.started_ms,
            live=window.decided_under or window.document,
            start_state=window.start_state,
            steps=window.steps,
            decision=window.decision,
            outcome=outcome,
            labels=window.labels,
            replied=window.replied,
            agents=self.agents.get(account),
        )
        if self.on_turn is not None:
            self.on_turn(turn)
        else:
            self.turns.append(turn)


# --- one side of a comparison --------------------------------------------------------------------------


@dataclass(frozen=True)
class Side:
    """What a run did (live) or would do (candidate): its ending and the labels and reply on the way."""

    result: str
    reason: str | None = None
    status: str | None = None
    assignee_id: int | None = None
    owner: str | None = None
    labels: tuple[str, ...] | None = None
    replied: bool = False
    assumptions: tuple[str, ...] = ()

    @property
    def outcome(self) -> str:
        """The outcome class of the matrix."""
        if self.result == "assigned":
            return (
                f"assigned to {self.owner} (user {self.assignee_id})"
                if self.owner
                else f"assigned to user {self.assignee_id}"
            )
        if self.result == "ended":
            return f"ended {self.status}"
        if self.result == "handed_off":
            return f"handed off: {self.reason}"
        if self.result == "waited":
            return "waited for a request"
        return self.result + (f": {self.reason}" if self.reason else "")

    def same_as(self, other: Side) -> bool:
        mine = (self.result, self.reason, self.status, self.assignee_id, self.labels, self.replied)
        return mine == (other.result, other.reason, other.status, other.assignee_id, other.labels, other.replied)

    def describe(self) -> str:
        parts = [self.outcome]
        if self.labels is not None:
            parts.append("labels " + (", ".join(self.labels) or "(none)"))
        if self.replied:
            parts.append("canned reply")
        return "; ".join(parts)

    def as_json(self) -> dict[str, Any]:
        return {
            "outcome": self.outcome,
            "result": self.result,
            "reason": self.reason,
            "status": self.status,
            "assignee_id": self.assignee_id,
            "owner": self.owner,
            "labels": list(self.labels) if self.labels is not None else None,
            "canned_reply": self.replied,
            "assumptions": list(self.assumptions),
        }


def side_of(
    outcome: TurnOutcome,
    labels: tuple[str, ...] | None,
    replied: bool,
    decision: Decision | None,
    assumptions: Iterable[str] = (),
) -> Side:
    """A side from a run's outcome; an assignment is named by the owner System One chose."""
    return Side(
        result=outcome.result,
        reason=outcome.reason,
        status=outcome.status,
        assignee_id=outcome.assignee_id,
        owner=decision.owner if outcome.result == "assigned" and decision is not None else None,
        labels=labels,
        replied=replied,
        assumptions=tuple(dict.fromkeys(assumptions)),
    )


def live_side(turn: RecordedTurn) -> Side:
    return side_of(turn.outcome, turn.labels, turn.replied, turn.decision)


# --- System One questions ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Question:
    """A question the candidate puts to System One: `digest` = hash of the request body (redacted input plus
    questions and model), the cache key of `whatif --ask`. `body` holds the redacted input: never print it."""

    digest: str
    body: dict[str, Any] = field(repr=False, compare=False)
    min_confidence: float = 0.7


def question_digest(body: dict[str, Any]) -> str:
    return hashlib.sha256(encode_request(body)).hexdigest()


def question_changes(live: dict[str, Any], candidate: dict[str, Any]) -> tuple[str, ...]:
    """Which parts of System One's question the candidate changes: owners, topics, request, kinds, model."""
    names = {"owner": "owners", "topic": "topics", "request": "request", "kind": "kinds"}
    changed = [names[q] for q in names if live["questions"].get(q) != candidate["questions"].get(q)]
    if live["model"] != candidate["model"]:
        changed.append("model")
    return tuple(changed)


@dataclass(frozen=True)
class NeedsDecision:
    """The recorded answer does not apply to the candidate's question (or cannot be read under it)."""

    question: Question
    reasons: tuple[str, ...]


DecideAnswer = Decision | NeedsDecision
Answers = Mapping[str, object]  # question digest -> System One's answer (the JSON body it returned)


# --- the candidate's replay ----------------------------------------------------------------------------


class _Replay:
    """One recorded run folded again under the candidate, answering its commands (see the module docstring)."""

    def __init__(self, turn: RecordedTurn, candidate: RouterConfig, decide: Callable[[Decide], DecideAnswer]):
        self.turn = turn
        self.document = ConfigDocument(version="candidate", config=candidate, fold=turn.live.fold)
        self.decide = decide
        self.state = turn.start_state
        self.run = turn.start_state.run.number if turn.start_state.run is not None else 0
        self.offset = turn.start_state.offset
        self.now = turn.started_ms
        self.used: set[int] = set()
        self.position = 0  # next recorded step not yet passed
        self.labels: tuple[str, ...] | None = None
        self.replied = False
        self.outcome: TurnOutcome | None = None
        self.assumptions: list[str] = []
        self.world: dict[str, Any] = {}  # conversation fields changed by the candidate's own mutations
        self.decision: Decision | None = None

    def feed(self, event: Event) -> None:
        self.offset += 1
        self.now = max(self.now, event.at_ms)
        result = fold_under(self.document, self.state, event, self.offset)
        self.state = result.state
        for command in result.commands:
            if _run_of(command) != self.run:
                continue
            if isinstance(command.params, SetLabels):
                self.labels = command.params.labels
            elif isinstance(command.params, CreateMessage):
                self.replied = True
        for outcome in result.outcomes:
            if outcome.run == self.run and self.outcome is None:
                self.outcome = outcome
        if result.state.run is not None and result.state.run.number == self.run and result.state.run.decision:
            self.decision = result.state.run.decision

    def go(self) -> TurnOutcome | NeedsDecision | None:
        for _ in range(MAX_STEPS):
            run = self.state.run
            if self.outcome is not None or run is None or run.number != self.run or run.pending is None:
                return self.outcome
            pending = run.pending
            if isinstance(pending.params, Decide):
                answer = self.decide(pending.params)
                if isinstance(answer, NeedsDecision):
                    return answer
                self.feed(self._outcome_for(pending, DecideResult(decision=answer)))
                continue
            index = self._recorded((run.phase, run.purpose), pending.params)
            if index is None:
                self.feed(self._outcome_for(pending, self._synthesize(pending, run.phase)))
                continue
            if index >= self.position:
                for step in self.turn.steps[self.position : index]:
                    if not isinstance(step.event, EffectOutcome):
                        self.feed(step.event)  # webhooks, sweeps and timers between two steps, in order
                self.position = index + 1
                current = self.state.run
                if current is None or current.pending is None or current.pending.command_id != pending.command_id:
                    continue  # an event in between moved the run on
            self.used.add(index)
            recorded = self.turn.steps[index].event
            assert isinstance(recorded, EffectOutcome)
            # the candidate's own copy of the step: a chained read's `answers` named the live copy
            self.feed(
                recorded.model_copy(update={"command_id": pending.command_id, "key": pending.key, "answers": None})
            )
        return self.outcome

    def _recorded(self, slot: Slot, params: CommandParams) -> int | None:
        for index, step in enumerate(self.turn.steps):
            if index not in self.used and step.slot == slot and step.params == params:
                return index
        return None

    def _outcome_for(self, command: EffectCommand, result: OutcomeResult) -> EffectOutcome:
        return EffectOutcome(
            at_ms=self.now,
            key=command.key,
            account_id=command.account_id,
            command_id=command.command_id,
            op=command.op,
            result=result,
            requests=1,
        )

    def _last_result(self, kind: type[Any], phase: str | None = None) -> Any:
        """The latest successful recorded result of this kind (of `phase` when there is one), else None."""
        found = None
        for step in self.turn.steps:
            event = step.event
            recorded = isinstance(event, EffectOutcome) and isinstance(event.result, kind) and step.slot is not None
            if recorded and (phase is None or (step.slot is not None and step.slot[0] == phase)):
                found = event.result  # type: ignore[union-attr]
        if found is None and phase is not None:
            return self._last_result(kind)
        return found

    def _synthesize(self, command: EffectCommand, phase: str) -> OutcomeResult:
        params = command.params
        account = self.turn.account_id
        match params.op:
            case "get_conversation":
                read = self._last_result(ConversationResult, "snapshot" if phase == "snapshot" else None)
                assert read is not None, "a decided run read its conversation"
                return ConversationResult(conversation=read.conversation.model_copy(update=self.world))
            case "get_inbox_bot":
                bot = self._last_result(InboxBotResult)
                assert bot is not None, "a decided run read its inbox bot"
                return bot
            case "read_turn":
                turn = self._last_result(TurnResult)
                assert turn is not None, "a decided run read its turn"
                return turn
            case "scan_reply_history":
                ledger = self.turn.start_state.ledger.value
                held = "no reply (the reply ledger is empty)" if ledger is None else f"a reply (ledger: {ledger})"
                self.assumptions.append(f"reply history not read live: assumed to hold {held}")
                return ReplyHistoryResult(found="complete_none" if ledger is None else "found")
            case "list_canned":
                self.assumptions.append(f"canned response {params.short_code!r} assumed to exist")
                return CannedResult(content=CANNED_PLACEHOLDER)
            case "list_agents":
                if self.turn.agents is not None:
                    return AgentsResult(agent_ids=self.turn.agents)
                assignee = self.state.run.assignee if self.state.run is not None else None
                self.assumptions.append(f"agents not listed live: user {assignee} assumed to be an agent")
                return AgentsResult(agent_ids=(assignee,) if assignee is not None else ())
            case "create_message":
                bot = self.document.config.routing.bot_ids[account]
                conversation = conversation_key_of(self.turn.key).conversation_id
                receipt = MessageView(
                    id=SYNTHETIC_MESSAGE_ID,
                    message_type=MessageType.OUTGOING,
                    private=False,
                    sender_type="agent_bot",
                    sender_id=bot,
                    conversation_id=conversation,
                )
                return CreateMessageResult(message=receipt)
            case "set_labels":
                self.world["labels"] = params.labels
                return DoneResult(op="set_labels")
            case "toggle_status":
                self.world["status"] = params.status
                if params.status == "open":  # a native handoff clears the bot
                    self.world.update(assignee_type=None, assignee_id=None, has_assignee=False)
                return DoneResult(op="toggle_status")
            case "assign":
                user = params.assignee_id
                self.world.update(assignee_type="User", assignee_id=user, has_assignee=True, status="open")
                return DoneResult(op="assign")
            case "unassign":
                self.world.update(assignee_type=None, assignee_id=None, has_assignee=False)
                return DoneResult(op="unassign")
        raise AssertionError(f"a route run does not issue {params.op}")


Status = Literal["unchanged", "changed", "needs_decision"]


@dataclass(frozen=True)
class TurnComparison:
    """One recorded turn, live and under the candidate."""

    key: str
    run: int
    at_ms: int
    live_version: str
    live: Side
    candidate: Side | None
    status: Status
    needs: tuple[str, ...] = ()
    question: Question | None = None

    def as_json(self) -> dict[str, Any]:
        return {
            "conversation": self.key,
            "run": self.run,
            "at_ms": self.at_ms,
            "live_version": self.live_version,
            "status": self.status,
            "live": self.live.as_json(),
            "candidate": self.candidate.as_json() if self.candidate is not None else None,
            "needs_new_decision": list(self.needs) if self.status == "needs_decision" else None,
            "question": self.question.digest if self.question is not None else None,
        }


class _Decider:
    """How the candidate's System One question is answered: the recorded answer when the question is the same
    (with `no_request` forced when the threshold leaves it open), else `answers` (System One's answers by
    question digest), else it needs a new decision. `question` is the last question it was asked."""

    def __init__(self, turn: RecordedTurn, candidate: RouterConfig, answers: Answers, no_request: bool | None):
        self.turn, self.candidate, self.answers, self.no_request = turn, candidate, answers, no_request
        self.question: Question | None = None

    def __call__(self, params: Decide) -> DecideAnswer:
        account, candidate = self.turn.account_id, self.candidate
        live_body = build_request(self.turn.live.config, account, params.text)
        body = build_request(candidate, account, params.text)
        self.question = question = Question(question_digest(body), body, candidate.routing.min_confidence)
        answer = self.answers.get(question.digest)
        if body == live_body and (self.no_request is None or answer is None):
            decision = self.turn.decision
            if self.no_request is None:
                return decision
            return decision.model_copy(update={"no_request": self.no_request})
        if answer is None:
            return NeedsDecision(question, question_changes(live_body, body))
        try:
            return read_decision(answer, asked_options(body), candidate.routing.min_confidence)
        except JevError as exc:
            return NeedsDecision(question, (str(exc),))


def _no_request_is_ambiguous(turn: RecordedTurn, candidate: RouterConfig) -> bool:
    """The decision records `noRequest` as a yes/no under the live minConfidence; under another threshold the
    recorded answer tells it only one way (a "yes" holds under a lower threshold, a "no" under a higher)."""
    live_min, min_confidence = turn.live.config.routing.min_confidence, candidate.routing.min_confidence
    if turn.decision.no_request:
        return min_confidence > live_min
    return min_confidence < live_min


def compare_turn(turn: RecordedTurn, candidate: RouterConfig, answers: Answers | None = None) -> TurnComparison:
    """Re-decide one recorded turn under `candidate` (see the module docstring)."""
    answers = answers or {}
    live = live_side(turn)

    def compared(side: Side | None, status: Status, needs: NeedsDecision | None = None) -> TurnComparison:
        return TurnComparison(
            key=turn.key,
            run=turn.run,
            at_ms=turn.started_ms,
            live_version=turn.live.version,
            live=live,
            candidate=side,
            status=status,
            needs=needs.reasons if needs is not None else (),
            question=needs.question if needs is not None else None,
        )

    if not (candidate.is_routed(turn.account_id) and turn.account_id in candidate.routing.bot_ids):
        side = Side(result="nothing", reason="account_not_routed")
        return compared(side, "unchanged" if side.same_as(live) else "changed")
    variants: list[bool | None] = [True, False] if _no_request_is_ambiguous(turn, candidate) else [None]
    sides: list[Side] = []
    question: Question | None = None
    for variant in variants:
        decider = _Decider(turn, candidate, answers, variant)
        replay = _Replay(turn, candidate, decider)
        ended = replay.go()
        question = decider.question or question
        if isinstance(ended, NeedsDecision):
            return compared(None, "needs_decision", ended)
        if ended is None:
            sides.append(Side(result="undetermined", reason="the replay did not end"))
            continue
        sides.append(side_of(ended, replay.labels, replay.replied, replay.decision, replay.assumptions))
    if len(sides) > 1 and not sides[0].same_as(sides[1]) and question is not None:
        return compared(None, "needs_decision", NeedsDecision(question, ("minConfidence",)))
    side = sides[0]
    return compared(side, "unchanged" if side.same_as(live) else "changed")


# --- the report ----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Change:
    path: str
    live: Any
    candidate: Any


def _flatten(value: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(value, dict) and value:
        flat: dict[str, Any] = {}
        for k, v in value.items():
            flat.update(_flatten(v, f"{prefix}.{k}" if prefix else str(k)))
        return flat
    return {prefix: value}


_ABSENT = object()


def config_diff(live: RouterConfig, candidate: RouterConfig) -> list[Change]:
    """Key paths (behavior.md §2.2 names) whose values differ; a missing side is None with `absent`."""
    a = _flatten(live.model_dump(mode="json", by_alias=True, exclude_none=True))
    b = _flatten(candidate.model_dump(mode="json", by_alias=True, exclude_none=True))
    changes = []
    for path in sorted(set(a) | set(b)):
        before, after = a.get(path, _ABSENT), b.get(path, _ABSENT)
        if before != after:
            changes.append(Change(path, None if before is _ABSENT else before, None if after is _ABSENT else after))
    return changes


@dataclass
class Report:
    """Everything `whatif` prints: totals, the live → candidate matrix, the changed turns and the diffs."""

    candidate_version: str
    turns: list[TurnComparison]
    diffs: dict[str, list[Change]]  # live version -> its changes to the candidate
    undecided: int = 0
    asked: int = 0
    cached: int = 0
    ask_failures: int = 0
    # over every turn compared, when `turns` lists only some of them (projections/whatif_tally.py)
    counts: dict[str, int] | None = None
    cells: dict[tuple[str, str], int] | None = None
    bank: dict[str, Question] | None = None
    unlisted: int = 0

    def count(self, status: Status) -> int:
        if self.counts is not None:
            return self.counts.get(status, 0)
        return sum(1 for t in self.turns if t.status == status)

    @property
    def compared(self) -> int:
        return sum(self.counts.values()) if self.counts is not None else len(self.turns)

    @property
    def totals(self) -> dict[str, int]:
        return {
            "compared": self.compared,
            "unchanged": self.count("unchanged"),
            "changed": self.count("changed"),
            "needs_new_decision": self.count("needs_decision"),
        }

    @property
    def matrix(self) -> dict[tuple[str, str], int]:
        """(live outcome, candidate outcome) -> turns, in a stable order."""
        if self.cells is not None:
            return dict(sorted(self.cells.items()))
        cells: dict[tuple[str, str], int] = {}
        for t in self.turns:
            target = t.candidate.outcome if t.candidate is not None else "needs a new decision"
            cells[(t.live.outcome, target)] = cells.get((t.live.outcome, target), 0) + 1
        return dict(sorted(cells.items()))

    def changed(self) -> list[TurnComparison]:
        """The changed turns listed (`changed_count` says how many there are)."""
        return [t for t in self.turns if t.status != "unchanged"]

    @property
    def changed_count(self) -> int:
        return self.count("changed") + self.count("needs_decision")

    def questions(self) -> list[Question]:
        """The distinct new questions the candidate would put to System One."""
        if self.bank is not None:
            return list(self.bank.values())
        seen: dict[str, Question] = {}
        for t in self.turns:
            if t.status == "needs_decision" and t.question is not None:
                seen.setdefault(t.question.digest, t.question)
        return list(seen.values())

    def as_json(self) -> dict[str, Any]:
        return {
            "candidate_version": self.candidate_version,
            "totals": self.totals,
            "undecided_runs": self.undecided,
            "ask": {"asked": self.asked, "cached": self.cached, "failed": self.ask_failures},
            "matrix": [{"live": live, "candidate": cand, "turns": n} for (live, cand), n in self.matrix.items()],
            "turns": [t.as_json() for t in self.turns],
            "turns_not_listed": self.unlisted,
            "config_diff": {
                version: [{"path": c.path, "live": c.live, "candidate": c.candidate} for c in changes]
                for version, changes in self.diffs.items()
            },
        }


def build_report(
    turns: Iterable[RecordedTurn],
    candidate: RouterConfig,
    candidate_version: str,
    *,
    answers: Answers | None = None,
    undecided: int = 0,
) -> Report:
    """Compare every turn and gather the report; `answers` are System One's answers to new questions."""
    recorded = list(turns)
    compared = [compare_turn(t, candidate, answers) for t in recorded]
    lives = {t.live.version: t.live for t in recorded}
    diffs = {version: config_diff(doc.config, candidate) for version, doc in sorted(lives.items())}
    return Report(candidate_version, compared, diffs, undecided=undecided)


def select(
    turns: Iterable[RecordedTurn],
    *,
    from_ms: int | None = None,
    account_id: int | None = None,
    key: str | None = None,
) -> list[RecordedTurn]:
    """The turns started at or after `from_ms`, of one account or one conversation."""
    return [
        t
        for t in turns
        if (from_ms is None or t.started_ms >= from_ms)
        and (account_id is None or t.account_id == account_id)
        and (key is None or t.key == key)
    ]


def dumps(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False)


__all__ = [
    "Change",
    "NeedsDecision",
    "Question",
    "RecordedTurn",
    "Report",
    "Side",
    "TurnComparison",
    "TurnRecorder",
    "build_report",
    "compare_turn",
    "config_diff",
    "question_digest",
    "select",
]
