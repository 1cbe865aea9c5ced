"""The canned reply (behavior.md §9.7): once per conversation, ever; ledger before the send."""

from __future__ import annotations

from schemas.records import EffectError
from tests.unit.test_fold_driver import BOT, T0, Driver, FakeChatwoot, activity, decision, incoming, outgoing


def refund(*messages: object, **chatwoot: object) -> Driver:
    fake = FakeChatwoot(decision=decision(kind="refund"), **chatwoot)  # type: ignore[arg-type]
    fake.messages = list(messages) or [incoming(1, "I want my money back")]  # type: ignore[arg-type]
    return Driver(chatwoot=fake)


def test_reply_is_sent_once_with_the_trimmed_short_code_then_the_owner_is_assigned() -> None:
    d = refund()
    d.webhook()
    ops = d.chatwoot.ops()
    assert ops[ops.index("set_labels") :] == [
        "set_labels",
        "scan_reply_history",
        "list_canned",
        "get_conversation",
        "get_inbox_bot",
        "read_turn",
        "create_message",
        "list_agents",
        "get_conversation",
        "get_inbox_bot",
        "read_turn",
        "assign",
    ]
    canned = next(c for c in d.commands if c.op == "list_canned")
    assert canned.params.model_dump() == {"op": "list_canned", "short_code": "refund"}
    send = next(c for c in d.commands if c.op == "create_message")
    assert send.params.model_dump() == {"op": "create_message", "content": "We refund within 5 days."}
    assert d.state.ledger.value == "attempted"
    assert d.last().result == "assigned" and d.last().replied


def test_ledger_is_written_in_the_same_step_that_emits_the_send() -> None:
    d = refund(lost={"create_message": 1})
    d.webhook()
    assert d.chatwoot.ops()[-1] == "create_message"
    assert d.state.ledger.value == "attempted"
    assert d.state.run is not None and d.state.run.phase == "send"


def test_lost_send_receipt_is_never_resent_and_hands_off() -> None:
    d = refund(lost={"create_message": 1})
    d.webhook()
    d.tick()  # the command's deadline passes
    assert d.chatwoot.ops().count("create_message") == 1
    assert d.last().result == "handed_off" and d.last().reason == "reply_unconfirmed"
    assert d.chatwoot.conversation.status == "open"
    # a late receipt for the abandoned command changes nothing
    before = d.state
    stale = next(c for c in d.commands if c.op == "create_message")
    from schemas.records import EffectOutcome

    d.send(
        EffectOutcome(
            at_ms=d.now,
            key=stale.key,
            account_id=1,
            command_id=stale.command_id,
            op="create_message",
            requests=1,
        )
    )
    assert d.state.model_copy(update={"offset": before.offset}) == before


def test_a_later_turn_finds_the_reply_and_does_not_send_again() -> None:
    d = refund()
    d.webhook()
    # a person hands it back to the bot: Chatwoot writes activities and sends a status webhook
    d.chatwoot.messages += [activity(50, "open"), activity(51, "pending"), incoming(52, "another refund")]
    d.chatwoot.conversation = d.chatwoot.conversation.model_copy(
        update={"status": "pending", "assignee_type": "AgentBot", "assignee_id": BOT}
    )
    d.webhook(transition=("pending", T0 / 1000), event="conversation_status_changed")
    assert d.chatwoot.ops().count("create_message") == 1
    assert d.state.ledger.value == "attempted"  # found keeps an existing value
    assert d.last().result == "assigned"


def test_found_reply_without_ledger_is_recorded_as_observed() -> None:
    d = refund(
        incoming(1, "refund please"), outgoing(2, sender_type="agent_bot", sender_id=BOT, status="sent")
    )
    d.webhook()
    assert "create_message" not in d.chatwoot.ops()
    assert d.state.ledger.value == "observed"


def test_ambiguous_brand_message_forbids_a_send() -> None:
    d = refund(incoming(1, "refund please"), outgoing(2, sender_type="agent_bot", sender_id=None))
    d.webhook()
    assert "create_message" not in d.chatwoot.ops()
    assert d.last().reason == "reply_history_unknown"


def test_empty_history_with_an_earlier_attempt_hands_off() -> None:
    d = refund()
    d.state = d.state.model_copy(update={"ledger": d.state.ledger.model_copy(update={"value": "attempted"})})
    d.webhook()
    assert "create_message" not in d.chatwoot.ops()
    assert d.last().reason == "reply_attempted_before"


def test_history_read_error_hands_off() -> None:
    d = refund()
    d.chatwoot.fail("scan_reply_history")
    d.webhook()
    assert d.last().reason == "reply_history_unavailable"
    assert d.chatwoot.conversation.status == "open"


def test_missing_or_blank_canned_response_hands_off_immediately() -> None:
    d = refund(canned={"refund": "   "})
    d.webhook()
    assert "create_message" not in d.chatwoot.ops()
    assert d.last().reason == "canned_response_missing"
    assert d.state.guard.failures == 0


def test_unconfirmed_receipt_hands_off_and_keeps_the_attempt() -> None:
    d = refund(bad_receipt=True)
    d.webhook()
    assert d.last().reason == "reply_unconfirmed"
    assert d.state.ledger.value == "attempted"


def test_send_error_hands_off_without_retrying_the_send() -> None:
    d = refund()
    d.chatwoot.errors["create_message"] = [EffectError(kind="unconfirmed")]
    d.webhook()
    assert d.chatwoot.ops().count("create_message") == 1
    assert d.last().result == "handed_off"


def test_a_reply_refused_by_the_rate_limit_is_sent_after_a_new_fresh_read_and_never_handed_off() -> None:
    """Decisions 15: a 429 on every try proves the reply was not made, so the attempt is taken back and the reply
    goes out once the limit lifts, after a new fresh read; the conversation is not handed off for throttling."""
    d = refund()
    d.chatwoot.errors["create_message"] = [EffectError(kind="throttled", reason="refused with 429")] * 2
    d.webhook()
    ops = d.chatwoot.ops()
    sends = [i for i, op in enumerate(ops) if op == "create_message"]
    assert len(sends) == 3  # twice refused, then sent
    for refused in sends[:-1]:  # each try again comes after a new fresh read
        assert ops[refused + 1 : refused + 4] == ["get_conversation", "get_inbox_bot", "read_turn"]
    assert d.last().result == "assigned" and d.last().replied
    assert d.state.ledger.value == "attempted"
    assert not d.state.guard.handoff


def test_a_reply_refused_otherwise_keeps_the_attempt_and_hands_off() -> None:
    """Only a 429 proves the reply was not made: a stale read after a failed read before it keeps the contract."""
    d = refund()
    d.chatwoot.errors["create_message"] = [EffectError(kind="stale_read", reason="changed since the fresh read")]
    d.webhook()
    assert d.chatwoot.ops().count("create_message") == 1
    assert d.last().result == "handed_off" and d.last().reason == "reply_stale_read"
    assert d.state.ledger.value == "attempted"


def test_kind_status_after_the_reply_ends_the_turn() -> None:
    from tests.unit.test_fold_driver import make_config

    config = make_config(
        kinds={"1": {"refund": {"covers": "refunds", "cannedResponse": "refund", "status": "resolved"}}}
    )
    d = refund()
    d.config = config
    d.webhook()
    assert [c.op for c in d.mutations()] == ["set_labels", "create_message", "toggle_status", "unassign"]
    assert d.last().result == "ended"
