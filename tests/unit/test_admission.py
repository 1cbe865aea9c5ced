"""The effect side executes a command only while its run awaits that very copy (projections.worker.admission)."""

from __future__ import annotations

from projections.worker.admission import Attempt, admit, needs_attempt_record
from schemas.records import EffectCommand, GetConversation, ReadTurn, SetLabels, ToggleStatus
from tests.unit.test_fold_driver import ACCOUNT, CONV, T0, Driver, incoming


def command(params: object, *, step: int = 1, at_ms: int = T0) -> EffectCommand:
    key = f"{ACCOUNT}:{CONV}"
    return EffectCommand.model_validate(
        {"at_ms": at_ms, "key": key, "account_id": ACCOUNT, "command_id": f"{key}:1:{step}", "params": params}
    )


def test_the_awaited_copy_is_executed() -> None:
    labels = command(SetLabels(labels=("billing",)))
    assert admit(labels, awaited=labels, attempted=None) == "execute"


def test_a_command_whose_run_moved_on_or_ended_is_stale() -> None:
    labels = command(SetLabels(labels=("billing",)), step=4)
    later = command(ToggleStatus(status="resolved"), step=5)
    assert admit(labels, awaited=later, attempted=None) == "stale"
    assert admit(labels, awaited=None, attempted=None) == "stale"


def test_an_older_copy_of_a_reissued_command_is_stale() -> None:
    first = command(ToggleStatus(status="resolved"), at_ms=T0)
    reissued = first.model_copy(update={"at_ms": T0 + 90_000})
    assert admit(first, awaited=reissued, attempted=None) == "stale"
    assert admit(reissued, awaited=reissued, attempted=Attempt.of(first)) == "execute"


def test_a_started_mutation_is_never_started_again_for_the_same_issue() -> None:
    status = command(ToggleStatus(status="resolved"))
    assert admit(status, awaited=status, attempted=Attempt.of(status, "worker-a")) == "redelivered"


def test_reads_may_repeat_but_mutations_decide_and_replies_are_recorded() -> None:
    assert not needs_attempt_record(command(GetConversation()))
    assert not needs_attempt_record(command(ReadTurn()))
    read = command(GetConversation())
    assert admit(read, awaited=read, attempted=Attempt.of(read)) == "execute"
    for params in (
        {"op": "set_labels", "labels": ["a"]},
        {"op": "toggle_status", "status": "open"},
        {"op": "assign", "assignee_id": 7},
        {"op": "unassign"},
        {"op": "create_message", "content": "hi"},
        {"op": "decide", "input_key": "k", "text": "t"},
    ):
        assert needs_attempt_record(command(params)), params


def test_after_a_routed_turn_every_command_of_it_is_stale() -> None:
    """The scenario of a redelivery after a crash: the whole run's commands come again once it has ended."""
    driver = Driver()
    driver.chatwoot.messages.append(incoming(1, "I was charged twice, please refund my invoice"))
    driver.webhook()
    assert driver.state.run is None and driver.commands
    mutations = [c for c in driver.commands if needs_attempt_record(c)]
    assert mutations, "the run made mutations"
    for issued in driver.commands:
        assert admit(issued, awaited=None, attempted=None) == "stale"


def test_during_a_run_only_the_command_it_waits_for_is_admitted() -> None:
    driver = Driver()
    driver.chatwoot.messages.append(incoming(1, "I was charged twice, please refund my invoice"))
    driver.chatwoot.lost["assign"] = 1  # the assignment's outcome is lost: the run waits on it
    driver.webhook()
    assert driver.state.run is not None and driver.state.run.pending is not None
    awaited = driver.state.run.pending
    assert awaited.op == "assign"
    verdicts = {c.command_id: admit(c, awaited=awaited, attempted=None) for c in driver.commands}
    assert verdicts.pop(awaited.command_id) == "execute"
    assert set(verdicts.values()) == {"stale"}
