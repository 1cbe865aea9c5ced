"""The route procedure as a deterministic fold (behavior.md §3.5–§10, DESIGN §5–§6).

`fold(state, event, offset, config)` applies one event of a conversation's log and returns the new state, the
effect commands to execute, the next wake-up time and, when a run ends, its turn outcome. The procedure is an
explicit state machine: a run waits for exactly one command at a time (`Run.pending`), and each matching
outcome advances it by one step. "Now" is always the event's `at_ms`; nothing here does I/O.
"""

from __future__ import annotations

from typing import NamedTuple

from projections.guard import (
    ActivityPending,
    apply_turn_read,
    clear_failures,
    expect_activity,
    observe_status,
    record_failure,
    request_handoff,
)
from projections.inputs import build_input, memo_key
from projections.rules import (
    actionable_kind,
    confident_assignee,
    new_labels,
    owns,
    person_assigned,
    requires_handoff,
    should_wait,
)
from projections.turn import is_confirmed_brand_reply
from schemas.config import Kind, RouterConfig
from schemas.configs import ConfigDocument
from schemas.decision import Decision
from schemas.keys import ConversationKey, conversation_key, parse_key, route_command_id
from schemas.records import (
    AgentsResult,
    Assign,
    CannedResult,
    CommandParams,
    ConversationResult,
    ConversationView,
    CreateMessage,
    CreateMessageResult,
    Decide,
    DecideResult,
    EffectCommand,
    EffectOutcome,
    GetConversation,
    GetInboxBot,
    InboxBotResult,
    ListAgents,
    ListCanned,
    ReadTurn,
    ReplyHistoryResult,
    ScanReplyHistory,
    SetLabels,
    SweepFound,
    TimerFired,
    ToggleStatus,
    Transition,
    TurnOutcome,
    TurnResult,
    Unassign,
    WebhookReceived,
)
from schemas.state import ConversationState, Job, Memo, Phase, Purpose, Run

DEFAULT_RETRY_BASE_MS = 5000
MAX_RETRY_DELAY_MS = 1_800_000
REQUEST_TIMEOUT_MS = 60_000  # §4.6: each request may take 60 s
DEADLINE_GRACE_MS = 30_000

Event = WebhookReceived | SweepFound | EffectOutcome | TimerFired


class FoldResult(NamedTuple):
    state: ConversationState
    commands: list[EffectCommand]
    wakeup_ms: int | None
    outcomes: list[TurnOutcome]


def retry_delay(n: int, base_ms: int = DEFAULT_RETRY_BASE_MS) -> int:
    """§4.5: retryDelay(n) = min(base·2^n, 30 min)."""
    return int(min(base_ms * 2**n, MAX_RETRY_DELAY_MS))


def wakeup_of(state: ConversationState) -> int | None:
    """The conversation's next due time: the pending command's deadline, else the job's due time."""
    if state.run is not None and state.run.deadline_ms is not None:
        return state.run.deadline_ms
    return state.job.not_before if state.job is not None else None


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
    key = event.key
    parsed = parse_key(key)
    if not isinstance(parsed, ConversationKey):
        raise ValueError(f"not a conversation key: {key!r}")
    account_id, conversation_id = parsed.account_id, parsed.conversation_id
    folder = _Folder(state, config, account_id, conversation_id, event.at_ms, offset, retry_base_ms)
    folder.apply(event)
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


def _same(part: object, original: object) -> bool:
    """Whether a part of the state is unchanged: the same object (most steps touch few parts) or an equal one."""
    return part is original or part == original


class _Folder:
    """One fold step's working copy; handlers end by issuing one command or by ending the run."""

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

    # --- plumbing ---

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

    def apply(self, event: Event) -> None:
        if isinstance(event, WebhookReceived | SweepFound):
            self.admit(event.transition if isinstance(event, WebhookReceived) else None)
        elif isinstance(event, EffectOutcome):
            self.on_outcome(event)
        else:
            self.on_timer(event)
        self.maybe_start()

    # --- admission and the job (§3.5, §4.2–§4.3) ---

    def admit(self, transition: Transition | None) -> None:
        if not self.config.is_routed(self.account):
            return
        if transition is not None:
            self.guard = expect_activity(self.guard, transition.status, transition.at)
        if self.job is None:
            self.job = Job(not_before=self.now, created_at=self.now)
        else:
            not_before = self.job.not_before if self.job.attempts > 0 else min(self.job.not_before, self.now)
            self.job = self.job.evolve(version=self.job.version + 1, not_before=not_before)

    def maybe_start(self) -> None:
        if self.run is not None or self.job is None or self.job.not_before > self.now:
            return
        self.runs += 1
        self.run = Run(number=self.runs, job_version=self.job.version)
        if not (self.config.is_routed(self.account) and self.account in self.config.routing.bot_ids):
            self.complete("nothing", reason="account_not_routed")
            return
        self.snapshot("initial")

    # --- commands ---

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
            deadline_ms=self.now + cost * REQUEST_TIMEOUT_MS + DEADLINE_GRACE_MS,
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
        cost = run.pending.params.max_requests
        again = run.pending.model_copy(update={"at_ms": self.now})
        self.set_run(pending=again, deadline_ms=self.now + cost * REQUEST_TIMEOUT_MS + DEADLINE_GRACE_MS)
        self.commands.append(again)

    def on_outcome(self, o: EffectOutcome) -> None:
        run = self.run
        if run is None or run.pending is None or o.command_id != run.pending.command_id:
            return  # stale or duplicate
        self.set_run(pending=None, deadline_ms=None, requests=run.requests + o.requests)
        handler = getattr(self, f"on_{run.phase}")
        handler(o)

    # --- run endings (§4.4, §4.7) ---

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
            self.job = self.job.evolve(attempts=0, not_before=self.now)
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
            self.job = self.job.evolve(attempts=self.job.attempts + 1, not_before=self.now + delay)
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

    # --- snapshot (§9.1), disconnect (§9.8), release (§9.9) ---

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
        return o.result.conversation

    def on_snapshot(self, o: EffectOutcome) -> None:
        c = self.conversation_read(o)
        if c is None:
            return
        if c.inbox_id is None or (self.r.inbox_id is not None and c.inbox_id != self.r.inbox_id):
            self.complete("nothing", reason="inbox_changed")
            return
        if c.status != "pending":
            self.guard = observe_status(self.guard, c.status or "open")
            if c.status is not None and owns(c, self.bot_id):
                self.set_run(after_release="nothing")
                self.issue(GetConversation(), "release_read")
                return
            self.complete("nothing", reason="not_pending")
            return
        if c.assignee_type == "AgentBot" and c.assignee_id != self.bot_id:
            self.complete("nothing", reason="other_bot")
            return
        self.set_run(current=c, inbox_id=self.r.inbox_id if self.r.inbox_id is not None else c.inbox_id)
        self.issue(GetInboxBot(inbox_id=c.inbox_id), "inbox_bot")

    def on_inbox_bot(self, o: EffectOutcome) -> None:
        linked = False
        if o.error is None or o.error.kind != "missing":
            if self.failed(o, drop_on_missing=False):
                return
            assert isinstance(o.result, InboxBotResult)
            bot = o.result
            if bot.bot_id is not None and bot.bot_account_id != self.account:
                self.fail("foreign_bot")
                return
            linked = bot.bot_id == self.bot_id
        current = self.r.current
        assert current is not None
        if not linked:
            if owns(current, self.bot_id):
                self.issue(GetConversation(), "disconnect_read")
            else:
                self.complete("nothing", reason="inbox_disconnected_not_ours")
            return
        if current.blocked:
            self.complete("nothing", reason="blocked")
            return
        self.guard = observe_status(self.guard, "pending")
        self.issue(ReadTurn(), "turn")

    def on_disconnect_read(self, o: EffectOutcome) -> None:
        c = self.conversation_read(o)
        if c is None:
            return
        if c.status == "pending" and c.inbox_id == self.r.inbox_id and owns(c, self.bot_id):
            self.issue(ToggleStatus(status="open"), "disconnect_toggle")
        else:
            self.complete("nothing", reason="inbox_disconnected_not_ours")

    def on_disconnect_toggle(self, o: EffectOutcome) -> None:
        if not self.failed(o, drop_on_missing=True):
            self.complete("handed_off", reason="inbox_disconnected")

    def on_release_read(self, o: EffectOutcome) -> None:
        if o.error is not None and o.error.kind == "missing":
            self.finish_release()
            return
        if self.failed(o, drop_on_missing=False):
            return
        assert isinstance(o.result, ConversationResult)
        c = o.result.conversation
        if c.status is not None and c.status != "pending" and owns(c, self.bot_id):
            self.issue(Unassign(), "release_unassign")
        else:
            self.finish_release()

    def on_release_unassign(self, o: EffectOutcome) -> None:
        if not self.failed(o, drop_on_missing=True):
            self.finish_release(released=True)

    def finish_release(self, *, released: bool = False) -> None:
        if self.r.after_release == "ended":
            kind = self._kind()
            self.complete("ended", status=kind[1].status if kind else None, reason=None)
        else:
            self.complete("nothing", reason="released" if released else "not_pending")

    # --- turn read (§6.1–§6.2), input (§6.5), fresh reads (§9.3) ---

    def on_turn(self, o: EffectOutcome) -> None:
        if self.failed(o, drop_on_missing=True):
            return
        assert isinstance(o.result, TurnResult)
        turn = o.result
        try:
            self.guard = apply_turn_read(self.guard, turn)
        except ActivityPending:
            self.fail("activity_pending")
            return
        current = self.r.current
        assert current is not None
        input_ = build_input(turn.messages, current.email_domain)
        public_reply = requires_handoff(turn.messages, self.bot_id)
        if self.r.purpose == "initial":
            self.set_run(first_turn=turn, input_key=input_.key, input_count=input_.count)
            if self.guard.handoff or public_reply or input_.count == 0:
                self.handoff(self._turn_reason(turn, public_reply, input_.count))
                return
            key = memo_key(input_, self.config, self.account)
            self.set_run(memo_key=key)
            memo = self.memos.get(key)
            if memo is not None:
                self.decided(memo.decision)
            else:
                self.issue(Decide(input_key=input_.key, text=input_.text), "decide")
            return
        first = self.r.first_turn
        assert first is not None
        first_boundary = first.boundary.id if first.boundary is not None else 0
        boundary = turn.boundary.id if turn.boundary is not None else 0
        if boundary != first_boundary or input_.key != self.r.input_key:
            self.defer("input_changed")
            return
        handoff = self.guard.handoff or public_reply
        reason = self._turn_reason(turn, public_reply, input_.count) if handoff else None
        purpose = self.r.purpose
        if purpose == "handoff":
            self.issue(ToggleStatus(status="open"), "handoff_toggle")
        elif handoff:
            self.handoff(reason or "handoff_mode", have_current=True)
        elif purpose == "after_decide":
            self.after_fresh_decision()
        elif purpose == "before_send":
            self.issue(CreateMessage(content=self.r.canned_content or ""), "send")
            if self.run is not None:  # issued (not deferred for budget): the ledger goes with the command
                self.ledger = self.ledger.evolve(value="attempted")
        else:
            self.ending()

    def _turn_reason(self, turn: TurnResult, public_reply: bool, count: int) -> str:
        if turn.deleted:
            return "boundary_deleted"
        if not turn.complete:
            return "incomplete_read"
        if self.guard.handoff:
            return "handoff_mode"
        if public_reply:
            return "public_reply"
        return "no_usable_text" if count == 0 else "handoff_mode"

    # --- decision (§7.4–§7.6, §8) ---

    def on_decide(self, o: EffectOutcome) -> None:
        if self.failed(o, drop_on_missing=False):
            return
        assert isinstance(o.result, DecideResult)
        key = self.r.memo_key
        assert key is not None
        self.memos = {**self.memos, key: Memo(decision=o.result.decision, offset=self.offset)}
        self.decided(o.result.decision)

    def decided(self, decision: Decision) -> None:
        kind = actionable_kind(decision, self.config, self.account)
        assignee = confident_assignee(decision, self.config, self.account)
        self.set_run(decision=decision, kind=kind[0] if kind else None, assignee=assignee)
        self.snapshot("after_decide")

    def _kind(self) -> tuple[str, Kind] | None:
        name = self.r.kind
        kinds = self.config.kinds_of(self.account) or {}
        return (name, kinds[name]) if name is not None and name in kinds else None

    def after_fresh_decision(self) -> None:
        r = self.r
        assert r.decision is not None and r.current is not None and r.first_turn is not None
        if should_wait(
            decision=r.decision,
            kind=r.kind,
            count=r.input_count,
            current=r.current,
            messages=r.first_turn.messages,
            now_ms=self.now,
        ):
            self.complete("waited", reason="no_request_yet")
            return
        labels = new_labels(
            decision=r.decision,
            kind=self._kind(),
            current=r.current,
            config=self.config,
            account_id=self.account,
        )
        if labels is not None:
            self.issue(SetLabels(labels=labels), "labels")
        else:
            self.reply_step()

    def on_labels(self, o: EffectOutcome) -> None:
        if not self.failed(o, drop_on_missing=True):
            self.set_run(labeled=True)
            self.reply_step()

    # --- canned reply (§9.7) ---

    def reply_step(self) -> None:
        kind = self._kind()
        if kind is not None and kind[1].canned_response is not None:
            self.issue(ScanReplyHistory(bot_id=self.bot_id), "history")
        else:
            self.agents_step()

    def on_history(self, o: EffectOutcome) -> None:
        if o.error is not None or not isinstance(o.result, ReplyHistoryResult):
            self.handoff("reply_history_unavailable")
            return
        found = o.result.found
        if found == "unknown":
            self.handoff("reply_history_unknown")
        elif found == "found":
            if self.ledger.value is None:
                self.ledger = self.ledger.evolve(value="observed")
            self.agents_step()
        elif self.ledger.value is not None:
            self.handoff("reply_attempted_before")
        else:
            kind = self._kind()
            assert kind is not None and kind[1].canned_response is not None
            self.issue(ListCanned(short_code=kind[1].canned_response), "canned")

    def on_canned(self, o: EffectOutcome) -> None:
        if self.failed(o, drop_on_missing=False):
            return
        assert isinstance(o.result, CannedResult)
        content = o.result.content
        if content is None or not content.strip():
            self.handoff("canned_response_missing")
            return
        self.set_run(canned_content=content)
        self.snapshot("before_send")

    def on_send(self, o: EffectOutcome) -> None:
        receipt = o.result.message if isinstance(o.result, CreateMessageResult) else None
        if (
            o.error is None
            and receipt is not None
            and is_confirmed_brand_reply(receipt, self.bot_id)
            and receipt.conversation_id == self.conversation
        ):
            self.set_run(replied=True, canned_content=None)
            self.agents_step()
        else:
            self.set_run(canned_content=None)
            self.handoff("reply_unconfirmed")

    # --- ending (§9.5 steps 10–12) ---

    def agents_step(self) -> None:
        kind = self._kind()
        if self.r.assignee is not None and not (kind is not None and kind[1].status is not None):
            self.issue(ListAgents(), "agents")
        else:
            self.snapshot("before_end")

    def on_agents(self, o: EffectOutcome) -> None:
        if self.failed(o, drop_on_missing=False):
            return
        assert isinstance(o.result, AgentsResult)
        if self.r.assignee not in o.result.agent_ids:
            self.handoff("assignee_not_an_agent")
        else:
            self.snapshot("before_end")

    def ending(self) -> None:
        kind = self._kind()
        current = self.r.current
        assert current is not None
        if kind is not None and kind[1].status is not None:
            self.issue(ToggleStatus(status=kind[1].status), "ending")
        elif self.r.assignee is not None and current.assignee_type == "AgentBot":
            self.issue(Assign(assignee_id=self.r.assignee), "ending")
        elif person_assigned(current):
            self.handoff("person_assigned", have_current=True)
        elif self.r.assignee is not None:
            self.handoff("not_bot_assigned", have_current=True)
        else:
            self.handoff("unclear_owner", have_current=True)

    def on_ending(self, o: EffectOutcome) -> None:
        if self.failed(o, drop_on_missing=True):
            return
        pending_op = o.op
        if pending_op == "toggle_status":
            kind = self._kind()
            assert kind is not None and kind[1].status is not None
            self.guard = expect_activity(self.guard, kind[1].status)
            self.set_run(after_release="ended")
            self.issue(GetConversation(), "release_read")
        else:
            self.guard = expect_activity(self.guard, "open")
            self.complete("assigned", assignee_id=self.r.assignee)

    # --- handoff (§9.4) ---

    def handoff(self, reason: str, *, have_current: bool = False) -> None:
        self.guard = request_handoff(self.guard)
        self.set_run(handoff_reason=reason)
        if have_current:
            self.issue(ToggleStatus(status="open"), "handoff_toggle")
        else:
            self.snapshot("handoff")

    def on_handoff_toggle(self, o: EffectOutcome) -> None:
        if not self.failed(o, drop_on_missing=True):
            self.complete("handed_off", reason=self.r.handoff_reason)


__all__ = ["DEFAULT_RETRY_BASE_MS", "FoldResult", "fold", "retry_delay", "wakeup_of"]
