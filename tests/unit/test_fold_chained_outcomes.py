"""The fold's rule for outcomes of chained reads (`EffectOutcome.answers`, DESIGN §6): the very copy, or stale."""

from __future__ import annotations

from schemas.records import EffectCommand, EffectOutcome, WebhookReceived
from tests.unit.test_fold_driver import ACCOUNT, CONV, Driver, incoming


def driver_waiting_on_its_first_read() -> tuple[Driver, EffectCommand]:
    d = Driver()
    d.chatwoot.messages = [incoming(1, "I was charged twice")]
    d.send(WebhookReceived(at_ms=d.now, account_id=ACCOUNT, conversation_id=CONV, event="message_created"))
    pending = d.queue.pop(0)
    assert d.state.run is not None and d.state.run.pending == pending and pending.op == "get_conversation"
    return d, pending


def outcome_of(d: Driver, command: EffectCommand, **fields: object) -> EffectOutcome:
    result, error, requests = d.chatwoot.execute(command)
    values = {"result": result, "error": error, "requests": requests, **fields}
    return EffectOutcome.model_validate(
        {"at_ms": d.now, "key": command.key, "account_id": ACCOUNT, "command_id": command.command_id, "op": command.op}
        | values
    )


def test_an_outcome_that_names_the_pending_copy_advances_the_run() -> None:
    d, pending = driver_waiting_on_its_first_read()
    d.send(outcome_of(d, pending, answers=pending.digest()))
    assert d.state.run is not None and d.state.run.pending is not None
    assert d.state.run.pending.op == "get_inbox_bot"


def test_an_outcome_that_names_another_copy_of_the_same_step_is_stale() -> None:
    d, pending = driver_waiting_on_its_first_read()
    other = pending.model_copy(update={"at_ms": pending.at_ms + 1})  # same id, another copy
    before = d.state
    d.send(outcome_of(d, pending, answers=other.digest()))
    assert d.state.run == before.run and d.queue == []


def test_an_outcome_for_the_pending_id_but_another_operation_is_stale() -> None:
    d, pending = driver_waiting_on_its_first_read()
    before = d.state
    d.send(outcome_of(d, pending).model_copy(update={"op": "get_inbox_bot", "result": None}))
    assert d.state.run == before.run and d.queue == []


def test_the_digest_names_id_issue_time_and_parameters() -> None:
    _, pending = driver_waiting_on_its_first_read()
    assert pending.digest() == pending.model_copy().digest()
    assert pending.digest() != pending.model_copy(update={"command_id": pending.command_id + "0"}).digest()
    assert pending.digest() != pending.model_copy(update={"at_ms": pending.at_ms + 1}).digest()
