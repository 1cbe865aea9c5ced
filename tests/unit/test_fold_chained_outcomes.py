"""The fold's rule for outcomes of chained reads (`EffectOutcome.answers`, DESIGN §6): the very copy, or stale."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from projections.fold import fold, fold_parts, parts_of
from schemas.records import CONVERSATION_READS, ChainedOutcomes, EffectCommand, EffectOutcome, WebhookReceived
from schemas.state import ConversationState
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


# --- ChainedOutcomes: the outcomes of reads run back to back, one event ----------------------------------------


def reads_until_a_non_read(d: Driver, first: EffectCommand) -> tuple[list[EffectOutcome], ConversationState]:
    """Run the reads the fold issues one after the other from `first` (as the worker chains them), folding on a
    scratch copy of the state; returns their outcomes and the state the last one leaves."""
    scratch = Driver(chatwoot=d.chatwoot, config=d.config, state=d.state, offset=d.offset, now=d.now)
    outcomes, command, copy = [], first, False
    while command.op in CONVERSATION_READS:
        outcome = outcome_of(scratch, command, answers=command.digest() if copy else None)
        outcomes.append(outcome)
        scratch.send(outcome)
        if len(scratch.queue) != 1:
            break
        command, copy = scratch.queue.pop(0), True
    return outcomes, scratch.state


def test_a_chain_folds_as_its_outcomes_would_one_by_one() -> None:
    d, pending = driver_waiting_on_its_first_read()
    parts, separately = reads_until_a_non_read(d, pending)
    assert [p.op for p in parts] == ["get_conversation", "get_inbox_bot", "read_turn"]
    result = d.send(ChainedOutcomes.of(parts))
    # the same state as three events would leave (but for the offset), and only the command that did not run yet
    assert _offsets_zeroed(result.state) == _offsets_zeroed(separately)
    assert [c.op for c in result.commands] == ["decide"]
    assert result.state.run is not None and result.state.run.pending == result.commands[0]
    assert separately.run is not None and result.state.run.requests == separately.run.requests


def _offsets_zeroed(state: ConversationState) -> ConversationState:
    """The state with the offsets it records zeroed (a chain's parts all fold at the chain's offset)."""
    return state.model_copy(
        update={
            "offset": 0,
            **{
                name: getattr(state, name).model_copy(update={"offset": 0})
                for name in ("guard", "ledger", "job", "run")
                if getattr(state, name) is not None
            },
        }
    )


def test_a_chain_delivered_again_changes_nothing() -> None:
    d, pending = driver_waiting_on_its_first_read()
    parts, _ = reads_until_a_non_read(d, pending)
    chain = ChainedOutcomes.of(parts)
    d.send(chain)
    after = d.state
    again = fold(after, chain, d.offset, d.config)
    assert again.state is after and again.commands == [] and again.outcomes == []


def test_a_chain_whose_first_read_the_run_no_longer_awaits_is_stale_as_a_whole() -> None:
    d, pending = driver_waiting_on_its_first_read()
    parts, _ = reads_until_a_non_read(d, pending)
    d.now += 5
    d.send(outcome_of(d, pending))  # the first read's outcome came on its own, later (a read made twice)
    before = d.state
    result = d.send(ChainedOutcomes.of(parts))
    # the chained reads answer copies of the next steps issued at another time: none is taken
    assert result.commands == [] and result.state.run == before.run


def test_a_chain_that_parts_from_the_fold_sends_the_command_left_unanswered() -> None:
    d, pending = driver_waiting_on_its_first_read()
    parts, _ = reads_until_a_non_read(d, pending)
    wrong = parts[1].model_copy(update={"answers": "0" * 32})  # as if the worker had folded another state
    result = d.send(ChainedOutcomes.of([parts[0], wrong, parts[2]]))
    # the inbox read the fold issued was not answered: it goes out, and the run waits for it
    assert [c.op for c in result.commands] == ["get_inbox_bot"]
    assert result.state.run is not None and result.state.run.pending == result.commands[0]


def test_a_chain_holds_the_reads_of_one_conversation_only() -> None:
    d, pending = driver_waiting_on_its_first_read()
    parts, _ = reads_until_a_non_read(d, pending)
    with pytest.raises(ValidationError):
        ChainedOutcomes(key="1:999", account_id=ACCOUNT, outcomes=parts, at_ms=d.now)
    decide = parts[0].model_copy(update={"op": "decide", "result": None})
    with pytest.raises(ValidationError):
        ChainedOutcomes.of([parts[0], decide])
    with pytest.raises(ValidationError):
        ChainedOutcomes(key=parts[0].key, account_id=ACCOUNT, outcomes=[], at_ms=d.now)


def test_every_part_of_a_chain_is_shown_as_its_own_step() -> None:
    d, pending = driver_waiting_on_its_first_read()
    parts, _ = reads_until_a_non_read(d, pending)
    chain = ChainedOutcomes.of(parts)
    assert parts_of(chain) == tuple(parts)
    webhook = d.log[0][1]
    assert parts_of(webhook) == (webhook,)
    # part by part (audit, console): each step on the state the previous one left, ending where the fold ends
    steps = list(fold_parts(d.state, chain, d.offset + 1, d.config))
    assert [part for part, _ in steps] == parts
    assert [[c.op for c in result.commands] for _, result in steps] == [["get_inbox_bot"], ["read_turn"], ["decide"]]
    assert steps[-1][1].state == fold(d.state, chain, d.offset + 1, d.config).state
