"""One route fold step's working copy (DESIGN §6): the run machinery every phase uses.

A `Folder` holds the parts of a conversation's state while one event is folded. It starts runs, issues the
run's one pending command (or defers the run when the command could exceed the request budget, §4.6), re-issues
an overdue command, and ends runs (§4.4, §4.7). What each phase does with its command's outcome is in the
phase modules next to this one; `projections.fold` dispatches an outcome to its phase's handler.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

from projections.guard import clear_failures, expect_activity, record_failure, request_handoff
from projections.jobs import backed_off, command_deadline, due_again, merged, retry_delay
from schemas.config import Kind, RouterConfig
from schemas.keys import conversation_key, route_command_id
from schemas.records import (
    CommandParams,
    ConversationResult,
    ConversationView,
    EffectCommand,
    EffectOutcome,
    GetConversation,
    TimerFired,
    ToggleStatus,
    Transition,
    TurnOutcome,
)
from schemas.state import ConversationState, Job, Phase, Purpose, Run


class FoldResult(NamedTuple):
    state: ConversationState
    commands: list[EffectCommand]
    wakeup_ms: int | None
    outcomes: list[TurnOutcome]


def wakeup_of(state: ConversationState) -> int | None:
    """The conversation's next due time: the pending command's deadline, else the job's due time."""
    if state.run is not None and state.run.deadline_ms is not None:
        return state.run.deadline_ms
    return state.job.not_before if state.job is not None else None


def _same(part: object, original: object) -> bool:
    """Whether a part of the state is unchanged: the same object (most steps touch few parts) or an equal one.
    The parts are frozen models with no extra or private values, so equal means the same class and equal fields
    (what pydantic's `==` decides for them, without its generic checks)."""
    return part is original or (type(part) is type(original) and part.__dict__ == original.__dict__)


class Folder:
    """One fold step's working copy; phase handlers end by issuing one command or by ending the run."""

    def __init__(
        self,
        state: ConversationState,
        config: RouterConfig,
        account_id: int,
        conversation_id: int,
        now: int,
        offset: int,
        retry_base_ms: int,
    ) -> None:
        self.original = state
        self.config = config
        self.account = account_id
        self.conversation = conversation_id
        self.key = conversation_key(account_id, conversation_id)
        self.now = now
        self.offset = offset
        self.retry_base_ms = retry_base_ms
        self.guard = state.guard
        self.ledger = state.ledger
        self.memos = state.memos
        self.job = state.job
        self.run = state.run
        self.runs = state.runs
        self.commands: list[EffectCommand] = []
        self.outcomes: list[TurnOutcome] = []

    @property
    def bot_id(self) -> int:
        return self.config.routing.bot_ids[self.account]

    @property
    def r(self) -> Run:
        assert self.run is not None
        return self.run

    def set_run(self, **update: object) -> None:
        self.run = self.r.evolve(**update)

    def finish(self) -> FoldResult:
        o = self.original
        at = self.offset
        guard = self.guard if _same(self.guard, o.guard) else self.guard.evolve(offset=at)
        ledger = self.ledger if _same(self.ledger, o.ledger) else self.ledger.evolve(offset=at)
        job = self.job if self.job is None or _same(self.job, o.job) else self.job.evolve(offset=at)
        run = self.run if self.run is None or _same(self.run, o.run) else self.run.evolve(offset=at)
        state = o.evolve(
            offset=at,
            guard=guard,
            ledger=ledger,
            memos=self.memos,
            job=job,
            run=run,
            runs=self.runs,
        )
        return FoldResult(state, self.commands, wakeup_of(state), self.outcomes)

    def admit(self, transition: Transition | None) -> None:
        if not self.config.is_routed(self.account):
            return
        if transition is not None:
            self.guard = expect_activity(self.guard, transition.status, transition.at)
        if self.job is None:
            self.job = Job(not_before=self.now, created_at=self.now)
        else:
            self.job = merged(self.job, self.now)

    def maybe_start(self) -> None:
        if self.run is not None or self.job is None or self.job.not_before > self.now:
            return
        self.runs += 1
        self.run = Run(number=self.runs, job_version=self.job.version)
        if not (self.config.is_routed(self.account) and self.account in self.config.routing.bot_ids):
            self.complete("nothing", reason="account_not_routed")
            return
        self.snapshot("initial")

    def issue(self, params: CommandParams, phase: Phase) -> None:
        """Emit the run's next command, or defer the run when it could exceed the request budget (§4.6)."""
        cost = params.max_requests
        if self.r.requests + cost > self.config.subrequest_budget:
            self.defer("budget")
            return
        step = self.r.step + 1
        command = EffectCommand(
            at_ms=self.now,
            key=self.key,
            account_id=self.account,
            command_id=route_command_id(self.key, self.r.number, step),
            params=params,
        )
        self.set_run(
            step=step,
            phase=phase,
            pending=command,
            deadline_ms=command_deadline(self.now, cost),
        )
        self.commands.append(command)

    def on_timer(self, event: TimerFired) -> None:
        run = self.run
        if run is None or run.pending is None:
            return
        overdue = run.deadline_ms is not None and self.now >= run.deadline_ms
        if run.pending.params.op == "create_message":
            if overdue:  # §9.7: never re-sent; a lost receipt is an unconfirmed reply
                self.set_run(pending=None, deadline_ms=None)
                self.handoff("reply_unconfirmed")
            return
        # a resume re-issues only the command it was decided for: if the run has issued another one since (its
        # outcome was folded first), that newer command is already on its way and must not be doubled
        if not (overdue or (event.resume and event.due_ms == run.deadline_ms)):
            return
        if run.phase in RECHECK_BEFORE:
            # the mutation may have happened, and a person may have acted since its fresh read (§12.1): its fresh
            # read again, whose rules decide again whether it is still to be made
            self.reread()
            return
        cost = run.pending.params.max_requests
        again = run.pending.model_copy(update={"at_ms": self.now})
        self.set_run(pending=again, deadline_ms=command_deadline(self.now, cost))
        self.commands.append(again)

    def _outcome(self, result: str, **fields: object) -> None:
        r = self.r
        self.outcomes.append(
            TurnOutcome.model_validate(
                {
                    "key": self.key,
                    "run": r.number,
                    "at_ms": self.now,
                    "result": result,
                    "labeled": r.labeled,
                    "replied": r.replied,
                    **fields,
                }
            )
        )

    def complete(self, result: str, **fields: object) -> None:
        """Normal return: clear the failure count; re-arm the job if it was merged meanwhile."""
        self._outcome(result, **fields)
        self.guard = clear_failures(self.guard)
        if self.job is not None and self.job.version != self.r.job_version:
            self.job = due_again(self.job, self.now)
        else:
            self.job = None
        self.run = None

    def defer(self, reason: str) -> None:
        """Due again now, no failure counted; the next run re-decides with a fresh budget."""
        self._outcome("deferred", reason=reason)
        if self.job is not None:
            self.job = self.job.evolve(not_before=self.now)
        self.run = None

    def drop(self) -> None:
        """Conversation deleted (JSON 404 on a list or mutation): the job is deleted (§10.3)."""
        self._outcome("dropped", reason="conversation_deleted")
        self.job = None
        self.run = None

    def fail(self, reason: str) -> None:
        """Any other error: count it on the turn guard and back off (§4.5)."""
        self.guard = record_failure(self.guard)
        delay = retry_delay(self.guard.failures - 1, self.retry_base_ms)
        self._outcome("retry", reason=reason, failures=self.guard.failures, delay_ms=delay)
        if self.job is not None:
            self.job = backed_off(self.job, self.now, delay)
        self.run = None

    def failed(self, o: EffectOutcome, *, drop_on_missing: bool) -> bool:
        """Handle an error outcome the ordinary way; True when the run ended."""
        if o.error is None and o.result is not None:
            return False
        if o.error is not None and o.error.kind == "missing" and drop_on_missing:
            self.drop()
        elif o.error is not None and o.error.code is not None:
            self.fail(o.error.code)  # a cause someone must fix (Decisions 9): named, so operators can find it
        else:
            what = o.error.kind if o.error is not None else "no_result"
            status = f"_{o.error.status}" if o.error is not None and o.error.status is not None else ""
            self.fail(f"{o.op}_{what}{status}")
        return True

    def snapshot(self, purpose: Purpose) -> None:
        self.set_run(purpose=purpose)
        self.issue(GetConversation(), "snapshot")

    def conversation_read(self, o: EffectOutcome) -> ConversationView | None:
        """The conversation a get_conversation outcome read; None when the run ended (missing or failed)."""
        if o.error is not None and o.error.kind == "missing":
            self.complete("nothing", reason="conversation_missing")
            return None
        if self.failed(o, drop_on_missing=False):
            return None
        assert isinstance(o.result, ConversationResult)
        self.saw(o.result.conversation)
        return o.result.conversation

    def saw(self, c: ConversationView) -> None:
        """Remember how recent the conversation read is: a status change Chatwoot reports after it stops the
        mutation this read allows (`projections.worker.admission.changed_since_read`)."""
        self.set_run(read_updated_at=c.updated_at)

    def reread(self) -> None:
        """Make the fresh read before the awaited mutation again instead of the mutation (`RECHECK_BEFORE`)."""
        recheck = RECHECK_BEFORE.get(self.r.phase)
        if recheck is None:
            return
        self.set_run(pending=None, deadline_ms=None)
        recheck(self)

    def kind(self) -> tuple[str, Kind] | None:
        name = self.r.kind
        kinds = self.config.kinds_of(self.account) or {}
        return (name, kinds[name]) if name is not None and name in kinds else None

    def handoff(self, reason: str, *, have_current: bool = False) -> None:
        self.guard = request_handoff(self.guard)
        self.set_run(handoff_reason=reason)
        if have_current:
            self.issue(ToggleStatus(status="open"), "handoff_toggle")
        else:
            self.snapshot("handoff")


NOT_MADE = frozenset({"stale_read", "throttled"})
"""Error kinds of a mutation the worker did not make (never a failure): its fresh read was too old, or Chatwoot's
rate limit refused every try until its deadline came near."""

RECHECK_BEFORE: dict[Phase, Callable[[Folder], None]] = {
    "labels": lambda f: f.snapshot("after_decide"),
    "ending": lambda f: f.snapshot("before_end"),
    "handoff_toggle": lambda f: f.snapshot("handoff"),
    "release_unassign": lambda f: f.issue(GetConversation(), "release_read"),
    "disconnect_toggle": lambda f: f.issue(GetConversation(), "disconnect_read"),
}
"""For each phase that waits on a mutation, the fresh read that comes before it in the route procedure: what an
overdue or resumed mutation re-issues instead of the mutation (its outcome is unknown; the call may have
happened). The read's phase handler then makes the mutation again only if it still applies to the conversation
as it is now, so a person's change since the first attempt is never undone (DESIGN §6, behavior.md §12.1)."""
