"""The sweep as a fold (behavior.md §5): one pass per "acct:status", one page per step.

Events: `SweepRequested` (enqueue-merge; a pass in progress keeps its cursor, a backing-off pass keeps
its schedule), the page's `EffectOutcome` and `TimerFired` (backoff and overdue pages). Output: the selected
rows as `SweepFound` events for the conversations topic, the next page command, and the next wake-up.
"""

from __future__ import annotations

from typing import NamedTuple

from projections.jobs import DEFAULT_RETRY_BASE_MS, backed_off, command_deadline, due_again, merged, retry_delay
from schemas.config import RouterConfig
from schemas.keys import SweepKey, parse_key, sweep_command_id
from schemas.records import (
    ConversationsPageResult,
    EffectCommand,
    EffectOutcome,
    ListConversations,
    SweepFound,
    SweepRequested,
    SweepRow,
    SweepStatus,
    TimerFired,
)
from schemas.state import SweepJob, SweepState

SweepEvent = SweepRequested | EffectOutcome | TimerFired


class SweepFoldResult(NamedTuple):
    state: SweepState
    commands: list[EffectCommand]
    found: list[SweepFound]
    wakeup_ms: int | None


def select_rows(rows: tuple[SweepRow, ...], status: SweepStatus, bot_id: int) -> list[SweepRow]:
    """§5 step 3: every pending row; open rows only while assigned to the brand bot (release rule)."""
    if status == "pending":
        return list(rows)
    return [r for r in rows if r.assignee_type == "AgentBot" and r.assignee_id == bot_id]


def sweep_wakeup(state: SweepState) -> int | None:
    if state.pending is not None:
        return state.deadline_ms
    return state.job.not_before if state.job is not None else None


def fold_sweep(
    state: SweepState,
    event: SweepEvent,
    offset: int,
    config: RouterConfig,
    *,
    retry_base_ms: int = DEFAULT_RETRY_BASE_MS,
) -> SweepFoldResult:
    """Apply one sweep event; an offset already applied changes nothing."""
    if offset <= state.offset:
        return SweepFoldResult(state, [], [], sweep_wakeup(state))
    key = event.key
    parsed = parse_key(key)
    if not isinstance(parsed, SweepKey):
        raise ValueError(f"not a sweep key: {key!r}")
    account, status = parsed.account_id, parsed.status
    now = event.at_ms
    commands: list[EffectCommand] = []
    found: list[SweepFound] = []
    job, cursor, pending, deadline, pages = (
        state.job,
        state.cursor,
        state.pending,
        state.deadline_ms,
        state.pages,
    )
    running = state.running_version

    if isinstance(event, SweepRequested):
        job = SweepJob(not_before=now, created_at=now) if job is None else merged(job, now)
    elif isinstance(event, EffectOutcome):
        if pending is not None and event.command_id == pending.command_id and job is not None:
            pending, deadline = None, None
            result = event.result
            if event.error is not None or not isinstance(result, ConversationsPageResult):
                job = backed_off(job, now, retry_delay(job.attempts, retry_base_ms))
            elif not result.rows:
                cursor = None  # an empty page ends the pass; a request merged meanwhile starts a new one
                merged_meanwhile = job.version != running
                job = due_again(job, now) if merged_meanwhile else None
            else:
                bot_id = config.routing.bot_ids.get(account)
                if bot_id is not None:
                    found = [
                        SweepFound(at_ms=now, account_id=account, conversation_id=row.id, status=status)
                        for row in select_rows(result.rows, status, bot_id)
                    ]
                cursor = (cursor or 1) + 1
                job = due_again(job, now)
    elif pending is not None and deadline is not None and now >= deadline:
        pending = pending.model_copy(update={"at_ms": now})  # overdue: the same page, the same id
        deadline = command_deadline(now, ListConversations.max_requests)
        commands.append(pending)

    if pending is None and job is not None and job.not_before <= now:
        if not config.is_routed(account):
            job = None  # an account removed from the configuration: the pass completes as a no-op
        else:
            pages += 1
            pending = EffectCommand(
                at_ms=now,
                key=key,
                account_id=account,
                command_id=sweep_command_id(key, pages),
                params=ListConversations(status=status, page=cursor or 1),
            )
            deadline = command_deadline(now, ListConversations.max_requests)
            running = job.version
            commands.append(pending)

    new = SweepState(
        offset=offset,
        cursor=cursor,
        job=job,
        pending=pending,
        deadline_ms=deadline,
        running_version=running,
        pages=pages,
    )
    return SweepFoldResult(new, commands, found, sweep_wakeup(new))
