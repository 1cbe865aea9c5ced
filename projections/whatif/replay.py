"""What-if's replay: a recorded turn folded again under a candidate configuration, each command answered from the
record."""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from projections.fold import Event, fold_under
from projections.jev import JevError, asked_options, build_request, encode_request, read_decision
from projections.whatif.record import (
    CANNED_PLACEHOLDER,
    MAX_STEPS,
    SYNTHETIC_MESSAGE_ID,
    RecordedTurn,
    Slot,
    run_number_of,
)
from schemas.chatwoot import MessageType
from schemas.config import RouterConfig
from schemas.configs import ConfigDocument
from schemas.decision import Decision
from schemas.keys import conversation_key_of
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
    askable: bool = True
    """False when the input is sealed and this reader cannot open it (issue 32): never sent to System One."""


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
InputOpener = Callable[[str, Decide], str | None]  # conversation key, sealed decide -> its text, or None


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
            if run_number_of(command) != self.run:
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

    def __init__(
        self,
        turn: RecordedTurn,
        candidate: RouterConfig,
        answers: Answers,
        no_request: bool | None,
        opener: InputOpener | None = None,
    ):
        self.turn, self.candidate, self.answers, self.no_request = turn, candidate, answers, no_request
        self.opener = opener
        self.question: Question | None = None

    def __call__(self, params: Decide) -> DecideAnswer:
        account, candidate = self.turn.account_id, self.candidate
        text = params.text
        if text is None and self.opener is not None:
            text = self.opener(self.turn.key, params)  # opened with the reader's KEK (never for an erased turn)
        sealed = text is None  # issue 32: the question's text is sealed; its setup can still be compared
        live_body = build_request(self.turn.live.config, account, text or "")
        body = build_request(candidate, account, text or "")
        digest = question_digest(body) if not sealed else f"sealed:{self.turn.key}:{params.input_key}"
        self.question = question = Question(digest, body, candidate.routing.min_confidence, askable=not sealed)
        if sealed and body != live_body:
            return NeedsDecision(question, ("its input is sealed: not re-decidable without opening it",))
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


def compare_turn(
    turn: RecordedTurn, candidate: RouterConfig, answers: Answers | None = None, opener: InputOpener | None = None
) -> TurnComparison:
    """Re-decide one recorded turn under `candidate` (see the module docstring); `opener` opens a sealed input
    (issue 32) when the reader has the key-encryption key."""
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
        decider = _Decider(turn, candidate, answers, variant, opener)
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
