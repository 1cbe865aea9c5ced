"""Jobs, failures, handoff mode, concurrency, the budget and idempotency (behavior.md §4, §6.2–§6.4)."""

from __future__ import annotations

from projections.fold import fold, retry_delay
from schemas.records import EffectOutcome, TimerFired, WebhookReceived
from tests.unit.test_fold_driver import (
    ACCOUNT,
    BOT,
    CONV,
    T0,
    Driver,
    FakeChatwoot,
    activity,
    incoming,
    make_config,
)


def make(**chatwoot: object) -> Driver:
    fake = FakeChatwoot(**chatwoot)  # type: ignore[arg-type]
    fake.messages = [incoming(1, "My invoice is wrong")]
    return Driver(chatwoot=fake)


def test_retry_delay_doubles_from_the_base_up_to_30_minutes() -> None:
    assert [retry_delay(n) for n in (0, 1, 2, 3, 8, 9, 20)] == [
        5000,
        10000,
        20000,
        40000,
        1_280_000,
        1_800_000,
        1_800_000,
    ]
    assert retry_delay(2, base_ms=10) == 40


def test_three_failures_back_off_5_10_20_s_then_handoff_mode_skips_jev() -> None:
    d = make()
    d.chatwoot.fail("decide", times=3)
    d.webhook()
    delays = []
    for _ in range(3):
        assert d.last().result == "retry"
        delays.append(d.wakeup - d.now)  # type: ignore[operator]
        if len(delays) < 3:
            d.tick()
    assert delays == [5000, 10000, 20000]
    assert d.state.guard.handoff and d.state.guard.failures == 3
    d.tick()
    assert d.chatwoot.ops().count("decide") == 3
    assert d.last().result == "handed_off" and d.last().reason == "handoff_mode"
    assert d.state.guard.failures == 0 and d.state.job is None


def test_retry_base_is_a_parameter() -> None:
    d = make()
    d.retry_base_ms = 10
    d.chatwoot.fail("get_conversation", kind="timeout", status=None)
    d.webhook()
    assert d.wakeup == d.now + 10


def test_a_webhook_during_backoff_neither_shortens_it_nor_resets_failures() -> None:
    d = make()
    d.chatwoot.fail("decide")
    d.webhook()
    due = d.wakeup
    d.now += 1000
    d.webhook()
    assert d.wakeup == due and d.state.guard.failures == 1 and d.state.job is not None
    assert d.state.job.version == 2 and d.state.job.attempts == 1


def test_a_status_transition_resets_the_failure_count() -> None:
    d = make()
    d.chatwoot.fail("decide")
    d.webhook()
    d.webhook(transition=("pending", T0 / 1000 + 1), event="conversation_status_changed")
    assert d.state.guard.failures == 0
    assert d.state.guard.expected is not None and d.state.guard.expected.status == "pending"


def test_expected_activity_not_visible_yet_is_a_failure_until_handoff_mode() -> None:
    d = make()
    d.webhook(transition=("pending", T0 / 1000), event="conversation_status_changed")
    assert d.last().reason == "activity_pending"
    d.tick()
    d.tick()
    assert d.state.guard.handoff
    d.tick()
    assert d.last().result == "handed_off" and "decide" not in d.chatwoot.ops()


def test_the_expected_activity_appearing_lets_the_turn_proceed() -> None:
    d = make()
    d.chatwoot.messages = [incoming(1, "old"), activity(2, "pending", created_at=T0 / 1000 + 5)]
    d.chatwoot.messages.append(incoming(3, "new question"))
    d.webhook(transition=("pending", T0 / 1000 + 5.7), event="conversation_status_changed")
    assert d.last().result == "assigned"
    assert d.state.guard.boundary == 2 and d.state.guard.claimed is True


def test_status_webhook_between_two_steps_is_honoured_by_the_next_read() -> None:
    d = make()
    d.chatwoot.lost = {"decide": 1}
    d.webhook()
    run = d.state.run
    assert run is not None and run.phase == "decide"
    d.webhook(transition=("pending", T0 / 1000 + 30), event="conversation_status_changed")
    assert d.state.run is not None and d.state.job is not None and d.state.job.version == 2
    # the overdue decide is re-issued with the same id; the fresh read then sees no activity: retry
    decide_id = next(c for c in d.commands if c.op == "decide").command_id
    d.tick()
    assert [c.command_id for c in d.commands if c.op == "decide"] == [decide_id, decide_id]
    assert d.last().reason == "activity_pending"


def test_a_webhook_while_running_reruns_the_job_after_completion() -> None:
    d = make()
    d.chatwoot.lost = {"decide": 1}
    d.webhook()
    d.webhook()  # merged into the running job
    d.tick()  # the decide is re-issued, the run completes, the job runs again at once
    runs = {o.run for o in d.outcomes}
    assert runs == {1, 2}
    assert d.state.job is None


def test_input_changed_under_the_fresh_read_defers_and_decides_again() -> None:
    d = make()
    original = d.chatwoot.execute
    seen = {"decide": 0}

    def execute(command):  # type: ignore[no-untyped-def]
        if command.op == "decide":
            seen["decide"] += 1
            if seen["decide"] == 1:
                d.chatwoot.messages.append(incoming(2, "and also my order"))
        return original(command)

    d.chatwoot.execute = execute  # type: ignore[method-assign]
    d.webhook()
    results = [o.result for o in d.outcomes]
    assert results == ["deferred", "assigned"]
    decides = [c.params.model_dump()["input_key"] for c in d.commands if c.op == "decide"]
    assert decides == ["1", "1,2"]
    assert d.state.guard.failures == 0


def test_a_run_that_would_exceed_the_budget_is_deferred_with_a_fresh_budget_next() -> None:
    d = make()
    d.chatwoot.cost = {"decide": 40}
    d.webhook()
    assert d.outcomes[0].result == "deferred" and d.outcomes[0].reason == "budget"
    assert d.last().result == "assigned"  # the next run hits the memo and fits


def test_an_already_applied_offset_changes_nothing() -> None:
    d = make()
    d.chatwoot.lost = {"decide": 1}
    d.webhook()
    offset, event = d.log[-1]
    again = fold(d.state, event, offset, d.config)
    assert again.state == d.state and again.commands == [] and again.outcomes == []


def test_an_outcome_the_run_is_not_waiting_for_is_ignored() -> None:
    d = make()
    d.chatwoot.lost = {"decide": 1}
    d.webhook()
    before = d.state
    d.send(
        EffectOutcome(
            at_ms=d.now,
            key=f"{ACCOUNT}:{CONV}",
            account_id=ACCOUNT,
            command_id="1:2:9:9",
            op="decide",
            requests=1,
        )
    )
    assert d.state.model_copy(update={"offset": before.offset}) == before and d.queue == []


def test_an_early_timer_does_nothing_and_the_wakeup_is_the_command_deadline() -> None:
    d = make()
    d.chatwoot.lost = {"read_turn": 1}
    d.webhook()
    deadline = d.wakeup
    assert deadline is not None and deadline > d.now
    d.send(TimerFired(at_ms=deadline - 1, key=f"{ACCOUNT}:{CONV}", due_ms=deadline - 1))
    assert d.queue == []
    d.tick()
    assert d.chatwoot.ops()[:5] == ["get_conversation", "get_inbox_bot", "read_turn", "read_turn", "decide"]
    reads = [c.command_id for c in d.commands if c.op == "read_turn"]
    assert reads[0] == reads[1]
    assert d.last().result == "assigned"


def test_account_removed_from_configuration_completes_the_job() -> None:
    d = make()
    d.chatwoot.fail("decide")
    d.webhook()
    d.config = make_config(botIds={"4": BOT}, accounts={"4": {"x": {"assignee": 1, "covers": "c"}}}, kinds=None)
    d.tick()
    assert d.last().reason == "account_not_routed" and d.state.job is None


def test_a_resume_timer_reissues_the_lost_read_at_once_with_the_same_id() -> None:
    d = make()
    d.chatwoot.lost = {"read_turn": 1}
    d.webhook()
    deadline = d.wakeup
    assert deadline is not None and deadline > d.now
    # a worker that has just taken the partition over resumes well before the deadline
    d.send(TimerFired(at_ms=d.now + 1, key=f"{ACCOUNT}:{CONV}", due_ms=deadline, resume=True))
    d.settle()
    reads = [c.command_id for c in d.commands if c.op == "read_turn"]
    assert len(reads) >= 2 and reads[0] == reads[1]
    assert d.last().result == "assigned"


def test_a_resume_timer_never_resends_a_reply_and_the_deadline_still_decides() -> None:
    from tests.unit.test_fold_reply import refund

    d = refund(lost={"create_message": 1})
    d.webhook()
    assert d.state.run is not None and d.state.run.phase == "send"
    d.send(TimerFired(at_ms=d.now + 1, key=f"{ACCOUNT}:{CONV}", due_ms=d.wakeup or 0, resume=True))
    assert d.queue == [] and d.state.run.phase == "send"
    d.tick()  # the deadline passes: an unconfirmed reply, handed off, never sent twice
    assert d.chatwoot.ops().count("create_message") == 1
    assert d.last().reason == "reply_unconfirmed"


def test_a_resume_timer_without_a_run_in_progress_changes_nothing_but_the_offset() -> None:
    d = make()
    d.webhook()
    before = d.state
    d.send(TimerFired(at_ms=d.now + 1, key=f"{ACCOUNT}:{CONV}", due_ms=d.now + 1, resume=True))
    assert d.queue == []
    assert d.state.model_copy(update={"offset": before.offset}) == before


def test_a_resume_decided_before_the_outcome_arrived_does_not_double_the_next_command() -> None:
    """A takeover decided to resume the run waiting on the turn read; the read's outcome (from the worker that
    gave the partition up) is folded first and the run issues its next command: the resume then re-issues
    nothing, so that command is executed once."""
    d = make()
    d.chatwoot.lost = {"read_turn": 1}
    d.webhook()
    awaited_deadline = d.wakeup
    assert d.state.run is not None and d.state.run.pending is not None
    lost_read = d.state.run.pending
    d.now += 1
    # the read's outcome arrives after all (the old owner finished it while giving the partition up)
    result, error, requests = d.chatwoot.execute(lost_read)
    d.send(
        EffectOutcome(
            at_ms=d.now,
            key=lost_read.key,
            account_id=ACCOUNT,
            command_id=lost_read.command_id,
            op="read_turn",
            result=result,
            error=error,
            requests=requests,
        )
    )
    assert d.state.run is not None and d.state.run.pending is not None
    next_command = d.state.run.pending
    assert next_command.op != "read_turn"
    issued = len(d.commands)
    d.send(TimerFired(at_ms=d.now + 1, key=f"{ACCOUNT}:{CONV}", due_ms=awaited_deadline or 0, resume=True))
    assert len(d.commands) == issued and d.state.run.pending == next_command


def test_the_turn_read_is_budgeted_at_six_requests_a_conversation_read_and_five_pages() -> None:
    """A turn read makes up to 6 requests; with 5 left in the budget (45) it is deferred instead of overrunning."""
    d = make()
    d.send(WebhookReceived(at_ms=d.now, account_id=ACCOUNT, conversation_id=CONV, event="message_created"))
    for expected_op in ("get_conversation", "get_inbox_bot"):
        command = d.queue.pop(0)
        assert command.op == expected_op
        result, error, _ = d.chatwoot.execute(command)
        d.send(
            EffectOutcome(
                at_ms=d.now,
                key=command.key,
                account_id=ACCOUNT,
                command_id=command.command_id,
                op=command.op,
                result=result,
                error=error,
                requests=20,
            )
        )
    assert [c.op for c in d.queue] != ["read_turn"]
    assert d.outcomes[0].result == "deferred" and d.outcomes[0].reason == "budget"
