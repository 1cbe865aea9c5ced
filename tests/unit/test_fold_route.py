"""The route procedure (behavior.md §8–§9) played against a scripted Chatwoot: events in, commands out."""

from __future__ import annotations

from tests.unit.test_fold_driver import (
    BOT,
    T0,
    Driver,
    FakeChatwoot,
    activity,
    decision,
    incoming,
    make_config,
    outgoing,
)

SNAPSHOT = ["get_conversation", "get_inbox_bot", "read_turn"]


def driver(*messages: object, **chatwoot: object) -> Driver:
    fake = FakeChatwoot(**chatwoot)  # type: ignore[arg-type]
    fake.messages = list(messages) or [incoming(1, "My invoice is wrong, please fix it")]  # type: ignore[arg-type]
    return Driver(chatwoot=fake)


def test_confident_owner_of_a_bot_assigned_ticket_is_assigned_after_three_reads() -> None:
    d = driver()
    d.webhook()
    assert d.chatwoot.ops() == [
        *SNAPSHOT,
        "decide",
        *SNAPSHOT,
        "list_agents",
        *SNAPSHOT,
        "assign",
    ]
    assert d.chatwoot.calls[-1].params.model_dump() == {"op": "assign", "assignee_id": 7}
    assert d.last().result == "assigned" and d.last().assignee_id == 7
    assert d.state.job is None and d.state.run is None
    assert d.state.guard.expected is not None and d.state.guard.expected.status == "open"
    assert d.wakeup is None


def test_command_ids_are_deterministic_per_run_and_step() -> None:
    d = driver()
    d.webhook()
    assert [c.command_id for c in d.commands[:3]] == ["1:2:1:1", "1:2:1:2", "1:2:1:3"]


def test_decision_is_memoised_so_a_rerun_never_asks_jev_again() -> None:
    d = driver(decision=decision(owner=None, owner_confidence=0.2))
    d.webhook()
    assert d.chatwoot.ops().count("decide") == 1
    d.chatwoot.conversation = d.chatwoot.conversation.model_copy(
        update={"status": "pending", "assignee_type": "AgentBot", "assignee_id": BOT, "has_assignee": True}
    )
    d.state = d.state.model_copy(update={"guard": d.state.guard.model_copy(update={"handoff": False})})
    d.sweep_found()
    assert d.chatwoot.ops().count("decide") == 1


def test_a_changed_model_decides_again() -> None:
    d = driver(decision=decision(owner=None))
    d.webhook()
    d.config = make_config(model="jev-2")
    d.chatwoot.conversation = d.chatwoot.conversation.model_copy(update={"status": "pending"})
    d.state = d.state.model_copy(update={"guard": d.state.guard.model_copy(update={"handoff": False})})
    d.sweep_found()
    assert d.chatwoot.ops().count("decide") == 2


def test_unclear_owner_is_handed_off_with_a_native_toggle() -> None:
    d = driver(decision=decision(owner=None, owner_confidence=0.9))
    d.webhook()
    assert d.mutations()[-1].params.model_dump() == {"op": "toggle_status", "status": "open"}
    assert d.last().result == "handed_off" and d.last().reason == "unclear_owner"
    assert "list_agents" not in d.chatwoot.ops()


def test_low_confidence_answers_are_ignored() -> None:
    d = driver(
        decision=decision(
            owner_confidence=0.69, topic="invoices", topic_confidence=0.5, kind="spam", kind_confidence=0.6
        )
    )
    d.webhook()
    assert [c.op for c in d.mutations()] == ["toggle_status"]
    assert d.chatwoot.conversation.labels == ()
    assert d.last().result == "handed_off"


def test_topic_is_added_only_over_kind_labels_and_before_the_ending() -> None:
    d = driver(decision=decision(topic="invoices", kind="quiet"))
    d.chatwoot.conversation = d.chatwoot.conversation.model_copy(update={"labels": ("refund",)})
    d.webhook()
    assert d.mutations()[0].params.model_dump() == {"op": "set_labels", "labels": ("refund", "invoices")}
    assert d.last().labeled


def test_an_other_label_keeps_the_topic_out_and_an_unchanged_list_is_not_sent() -> None:
    d = driver(decision=decision(topic="invoices"))
    d.chatwoot.conversation = d.chatwoot.conversation.model_copy(update={"labels": ("vip",)})
    d.webhook()
    assert "set_labels" not in d.chatwoot.ops()


def test_kind_with_a_status_ends_the_turn_then_releases_the_bot() -> None:
    d = driver(decision=decision(topic="invoices", kind="spam"))
    d.webhook()
    assert [c.params.model_dump() for c in d.mutations()] == [
        {"op": "set_labels", "labels": ("spam",)},  # no topic: the kind has a status
        {"op": "toggle_status", "status": "resolved"},
        {"op": "unassign"},
    ]
    assert "list_agents" not in d.chatwoot.ops()
    assert d.last().result == "ended" and d.last().status == "resolved"
    assert d.state.guard.expected is not None and d.state.guard.expected.status == "resolved"


def test_kind_label_flag_false_adds_no_label() -> None:
    d = driver(decision=decision(kind="thanks"))
    d.webhook()
    assert [c.op for c in d.mutations()] == ["toggle_status", "unassign"]
    assert d.last().status == "snoozed"


def test_person_assigned_pending_ticket_is_not_reassigned_but_handed_back_open() -> None:
    d = driver()
    d.chatwoot.conversation = d.chatwoot.conversation.model_copy(
        update={"assignee_type": "User", "assignee_id": 3, "has_assignee": True}
    )
    d.webhook()
    assert [c.params.model_dump() for c in d.mutations()] == [{"op": "toggle_status", "status": "open"}]
    assert d.last().reason == "person_assigned"
    assert d.chatwoot.conversation.assignee_id == 3


def test_unassigned_pending_ticket_with_a_confident_owner_is_handed_off() -> None:
    d = driver()
    d.chatwoot.conversation = d.chatwoot.conversation.model_copy(
        update={"assignee_type": None, "assignee_id": None, "has_assignee": False}
    )
    d.webhook()
    assert [c.op for c in d.mutations()] == ["toggle_status"]
    assert d.last().reason == "not_bot_assigned"


def test_owner_who_is_not_an_agent_is_handed_off() -> None:
    d = driver(agents=(8,))
    d.webhook()
    assert [c.op for c in d.mutations()] == ["toggle_status"]
    assert d.last().reason == "assignee_not_an_agent"


# --- §8 rule 3: waiting for a request ---


def greeting(**kw: object) -> Driver:
    kw.setdefault("decision", decision(owner=None, no_request=True))
    return driver(incoming(1, "hi", created_at=T0 / 1000), **kw)


def test_greeting_younger_than_30_minutes_waits_and_is_routed_later_by_the_sweep() -> None:
    d = greeting()
    d.now = T0 + 1_799_000
    d.webhook()
    assert d.last().result == "waited"
    assert d.mutations() == [] and d.state.job is None
    d.now = T0 + 1_800_000
    d.sweep_found()
    assert d.chatwoot.ops().count("decide") == 1  # memo hit
    assert d.last().result == "handed_off"


def test_message_without_created_at_waits_forever() -> None:
    d = driver(incoming(1, "hi", created_at=None), decision=decision(owner=None, no_request=True))
    d.now = T0 + 10**9
    d.webhook()
    assert d.last().result == "waited"


def test_three_greetings_with_a_confident_owner_are_assigned() -> None:
    d = driver(
        incoming(1, "hi"), incoming(2, "hello"), incoming(3, "anyone?"), decision=decision(no_request=True)
    )
    d.webhook()
    assert d.last().result == "assigned"


def test_confident_kind_wins_over_a_greeting() -> None:
    d = greeting(decision=decision(owner=None, no_request=True, kind="spam"))
    d.webhook()
    assert d.last().result == "ended"


def test_person_assigned_greeting_does_not_wait() -> None:
    d = greeting()
    d.chatwoot.conversation = d.chatwoot.conversation.model_copy(
        update={"assignee_type": "User", "assignee_id": 3}
    )
    d.webhook()
    assert d.last().result == "handed_off"


# --- §8 rule 1: immediate handoff, no System One ---


def test_identifier_only_text_is_handed_off_without_jev() -> None:
    d = driver(incoming(1, "jane@example.com"))
    d.webhook()
    assert "decide" not in d.chatwoot.ops()
    assert d.last().reason == "no_usable_text"
    assert d.state.guard.handoff


def test_public_human_reply_in_the_turn_is_handed_off_without_jev() -> None:
    d = driver(incoming(1, "help"), outgoing(2, sender_type="user"))
    d.webhook()
    assert "decide" not in d.chatwoot.ops()
    assert d.last().reason == "public_reply"


def test_private_note_and_other_bots_do_not_count_as_replies() -> None:
    d = driver(
        incoming(1, "help"), outgoing(2, private=True), outgoing(3, sender_type="agent_bot", sender_id=5)
    )
    d.webhook()
    assert d.last().result == "assigned"


def test_our_failed_reply_in_the_turn_is_handed_off() -> None:
    d = driver(incoming(1, "help"), outgoing(2, sender_type="agent_bot", sender_id=BOT, status="failed"))
    d.webhook()
    assert d.last().reason == "public_reply"


def test_public_reply_seen_at_the_fresh_read_hands_off() -> None:
    d = driver()
    original = d.chatwoot.execute

    def execute(command):  # type: ignore[no-untyped-def]
        if command.op == "decide":
            d.chatwoot.messages.append(outgoing(9, sender_type="user"))
        return original(command)

    d.chatwoot.execute = execute  # type: ignore[method-assign]
    d.webhook()
    assert d.chatwoot.ops().count("decide") == 1
    assert [c.op for c in d.mutations()] == ["toggle_status"]
    assert d.last().reason == "public_reply"


def test_deleted_boundary_and_incomplete_read_hand_off() -> None:
    d = driver(activity(1, "pending", deleted=True), incoming(2, "help"))
    d.webhook()
    assert d.last().reason == "boundary_deleted"
    many = [incoming(i, f"text {i}") for i in range(1, 101)]
    d = driver(*many)
    d.webhook()
    assert d.last().reason == "incomplete_read" and "decide" not in d.chatwoot.ops()


def test_turn_starts_after_the_latest_status_activity() -> None:
    d = driver(incoming(1, "old question"), activity(2, "resolved"), incoming(3, "new question"))
    d.webhook()
    decide = next(c for c in d.commands if c.op == "decide")
    assert decide.params.model_dump()["input_key"] == "3"
    assert d.state.guard.boundary == 2


def test_input_text_carries_the_email_domain_and_is_redacted() -> None:
    d = driver(incoming(1, "write me at jane@example.com"))
    d.webhook()
    decide = next(c for c in d.commands if c.op == "decide").params.model_dump()
    assert decide["text"] == "Contact email domain: example.org\nwrite me at [REDACTED]"
