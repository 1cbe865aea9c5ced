"""Snapshot (behavior.md §9.1), release (§9.9), disconnected inbox (§9.8), deleted conversation (§10.3)."""

from __future__ import annotations

from schemas.records import EffectError, WebhookReceived
from tests.unit.test_fold_driver import ACCOUNT, BOT, CONV, T0, Driver, FakeChatwoot, incoming


def conv(**update: object) -> Driver:
    fake = FakeChatwoot()
    fake.messages = [incoming(1, "My invoice is wrong")]
    fake.conversation = fake.conversation.model_copy(update=update)
    return Driver(chatwoot=fake)


def test_resolved_ticket_still_owned_by_the_bot_is_released_without_a_status_change() -> None:
    d = conv(status="resolved")
    d.webhook()
    assert d.chatwoot.ops() == ["get_conversation", "get_conversation", "unassign"]
    assert d.chatwoot.conversation.status == "resolved" and d.chatwoot.conversation.assignee_id is None
    assert d.last().result == "nothing" and d.last().reason == "released"


def test_release_skips_a_conversation_a_person_took_in_between() -> None:
    d = conv(status="open")
    original = d.chatwoot.execute
    calls = {"n": 0}

    def execute(command):  # type: ignore[no-untyped-def]
        calls["n"] += 1
        if calls["n"] == 2:
            d.chatwoot.conversation = d.chatwoot.conversation.model_copy(
                update={"assignee_type": "User", "assignee_id": 3}
            )
        return original(command)

    d.chatwoot.execute = execute  # type: ignore[method-assign]
    d.webhook()
    assert "unassign" not in d.chatwoot.ops()


def test_non_pending_ticket_of_people_is_left_alone() -> None:
    d = conv(status="open", assignee_type="User", assignee_id=3)
    d.webhook()
    assert d.chatwoot.ops() == ["get_conversation"]
    assert d.last().reason == "not_pending"


def test_missing_status_counts_as_open_for_the_guard_but_releases_nothing() -> None:
    d = conv(status=None)
    d.state = d.state.model_copy(update={"guard": d.state.guard.model_copy(update={"pending": True})})
    d.webhook()
    assert d.chatwoot.ops() == ["get_conversation"]
    assert d.state.guard.expected is not None and d.state.guard.expected.status == "open"
    assert d.state.guard.pending is False


def test_another_bots_pending_ticket_is_untouched() -> None:
    d = conv(assignee_id=BOT + 1)
    d.webhook()
    assert d.chatwoot.ops() == ["get_conversation"]
    assert d.last().reason == "other_bot"


def test_blocked_contact_is_not_routed() -> None:
    d = conv(blocked=True)
    d.webhook()
    assert d.chatwoot.ops() == ["get_conversation", "get_inbox_bot"]
    assert d.last().reason == "blocked"


def test_disconnected_inbox_hands_off_our_pending_ticket_without_reading_the_turn() -> None:
    d = conv(blocked=True)
    d.chatwoot.inbox_bot = (None, None)
    d.webhook()
    assert d.chatwoot.ops() == ["get_conversation", "get_inbox_bot", "get_conversation", "toggle_status"]
    assert d.last().result == "handed_off" and d.last().reason == "inbox_disconnected"


def test_disconnected_inbox_leaves_unassigned_tickets_alone() -> None:
    d = conv(assignee_type=None, assignee_id=None, has_assignee=False)
    d.chatwoot.inbox_bot = (BOT + 1, ACCOUNT)
    d.webhook()
    assert d.chatwoot.ops() == ["get_conversation", "get_inbox_bot"]


def test_inbox_bot_404_counts_as_unlinked() -> None:
    d = conv()
    d.chatwoot.fail("get_inbox_bot", kind="missing", status=404)
    d.webhook()
    assert d.chatwoot.ops()[-1] == "toggle_status"


def test_bot_of_another_account_is_a_failure_that_retries() -> None:
    d = conv()
    d.chatwoot.inbox_bot = (BOT, None)  # a system bot
    d.webhook()
    assert d.last().result == "retry" and d.last().reason == "foreign_bot"
    assert d.wakeup == T0 + 5000


def test_conversation_moved_to_another_inbox_mid_run_stops() -> None:
    d = conv()
    original = d.chatwoot.execute

    def execute(command):  # type: ignore[no-untyped-def]
        if command.op == "decide":
            d.chatwoot.conversation = d.chatwoot.conversation.model_copy(update={"inbox_id": 77})
        return original(command)

    d.chatwoot.execute = execute  # type: ignore[method-assign]
    d.webhook()
    assert d.mutations() == []
    assert d.last().reason == "inbox_changed" and d.state.job is None


def test_missing_conversation_completes_and_a_404_on_a_list_drops_the_job() -> None:
    d = conv()
    d.chatwoot.missing = True
    d.webhook()
    assert d.last().result == "nothing" and d.last().reason == "conversation_missing"
    d = conv()
    d.chatwoot.fail("read_turn", kind="missing", status=404)
    d.webhook()
    assert d.last().result == "dropped" and d.state.job is None


def test_404_on_a_mutation_drops_the_job() -> None:
    d = conv()
    d.chatwoot.fail("assign", kind="missing", status=404)
    d.webhook()
    assert d.last().result == "dropped" and d.state.job is None and d.wakeup is None


def test_unrouted_account_is_ignored() -> None:
    d = conv()
    d.send(WebhookReceived(at_ms=T0, account_id=3, conversation_id=CONV, event="message_created"))
    assert d.state.job is None and d.commands == []


def test_a_failure_with_a_named_cause_is_retried_under_that_name() -> None:
    # Decisions 9: the executor names causes that keep failing until fixed, so operators can list them
    d = Driver()
    d.chatwoot.messages = [incoming(1, "I was charged twice")]
    d.chatwoot.errors["read_turn"] = [EffectError(kind="failed", code="malformed_page")]
    d.webhook()
    assert d.last().result == "retry" and d.last().reason == "malformed_page"
