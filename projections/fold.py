"""The route procedure as a deterministic fold (behavior.md §3.5–§10, DESIGN §5–§6).

`fold(state, event, offset, config)` applies one event of a conversation's log and returns the new state, the
effect commands to execute, the next wake-up time and, when a run ends, its turn outcome. The procedure is an
explicit state machine: a run waits for exactly one command at a time (`Run.pending`), and each matching
outcome advances it by one step. "Now" is always the event's `at_ms`; nothing here does I/O.
"""

from __future__ import annotations

from collections.abc import Iterator

from projections.jobs import DEFAULT_RETRY_BASE_MS, retry_delay
from projections.route.folder import NOT_MADE, RECHECK_BEFORE, Folder, FoldResult, wakeup_of
from projections.route.phases import PHASE_HANDLERS
from schemas.config import RouterConfig
from schemas.configs import ConfigDocument
from schemas.keys import conversation_key_of
from schemas.records import (
    ChainedOutcomes,
    EffectCommand,
    EffectOutcome,
    ForgetRequested,
    Forgotten,
    SweepFound,
    TimerFired,
    TurnOutcome,
    WebhookReceived,
)
from schemas.state import ConversationState

SingleEvent = WebhookReceived | SweepFound | EffectOutcome | TimerFired | ForgetRequested | Forgotten
Event = SingleEvent | ChainedOutcomes


def fold(
    state: ConversationState,
    event: Event,
    offset: int,
    config: RouterConfig,
    *,
    retry_base_ms: int = DEFAULT_RETRY_BASE_MS,
    config_version: str | None = None,
    continuing: bool = False,
) -> FoldResult:
    """Apply one event under `config` (version `config_version`, recorded in the state); an offset already
    applied changes nothing (DESIGN §5), unless `continuing`: the event is the next part of the record at
    `offset` (`parts_of`), folded on the state its previous part left."""
    if offset < state.offset or (offset == state.offset and not continuing):
        return FoldResult(state, [], wakeup_of(state), [])
    if state.forgotten_ms is not None or isinstance(event, ForgetRequested | Forgotten):
        return _forgetting(state, event, offset)
    if isinstance(event, ChainedOutcomes):
        return _fold_chain(state, event, offset, config, retry_base_ms, config_version)
    parsed = conversation_key_of(event.key)
    folder = Folder(state, config, parsed.account_id, parsed.conversation_id, event.at_ms, offset, retry_base_ms)
    _apply(folder, event)
    result = folder.finish()
    update: dict[str, object] = {}
    if state.first_offset < 0:  # the conversation's first record: where a reader of it alone starts
        update.update(first_offset=offset, first_version=config_version)
    if config_version is not None and result.state.config_version != config_version:
        update["config_version"] = config_version
    return result._replace(state=result.state.evolve(**update)) if update else result


def _forgetting(state: ConversationState, event: Event, offset: int) -> FoldResult:
    """Issue 32: a forget request changes nothing here (the worker erases the key, then writes `Forgotten`);
    `Forgotten` ends whatever ran and holds the sealed fields (the run's turn read and fresh read) no more; after it
    every record of the conversation is applied as nothing: it is never routed again. An erasure of scope `text`
    (ROUTER_TEXT_RETENTION_DAYS) happens only between turns and changes nothing here: routing goes on."""
    if isinstance(event, Forgotten) and event.scope == "conversation" and state.forgotten_ms is None:
        state = state.evolve(offset=offset, forgotten_ms=event.at_ms, job=None, run=None)
    else:
        state = state.evolve(offset=offset)
    return FoldResult(state, [], wakeup_of(state), [])


def parts_of(event: Event) -> tuple[SingleEvent, ...]:
    """The events a record holds, in fold order: one, or each outcome of a `ChainedOutcomes`."""
    return tuple(event.outcomes) if isinstance(event, ChainedOutcomes) else (event,)


def fold_parts(
    state: ConversationState,
    event: Event,
    offset: int,
    config: RouterConfig,
    *,
    retry_base_ms: int = DEFAULT_RETRY_BASE_MS,
    config_version: str | None = None,
) -> Iterator[tuple[SingleEvent, FoldResult]]:
    """Fold one record's event part by part (`parts_of`), each on the state the previous part left, yielding each
    part with what folding it did: for readers that show every step (audit, the console). The
    last result is what `fold` returns for the whole record, but for the commands: a part's command that the next
    part answers is in that part's result."""
    for index, part in enumerate(parts_of(event)):
        result = fold(
            state,
            part,
            offset,
            config,
            retry_base_ms=retry_base_ms,
            config_version=config_version,
            continuing=index > 0,
        )
        yield part, result
        state = result.state


def _fold_chain(
    state: ConversationState,
    event: ChainedOutcomes,
    offset: int,
    config: RouterConfig,
    retry_base_ms: int,
    config_version: str | None,
) -> FoldResult:
    """Each chained outcome folded in order, as its own event would be. A command one part issues and the next
    part answers already ran, so it is not among the commands to send."""
    commands: list[EffectCommand] = []
    outcomes: list[TurnOutcome] = []
    result = FoldResult(state, [], wakeup_of(state), [])
    parts = fold_parts(state, event, offset, config, retry_base_ms=retry_base_ms, config_version=config_version)
    for part, folded in parts:
        run = result.state.run  # before this part
        pending = run.pending if run is not None else None
        if isinstance(part, EffectOutcome) and pending is not None and answers(part, pending) and pending in commands:
            commands.remove(pending)
        result = folded
        commands.extend(result.commands)
        outcomes.extend(result.outcomes)
    return FoldResult(result.state, commands, result.wakeup_ms, outcomes)


def answers(o: EffectOutcome, pending: EffectCommand) -> bool:
    """Whether `o` is the outcome of the pending command: its id and op, and for a chained read (`answers`
    set: the worker ran the read it expected the fold to issue next) that very copy."""
    if o.command_id != pending.command_id or o.op != pending.op:
        return False
    return o.answers is None or o.answers == pending.digest()


def fold_under(
    document: ConfigDocument, state: ConversationState, event: Event, offset: int, *, continuing: bool = False
) -> FoldResult:
    """`fold` under an applied configuration version (DESIGN §8): its configuration and fold settings."""
    return fold(
        state,
        event,
        offset,
        document.config,
        retry_base_ms=document.fold.retry_base_ms,
        config_version=document.version,
        continuing=continuing,
    )


def _apply(f: Folder, event: SingleEvent) -> None:
    if isinstance(event, WebhookReceived | SweepFound):
        f.admit(event.transition if isinstance(event, WebhookReceived) else None)
    elif isinstance(event, EffectOutcome):
        _on_outcome(f, event)
    elif isinstance(event, TimerFired):
        f.on_timer(event)
    f.maybe_start()


def _on_outcome(f: Folder, o: EffectOutcome) -> None:
    """The outcome of the run's pending command advances the run by its phase's handler; any other is stale
    (a duplicate, or a chained read of a step the fold took otherwise)."""
    run = f.run
    if run is None or run.pending is None or not answers(o, run.pending):
        return
    f.set_run(pending=None, deadline_ms=None, requests=run.requests + o.requests)
    if o.error is not None and o.error.kind in NOT_MADE and run.phase in RECHECK_BEFORE:
        f.reread()  # not made (its read was not fresh when a worker could make it, or Chatwoot's rate limit refused
        # it until its deadline): the read again decides
        return
    PHASE_HANDLERS[run.phase](f, o)


__all__ = [
    "DEFAULT_RETRY_BASE_MS",
    "Event",
    "FoldResult",
    "SingleEvent",
    "answers",
    "fold",
    "fold_parts",
    "fold_under",
    "parts_of",
    "retry_delay",
    "wakeup_of",
]
