"""One fold step of either fold, in the shape the worker persists and sends (DESIGN §6).

The worker does the same thing for a conversation event and for a sweep event: decode the stored state, fold
the record, keep the new state if it changed, send the commands (and, for a sweep page, the conversations it
found), set the key's timer and report turn outcomes. `Step` is that result for both folds, so one worker
routine serves both (`handlers.worker.service.WorkerService.fold_record`).
"""

from __future__ import annotations

from typing import Any, NamedTuple

from pydantic import BaseModel

from projections.fold import fold_under
from projections.sweep import fold_sweep
from schemas.configs import ConfigDocument
from schemas.records import ConversationEvent, EffectCommand, SweepEvent, SweepFound, TurnOutcome
from schemas.state import ConversationState, SweepState


class Step(NamedTuple):
    state: BaseModel
    changed: bool
    commands: list[EffectCommand]
    found: list[SweepFound]
    wakeup_ms: int | None
    waiting: bool
    """Whether a run now waits for the outcome of a command (its timer entry names the command's issuer)."""
    outcomes: list[TurnOutcome]


def conversation_step(stored: Any | None, event: ConversationEvent, document: ConfigDocument, offset: int) -> Step:
    """Fold a conversation event into the state stored for its key (None: a conversation seen first)."""
    state = ConversationState.model_validate(stored) if stored is not None else ConversationState()
    result = fold_under(document, state, event, offset)
    run = result.state.run
    waiting = run is not None and run.pending is not None
    changed = result.state is not state
    return Step(result.state, changed, result.commands, [], result.wakeup_ms, waiting, result.outcomes)


def sweep_step(stored: Any | None, event: SweepEvent, document: ConfigDocument, offset: int) -> Step:
    """Fold a sweep event into the state stored for its "acct:status" key."""
    state = SweepState.model_validate(stored) if stored is not None else SweepState()
    result = fold_sweep(state, event, offset, document.config, retry_base_ms=document.fold.retry_base_ms)
    changed = result.state is not state
    return Step(result.state, changed, result.commands, result.found, result.wakeup_ms, False, [])
