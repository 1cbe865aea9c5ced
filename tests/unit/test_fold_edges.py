"""Edge paths of the route procedure: failures inside release, disconnect, reply and agents steps."""

from __future__ import annotations

from typing import Any

from tests.unit.test_fold_driver import BOT, Driver, FakeChatwoot, decision, incoming


def make(**update: object) -> Driver:
    fake = FakeChatwoot(decision=decision(kind="refund"))
    fake.messages = [incoming(1, "My invoice is wrong")]
    fake.conversation = fake.conversation.model_copy(update=update)
    return Driver(chatwoot=fake)


def on_call(d: Driver, n: int, change: dict[str, Any]) -> None:
    """Change the live conversation just before the n-th Chatwoot call."""
    original = d.chatwoot.execute
    count = {"n": 0}

    def execute(command):  # type: ignore[no-untyped-def]
        count["n"] += 1
        if count["n"] == n:
            if change.pop("missing", False):
                d.chatwoot.missing = True
            d.chatwoot.conversation = d.chatwoot.conversation.model_copy(update=change)
        return original(command)

    d.chatwoot.execute = execute  # type: ignore[method-assign]


def test_disconnect_reread_of_a_deleted_conversation_completes() -> None:
    d = make()
    d.chatwoot.inbox_bot = (None, None)
    on_call(d, 3, {"missing": True})
    d.webhook()
    assert d.last().reason == "conversation_missing" and "toggle_status" not in d.chatwoot.ops()


def test_disconnect_reread_that_finds_it_taken_does_nothing() -> None:
    d = make()
    d.chatwoot.inbox_bot = (None, None)
    on_call(d, 3, {"assignee_type": "User", "assignee_id": 4})
    d.webhook()
    assert d.last().reason == "inbox_disconnected_not_ours" and "toggle_status" not in d.chatwoot.ops()


def test_failed_disconnect_handoff_retries_until_it_succeeds() -> None:
    d = make()
    d.chatwoot.inbox_bot = (None, None)
    d.chatwoot.fail("toggle_status")
    d.webhook()
    assert d.last().result == "retry"
    d.tick()
    assert d.last().result == "handed_off" and d.state.guard.failures == 0


def test_release_reread_failure_retries_and_a_deleted_conversation_completes() -> None:
    d = make(status="resolved")
    on_call(d, 2, {"missing": True})
    d.webhook()
    assert d.last().result == "nothing" and "unassign" not in d.chatwoot.ops()
    d = make(status="snoozed")
    original = d.chatwoot.execute
    calls = {"n": 0}

    def execute(command):  # type: ignore[no-untyped-def]
        calls["n"] += 1
        if calls["n"] == 2:
            d.chatwoot.fail("get_conversation")
        return original(command)

    d.chatwoot.execute = execute  # type: ignore[method-assign]
    d.webhook()
    assert d.last().result == "retry"


def test_canned_list_and_agents_list_errors_are_ordinary_failures() -> None:
    d = make()
    d.chatwoot.fail("list_canned", kind="missing", status=404)
    d.webhook()
    assert d.last().result == "retry" and d.state.job is not None
    d = make()
    d.chatwoot.decision = decision()
    d.chatwoot.fail("list_agents", kind="timeout", status=None)
    d.webhook()
    assert d.last().result == "retry" and d.last().reason == "list_agents_timeout"


def test_a_send_that_would_exceed_the_budget_defers_without_touching_the_ledger() -> None:
    d = make()
    original = d.chatwoot.execute
    seen = {"canned": 0, "inflated": 0}

    def execute(command):  # type: ignore[no-untyped-def]
        d.chatwoot.cost = {}
        if command.op == "list_canned":
            seen["canned"] += 1
        elif command.op == "read_turn" and seen["canned"] == 1 and not seen["inflated"]:
            seen["inflated"] = 1
            d.chatwoot.cost = {"read_turn": 33}  # the read before the send used up the budget
        return original(command)

    d.chatwoot.execute = execute  # type: ignore[method-assign]
    d.chatwoot.lost = {"create_message": 1}
    d.webhook()
    deferred = [o for o in d.outcomes if o.result == "deferred"]
    assert [o.reason for o in deferred] == ["budget"]
    # the deferral happened with an empty ledger, so the next run could (and did) send
    assert d.chatwoot.ops().count("create_message") == 1
    assert d.state.ledger.value == "attempted"


def test_status_ending_is_not_repeated_when_the_release_finds_a_person() -> None:
    d = make()
    d.chatwoot.decision = decision(kind="spam")
    original = d.chatwoot.execute

    def execute(command):  # type: ignore[no-untyped-def]
        result = original(command)
        if command.op == "toggle_status":
            d.chatwoot.conversation = d.chatwoot.conversation.model_copy(
                update={"assignee_type": "User", "assignee_id": 4}
            )
        return result

    d.chatwoot.execute = execute  # type: ignore[method-assign]
    d.webhook()
    assert "unassign" not in d.chatwoot.ops()
    assert d.last().result == "ended" and d.chatwoot.conversation.assignee_id == 4
    assert BOT != 4
