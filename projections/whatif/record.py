"""What-if's record of the log: every route run that reached a decision, with the events and outcomes it folded."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from projections.fold import Event, SingleEvent, fold_under, parts_of
from projections.logs.scan import conversation_scan
from schemas.codec import Undecodable, decode_conversation_event
from schemas.configs import ConfigBook, ConfigDocument
from schemas.decision import Decision
from schemas.keys import conversation_key_of, run_of_command
from schemas.records import (
    AgentsResult,
    CommandParams,
    CreateMessage,
    EffectCommand,
    EffectOutcome,
    SetLabels,
    TurnOutcome,
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


def run_number_of(command: EffectCommand) -> int:
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
            window = self.windows.get((key, run_number_of(command)))
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
