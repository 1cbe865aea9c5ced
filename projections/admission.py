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
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict

from schemas.records import CONVERSATION_READS, EffectCommand

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
