"""The route procedure as a deterministic fold (behavior.md §3.5–§10, DESIGN §5–§6).

`fold(state, event, offset, config)` applies one event of a conversation's log and returns the new state, the
effect commands to execute, the next wake-up time and, when a run ends, its turn outcome. The procedure is an
explicit state machine: a run waits for exactly one command at a time (`Run.pending`), and each matching
outcome advances it by one step. "Now" is always the event's `at_ms`; nothing here does I/O.
"""

from __future__ import annotations

from projections.jobs import DEFAULT_RETRY_BASE_MS, retry_delay
from projections.route.folder import Folder, FoldResult, wakeup_of
from projections.route.phases import PHASE_HANDLERS
from schemas.config import RouterConfig
from schemas.configs import ConfigDocument
from schemas.keys import conversation_key_of
from schemas.records import EffectOutcome, SweepFound, TimerFired, WebhookReceived
from schemas.state import ConversationState

Event = WebhookReceived | SweepFound | EffectOutcome | TimerFired


def fold(
    state: ConversationState,
    event: Event,
    offset: int,
    config: RouterConfig,
    *,
    retry_base_ms: int = DEFAULT_RETRY_BASE_MS,
    config_version: str | None = None,
) -> FoldResult:
    """Apply one event under `config` (version `config_version`, recorded in the state); an offset already
    applied changes nothing (DESIGN §5)."""
    if offset <= state.offset:
        return FoldResult(state, [], wakeup_of(state), [])
    parsed = conversation_key_of(event.key)
    folder = Folder(state, config, parsed.account_id, parsed.conversation_id, event.at_ms, offset, retry_base_ms)
    _apply(folder, event)
    result = folder.finish()
    if config_version is None or result.state.config_version == config_version:
        return result
    return result._replace(state=result.state.evolve(config_version=config_version))


def fold_under(document: ConfigDocument, state: ConversationState, event: Event, offset: int) -> FoldResult:
    """`fold` under an applied configuration version (DESIGN §8): its configuration and fold settings."""
    return fold(
        state,
        event,
        offset,
        document.config,
        retry_base_ms=document.fold.retry_base_ms,
        config_version=document.version,
    )


def _apply(f: Folder, event: Event) -> None:
    if isinstance(event, WebhookReceived | SweepFound):
        f.admit(event.transition if isinstance(event, WebhookReceived) else None)
    elif isinstance(event, EffectOutcome):
        _on_outcome(f, event)
    else:
        f.on_timer(event)
    f.maybe_start()


def _on_outcome(f: Folder, o: EffectOutcome) -> None:
    """The outcome of the run's pending command advances the run by its phase's handler; any other is stale.

    An outcome of a chained read (`answers` set: the worker ran the read it expected the fold to issue next)
    counts only if the fold did issue that very copy."""
    run = f.run
    if run is None or run.pending is None or o.command_id != run.pending.command_id or o.op != run.pending.op:
        return  # stale or duplicate
    if o.answers is not None and o.answers != run.pending.digest():
        return  # a chained read of a step the fold took otherwise
    f.set_run(pending=None, deadline_ms=None, requests=run.requests + o.requests)
    PHASE_HANDLERS[run.phase](f, o)


__all__ = ["DEFAULT_RETRY_BASE_MS", "Event", "FoldResult", "fold", "fold_under", "retry_delay", "wakeup_of"]
