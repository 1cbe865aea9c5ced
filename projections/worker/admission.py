"""Whether the effect side may execute a command it consumed (DESIGN §6 "No command runs stale").

A command record can be consumed more than once: Faust is at-least-once, so after a crash or a partition move
the new owner reads again every command since the last committed offset, possibly long after its run moved on
and after a person changed the conversation. The effect side is co-partitioned with the state, so it decides
locally from two facts:

- **awaited**: the command the key's run (or sweep) waits for now, exactly as the fold recorded it. A command
  is awaited only if it is equal to it, `at_ms` included: a re-issue (overdue outcome, resume after a
  takeover) is a new copy with a new `at_ms`, which supersedes every older copy of the same command id.
- **attempted**: the last command whose execution the effect side started for this key, written to a
  changelog-backed table and flushed *before* the call is made. Only commands that must not run twice for one
  issue are recorded: mutations (they would undo a person's later change), `decide` (System One is asked once
  per input, Decisions 2) and `create_message` (never twice, behavior.md §9.7). Reads are always safe to repeat.

A command that is awaited and already attempted is a redelivery of a call that may or may not have happened:
it is not executed again. For a reply that is reported as unconfirmed (§9.7); for the others the run resumes
by re-issuing (a new copy, so a new attempt) when its owner changed or its deadline passed.

A mutation needs one more thing, right before its call: a **fresh read** (behavior.md §12.1). Every mutation is
issued by the fold of a read's outcome, so its `at_ms` is that read's outcome time on the log; `read_is_fresh`
bounds its age (ROUTER_FRESH_READ_MS), and `changed_since_read` stops it when a status change Chatwoot reported
(a transition webhook folded into the turn guard) is newer than the read (a person took the conversation over).
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict

from schemas.records import CONVERSATION_READS, MUTATIONS, EffectCommand
from schemas.state import ConversationState

Verdict = Literal["execute", "stale", "redelivered"]

READS = CONVERSATION_READS | {"list_conversations"}


class Attempt(BaseModel):
    """One started execution: which command copy (id and issue time) and which worker process started it."""

    model_config = ConfigDict(frozen=True)

    command_id: str
    at_ms: int
    by: str | None = None

    @classmethod
    def of(cls, command: EffectCommand, by: str | None = None) -> Attempt:
        return cls(command_id=command.command_id, at_ms=command.at_ms, by=by)

    def is_for(self, command: EffectCommand) -> bool:
        return self.command_id == command.command_id and self.at_ms == command.at_ms


def needs_attempt_record(command: EffectCommand) -> bool:
    """Whether executing `command` twice for one issue would be wrong (everything but reads)."""
    return command.params.op not in READS


def admit(command: EffectCommand, awaited: EffectCommand | None, attempted: Attempt | None) -> Verdict:
    """`execute` the command, drop it as `stale` (its run moved on), or as a `redelivered` started attempt."""
    if awaited is None or awaited != command:
        return "stale"
    if needs_attempt_record(command) and attempted is not None and attempted.is_for(command):
        return "redelivered"
    return "execute"


def read_is_fresh(command: EffectCommand, now_ms: int, bound_ms: int) -> bool:
    """Whether a mutation may still be made at `now_ms`: its read (outcome time = the command's issue time) is at
    most `bound_ms` old. Anything but a mutation is always fresh enough."""
    return command.params.op not in MUTATIONS or now_ms - command.at_ms <= bound_ms


def changed_since_read(state: ConversationState | None) -> bool:
    """Whether Chatwoot reported a status change of the conversation newer than the run's last conversation read:
    a person (or an automation) acted after the read the awaited mutation depends on. The router's own earlier
    status changes are older than the read that followed them; one the awaited mutation causes comes only after it
    is made. Unknown times (an older Chatwoot without `updated_at`) never count."""
    run = state.run if state is not None else None
    if run is None or run.read_updated_at is None or state is None:
        return False
    changed_at = state.guard.transition_at
    return changed_at is not None and changed_at > run.read_updated_at
