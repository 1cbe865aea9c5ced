"""Which handler folds the outcome of a run's pending command: one per phase (`schemas.state.Phase`)."""

from __future__ import annotations

from collections.abc import Callable, Mapping

from projections.route import deciding, ending, reads, reply, turn_read
from projections.route.folder import Folder
from schemas.records import EffectOutcome
from schemas.state import Phase

PhaseHandler = Callable[[Folder, EffectOutcome], None]

PHASE_HANDLERS: Mapping[Phase, PhaseHandler] = {
    "snapshot": reads.on_snapshot,
    "inbox_bot": reads.on_inbox_bot,
    "disconnect_read": reads.on_disconnect_read,
    "disconnect_toggle": reads.on_disconnect_toggle,
    "release_read": reads.on_release_read,
    "release_unassign": reads.on_release_unassign,
    "turn": turn_read.on_turn,
    "decide": deciding.on_decide,
    "labels": deciding.on_labels,
    "history": reply.on_history,
    "canned": reply.on_canned,
    "send": reply.on_send,
    "agents": ending.on_agents,
    "ending": ending.on_ending,
    "handoff_toggle": ending.on_handoff_toggle,
}
