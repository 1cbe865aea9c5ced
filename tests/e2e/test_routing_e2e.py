"""End-to-end routing: sandbox -> ingress -> Kafka -> worker -> sandbox, all over real HTTP (DESIGN §3, §7).

Each test acts as customers and people through the sandbox and waits (with a deadline) until Chatwoot's state
shows what a user of the help desk would see. The stack is shared, so a test that checks that something did NOT
happen first waits on its own conversation's records (`Stack.log`, tests/support/trail.py) until the workers
have folded everything of it and nothing is in flight; never on a process-wide counter.

Every test runs twice: against the kind sandbox and against the realistic one (issue 30: Chatwoot's rate limit,
webhooks concurrent, reordered and duplicated, `conversation_updated` on bot replies), with the same outcomes.
"""

from __future__ import annotations

import asyncio
import re
import signal
from collections.abc import Iterator
from typing import Any

import pytest
from aiokafka import AIOKafkaProducer

from projections.logs.timeline import Arrived
from schemas.records import Forgotten
from tests.support.kafka import read_all
from tests.support.stack import BILLING, BOT_TOKENS, INBOX_2, SALES, Stack, bot_messages
from tests.support.trail import Seen, last_seq, sandbox_calls
from tests.support.waiting import wait_until

BILLING_QUESTION = "I was charged twice on my invoice, please refund the payment"
HOURS_QUESTION = "What are your opening hours? When is the shop open or closed?"


@pytest.fixture(params=["kind", "realistic"])
def e2e(request: pytest.FixtureRequest, stack: Stack) -> Iterator[Stack]:
    """The shared stack of the mode, with no fault rules left over from another test."""
    chosen: Stack = stack if request.param == "kind" else request.getfixturevalue("realistic_stack")
    chosen.clear_faults()
    yield chosen
    chosen.clear_faults()


def metric(stack: Stack, name: str, **labels: str) -> float:
    """Sum of a metric's samples whose labels include `labels` (0 when absent)."""
    total = 0.0
    for line in stack.metrics().splitlines():
        match = re.match(r"^(\w+)(?:\{(.*)\})? (\S+)$", line)
        if not match or match.group(1) != name:
            continue
        sample = dict(re.findall(r'(\w+)="([^"]*)"', match.group(2) or ""))
        if all(sample.get(k) == v for k, v in labels.items()):
            total += float(match.group(3))
    return total


def api_calls(stack: Stack, account: int, conversation: int, op: str) -> list[dict[str, Any]]:
    prefix = f"/api/v1/accounts/{account}/conversations/{conversation}"
    return [c for c in stack.state()["api_calls"] if c["op"] == op and c["path"].startswith(prefix)]


def test_healthz_and_metrics_are_served(e2e: Stack) -> None:
    assert e2e.healthz().json() == {"ok": True, "kafka": True, "partitions": 4}  # the one worker holds all 4
    for faust_view in ("/router/", "/table/conversation_state/", "/table/conversation_state/1:1/"):
        assert e2e.http.get(f"http://127.0.0.1:{e2e.web_port}{faust_view}").status_code == 404, faust_view
    text = e2e.metrics()
    for family in ("router_events_folded_total", "router_effect_seconds", "router_dlq_records_total"):
        assert f"# TYPE {family.removesuffix('_total')}" in text


def test_billing_question_is_assigned_to_its_owner(e2e: Stack) -> None:
    conversation = e2e.new_conversation(contact_name="Ada Lovelace", contact_email="ada@example.org")
    e2e.customer_says(1, conversation, BILLING_QUESTION)
    done = e2e.wait_conversation(1, conversation, "assigned to billing", lambda c: c["assignee_id"] == BILLING)
    assert done["status"] == "open"
    assert done["bot_assignee_id"] is None
    assert bot_messages(done) == []


def test_spam_is_resolved_and_the_bot_released(e2e: Stack) -> None:
    conversation = e2e.new_conversation()
    e2e.customer_says(1, conversation, "Casino spam advertising: unsolicited marketing offers for you")
    done = e2e.wait_conversation(
        1,
        conversation,
        "resolved and released",
        lambda c: c["status"] == "resolved" and c["bot_assignee_id"] is None,
    )
    assert done["assignee_id"] is None
    assert "spam" in done["labels"]


def test_canned_reply_is_sent_exactly_once_across_a_worker_restart(e2e: Stack) -> None:
    conversation = e2e.new_conversation()
    # the reply's POST is slow, so the worker is stopped while it is in flight
    e2e.fault(op="create_message", mode="delay", delay_ms=2000, account_id=1, conversation_id=conversation)
    e2e.customer_says(1, conversation, HOURS_QUESTION)
    wait_until("the reply POST to start", lambda: api_calls(e2e, 1, conversation, "create_message"), 60)
    e2e.worker.stop(signal.SIGTERM)
    e2e.worker.start()
    e2e.wait_worker_healthy()
    done = e2e.wait_conversation(1, conversation, "no longer pending", lambda c: c["status"] != "pending")
    replies = bot_messages(done)
    assert len(replies) == 1
    assert "opening hours" not in replies[0]["content"]  # the canned content, not the customer's text
    e2e.log.wait_settled(1, conversation, "the first turn to end")

    # a new turn of the same kind (a person resolves it, the customer asks again, Chatwoot makes it pending for
    # the bot) runs the reply step again (§9.7): the reply is never sent a second time
    follow_up, before = second_turn(e2e, conversation, "What are your opening hours again?")
    # no owner for this kind: to people (the runs the handoff's own webhooks start end with nothing to do)
    assert "handed_off" in [o.result for o in follow_up.outcomes_since(before)], follow_up.describe()
    replies_step = [o for _, o in follow_up.effects if o.op == "scan_reply_history"]
    assert len(replies_step) == 2, "the second turn never reached the reply step"
    assert len(bot_messages(e2e.conversation(1, conversation))) == 1
    assert len(api_calls(e2e, 1, conversation, "create_message")) == 1


def test_a_reply_attempt_that_failed_is_never_made_again(e2e: Stack) -> None:
    """The reply ledger (§9.7): Chatwoot answered 500 to the reply, so the history shows no reply, yet the attempt
    may have reached the customer; a later turn of the same kind hands off without a second attempt."""
    conversation = e2e.new_conversation()
    e2e.fault(op="create_message", mode="fail", status=500, times=1, account_id=1, conversation_id=conversation)
    e2e.customer_says(1, conversation, HOURS_QUESTION)
    first = e2e.log.wait(1, conversation, "the unconfirmed reply to hand off", lambda s: settled_with(s, "handed_off"))
    assert handoffs(first) == ["reply_unconfirmed"]
    assert bot_messages(e2e.conversation(1, conversation)) == []

    follow_up, before = second_turn(e2e, conversation, "What are your opening hours again?")
    assert "handed_off" in [o.result for o in follow_up.outcomes_since(before)], follow_up.describe()
    assert [o for _, o in follow_up.effects if o.op == "scan_reply_history"][-1].error is None
    assert len(api_calls(e2e, 1, conversation, "create_message")) == 1  # the failed attempt, and no other
    current = e2e.conversation(1, conversation)
    assert bot_messages(current) == [] and current["status"] == "open"


def second_turn(e2e: Stack, conversation: int, text: str) -> tuple[Seen, int]:
    """A person resolves the conversation and the customer writes again: Chatwoot makes it pending for the bot, a
    new turn. Returns the conversation's log once the workers folded all of it and ended that turn, and the offset
    of its last record before."""
    before = e2e.log.seen(1, conversation).last_offset
    e2e.control("POST", f"/conversations/1/{conversation}/status", {"user_id": 1, "status": "resolved"})
    e2e.customer_says(1, conversation, text)
    assert e2e.conversation(1, conversation)["status"] == "pending"
    e2e.settle()  # both webhooks are on the log: settled now means folded, and the turn ended
    return e2e.log.wait_settled(1, conversation, "the second turn to end", after=before), before


def settled_with(seen: Seen, result: str) -> bool:
    """Settled, and a run ended with `result` (the runs that the router's own status change starts come after it
    and end with nothing to do)."""
    return seen.settled and result in [o.result for o in seen.trail.outcomes]


def handoffs(seen: Seen) -> list[str | None]:
    """The reasons of the conversation's handoffs, in order."""
    return [o.reason for o in seen.trail.outcomes if o.result == "handed_off"]


def test_greeting_waits_then_routes_on_the_next_message(e2e: Stack) -> None:
    conversation = e2e.new_conversation()
    e2e.customer_says(1, conversation, "Hello")
    e2e.log.wait(1, conversation, "the greeting to wait", lambda s: settled_with(s, "waited"))
    current = e2e.conversation(1, conversation)
    assert current["status"] == "pending" and current["assignee_id"] is None
    e2e.customer_says(1, conversation, "Can I get a sales quote and pricing plans for a discount?")
    done = e2e.wait_conversation(1, conversation, "assigned to sales", lambda c: c["assignee_id"] == SALES)
    assert done["status"] == "open"


def test_human_public_reply_hands_off(e2e: Stack) -> None:
    conversation = e2e.new_conversation()
    e2e.control("POST", f"/conversations/1/{conversation}/reply", {"user_id": 1, "content": "Hi, Ada here."})
    e2e.customer_says(1, conversation, BILLING_QUESTION)
    done = e2e.wait_conversation(1, conversation, "handed off", lambda c: c["status"] == "open")
    assert done["assignee_id"] != BILLING
    assert bot_messages(done) == []
    seen = e2e.log.wait(1, conversation, "the handoff", lambda s: settled_with(s, "handed_off"))
    assert handoffs(seen) == ["public_reply"]
    assert seen.trail.decisions == []  # handed off before System One was asked


def test_disconnected_inbox_hands_off_without_asking_system_one(e2e: Stack) -> None:
    # account 2's inbox answers "no bot linked" from now on
    e2e.fault(op="get_inbox_bot", mode="respond", body={}, times=None, account_id=2)
    jev_calls = len(e2e.state()["systemone_calls"])
    conversation = e2e.new_conversation(account=2, inbox=INBOX_2)
    e2e.customer_says(2, conversation, "My device is broken, technical support please")
    done = e2e.wait_conversation(2, conversation, "handed off", lambda c: c["status"] == "open")
    assert done["bot_assignee_id"] is None
    assert len(e2e.state()["systemone_calls"]) == jev_calls


def test_status_change_mid_run_stops_the_routing(e2e: Stack) -> None:
    conversation = e2e.new_conversation()
    e2e.fault(op="systemone", mode="delay", delay_ms=1500, times=1)
    e2e.customer_says(1, conversation, BILLING_QUESTION)
    wait_until("System One to be asked", lambda: api_calls(e2e, 1, conversation, "list_messages"), 30)
    # a person opens the conversation while the decision is in flight (its webhook lands mid-run)
    e2e.control("POST", f"/conversations/1/{conversation}/status", {"user_id": 1, "status": "open"})
    e2e.settle()
    seen = e2e.log.wait_settled(1, conversation, "the run to end after the person's change")
    assert seen.trail.outcomes and seen.trail.outcomes[-1].result != "assigned"
    current = e2e.conversation(1, conversation)
    assert current["status"] == "open"
    assert current["assignee_id"] != BILLING  # people own it now: not assigned by the bot
    assert api_calls(e2e, 1, conversation, "assign") == []


def test_chatwoot_failing_three_times_enters_handoff_mode(e2e: Stack) -> None:
    conversation = e2e.new_conversation()
    e2e.fault(op="list_messages", mode="fail", status=503, times=3, account_id=1, conversation_id=conversation)
    e2e.customer_says(1, conversation, BILLING_QUESTION)
    done = e2e.wait_conversation(1, conversation, "handed off", lambda c: c["status"] == "open", deadline_s=60)
    assert done["assignee_id"] != BILLING  # handoff mode skips System One's owner
    assert bot_messages(done) == []
    seen = e2e.log.wait(1, conversation, "the handoff", lambda s: settled_with(s, "handed_off"))
    # three failed turn reads, each retried, and only then the handoff (§4.5: handoff mode at the third failure)
    assert len(seen.failed("read_turn")) == 3
    assert [o.result for o in seen.trail.outcomes if o.result != "nothing"] == ["retry", "retry", "retry", "handed_off"]
    faulted = [c for c in api_calls(e2e, 1, conversation, "list_messages") if c.get("fault")]
    handoff = [c for c in api_calls(e2e, 1, conversation, "toggle_status") if c["token"] == "bot"]
    assert len(faulted) == 3 and handoff and handoff[0]["seq"] > faulted[-1]["seq"]
    assert seen.trail.decisions == []  # System One never asked for this turn


def test_chatwoot_failing_twice_is_retried_and_still_routed(e2e: Stack) -> None:
    """Handoff mode starts at the third failure (§4.5), not before: two failures are retried with backoff and the
    third run routes the conversation to its owner."""
    conversation = e2e.new_conversation()
    e2e.fault(op="list_messages", mode="fail", status=503, times=2, account_id=1, conversation_id=conversation)
    e2e.customer_says(1, conversation, BILLING_QUESTION)
    done = e2e.wait_conversation(1, conversation, "assigned to billing", lambda c: c["assignee_id"] == BILLING)
    assert done["status"] == "open"
    seen = e2e.log.wait(1, conversation, "the assignment", lambda s: settled_with(s, "assigned"))
    assert [(o.result, o.failures) for o in seen.trail.outcomes if o.result != "nothing"] == [
        ("retry", 1),
        ("retry", 2),
        ("assigned", None),
    ]


def test_deleted_conversation_is_dropped(e2e: Stack) -> None:
    conversation = e2e.new_conversation()
    e2e.fault(op="get_conversation", mode="delay", delay_ms=1000, times=1, account_id=1, conversation_id=conversation)
    e2e.customer_says(1, conversation, BILLING_QUESTION)
    wait_until("the first read", lambda: api_calls(e2e, 1, conversation, "get_conversation"), 30)
    e2e.control("DELETE", f"/conversations/1/{conversation}")
    deleted_at = last_seq(e2e)
    seen = e2e.log.wait_settled(1, conversation, "the run to end on the deleted conversation")
    # every run read "missing" and ended without acting (§10.3), and nothing was tried on it since
    ended = {(o.result, o.reason) for o in seen.trail.outcomes}
    assert ended and ended <= {("nothing", "conversation_missing"), ("dropped", "conversation_deleted")}, ended
    assert seen.trail.decisions == []
    mutations = ("toggle_status", "assign", "set_labels", "create_message")
    assert [c for c in sandbox_calls(e2e, conversation, since_seq=deleted_at) if c["op"] in mutations] == []
    # nothing of it stays readable: its data key was erased, and the log says so (issue 32, automatic erasure)
    erased = e2e.log.wait(1, conversation, "erased", lambda s: s.trail.state.forgotten_ms is not None)
    assert any(isinstance(e, Forgotten) and e.reason == "conversation_missing" for e in _arrived(erased))
    # the worker carries on with other conversations
    other = e2e.new_conversation()
    e2e.customer_says(1, other, BILLING_QUESTION)
    e2e.wait_conversation(1, other, "assigned", lambda c: c["assignee_id"] == BILLING)
    assert metric(e2e, "router_dlq_records_total") == 0


def test_sweep_finds_a_lost_webhook_and_an_open_conversation_still_held_by_the_bot(e2e: Stack) -> None:
    e2e.ingress.stop()  # webhooks sent now are lost (the sandbox gives up after its retries)
    lost = e2e.new_conversation()
    e2e.customer_says(1, lost, BILLING_QUESTION)
    held = e2e.new_conversation()
    bot = {"api_access_token": BOT_TOKENS[1]}
    for status in ("resolved", "open"):  # the bot's own status changes keep its assignment
        url = f"{e2e.sandbox_url}/api/v1/accounts/1/conversations/{held}/toggle_status"
        assert e2e.http.post(url, json={"status": status}, headers=bot).is_success
    e2e.settle()
    assert e2e.conversation(1, held)["bot_assignee_id"] == 5
    # the webhooks were lost: neither conversation has a record on the log
    assert e2e.log.seen(1, lost).offsets == [] and e2e.log.seen(1, held).offsets == []
    e2e.ingress.start()
    wait_until("the ingress", lambda: e2e.http.get(f"http://127.0.0.1:{e2e.ingress_port}/healthz").is_success)

    result = e2e.run_cli("sweep", "--account", "1")
    assert result.returncode == 0, result.stderr

    e2e.wait_conversation(1, lost, "routed by the sweep", lambda c: c["assignee_id"] == BILLING)
    released = e2e.wait_conversation(1, held, "released", lambda c: c["bot_assignee_id"] is None)
    assert released["status"] == "open"


def test_sweep_refuses_an_account_that_is_not_routed(e2e: Stack) -> None:
    result = e2e.run_cli("sweep", "--account", "99")
    assert result.returncode == 2
    assert "--account" in result.stderr


def test_leader_requests_sweep_passes_periodically(e2e: Stack) -> None:
    before = metric(e2e, "router_sweeps_requested_total")
    # ROUTER_SWEEP_INTERVAL_S is 15 in this stack: one more pass (2 accounts x pending/open) within the deadline
    wait_until("the next sweep pass", lambda: metric(e2e, "router_sweeps_requested_total") >= before + 4, 40, 0.5)


def test_commands_consumed_again_after_their_run_ended_are_not_executed(e2e: Stack, kafka_bootstrap: str) -> None:
    """A new owner consumes a routed conversation's commands again (DESIGN §6 "No command runs stale"): none is
    executed, so a person's change made after the router ended the turn stays as the person left it."""
    conversation = e2e.new_conversation()
    key = f"1:{conversation}"
    e2e.customer_says(1, conversation, BILLING_QUESTION)
    e2e.wait_conversation(1, conversation, "assigned to billing", lambda c: c["assignee_id"] == BILLING)
    e2e.control("POST", f"/conversations/1/{conversation}/assign", {"user_id": SALES, "assignee_id": SALES})

    def mutations() -> int:
        ops = ("toggle_status", "assign", "set_labels", "create_message")
        return sum(len(api_calls(e2e, 1, conversation, op)) for op in ops)

    before = mutations()
    topic = f"{e2e.env['ROUTER_APP_ID']}.effects"
    commands = [r.value for r in asyncio.run(read_all(kafka_bootstrap, topic)) if r.key == key.encode()]
    assert any(b'"op":"assign"' in value for value in commands)

    async def produce_again() -> None:
        producer = AIOKafkaProducer(bootstrap_servers=kafka_bootstrap, acks="all")
        await producer.start()
        try:
            for value in commands:
                await producer.send_and_wait(topic, key=key.encode(), value=value)
        finally:
            await producer.stop()

    asyncio.run(produce_again())
    # the customer writes again: that run's first read is executed in the conversation's lane after every command
    # consumed before it, so once it reaches Chatwoot each replayed command has been dropped or made
    since = last_seq(e2e)
    e2e.customer_says(1, conversation, "Thanks, any news?")
    wait_until(
        "the next run's read to reach Chatwoot",
        lambda: [c for c in sandbox_calls(e2e, conversation, since_seq=since) if c["op"] == "get_conversation"],
    )
    e2e.log.wait_settled(1, conversation, "the next run to end")
    assert mutations() == before
    assert e2e.conversation(1, conversation)["assignee_id"] == SALES


def test_the_event_log_never_holds_contact_identities_or_raw_text(e2e: Stack, kafka_bootstrap: str) -> None:
    """DESIGN §4 "Privacy of the log": names, e-mail addresses and unredacted text stay out of `conversations`."""
    conversation = e2e.new_conversation(contact_name="Grace Hopperfield", contact_email="grace.h@navy.example")
    secret_text = "Refund my invoice payment, call me on +1 555 0100 200, Grace Hopperfield"
    e2e.customer_says(1, conversation, secret_text)
    e2e.wait_conversation(1, conversation, "routed", lambda c: c["status"] != "pending")
    records = asyncio.run(read_all(kafka_bootstrap, f"{e2e.env['ROUTER_APP_ID']}.conversations"))
    mine = [r.value.decode() for r in records if r.key == f"1:{conversation}".encode()]
    assert any('"op":"read_turn"' in value for value in mine)  # the turn read's outcome is there, redacted
    for value in mine:
        for private in ("Grace", "Hopperfield", "grace.h@navy.example", "555 0100 200", secret_text):
            assert private not in value


def test_an_inbox_linked_to_another_accounts_bot_is_listed_as_stuck(e2e: Stack) -> None:
    # Decisions 9: the snapshot cannot proceed, so the conversation keeps failing; operators see it listed
    conversation = e2e.new_conversation(account=2, inbox=INBOX_2)
    e2e.fault(op="get_inbox_bot", mode="respond", body={"agent_bot": {"id": 5, "account_id": 1}}, times=None)
    e2e.customer_says(2, conversation, "My device is broken, technical support please")
    stuck = wait_until(
        "the conversation to be listed as stuck",
        lambda: e2e.http.get(f"http://127.0.0.1:{e2e.web_port}/stuck").json()["stuck"].get(f"2:{conversation}"),
        30,
    )
    assert stuck == "foreign_bot"
    assert 'router_stuck_conversations{reason="foreign_bot"}' in e2e.metrics()
    assert e2e.conversation(2, conversation)["status"] == "pending"  # left alone, never routed blindly
    e2e.clear_faults()


def _arrived(seen: Any) -> list[Any]:
    """The records of the conversation that came from outside its calls (webhooks, sweeps, timers, erasures)."""
    return [entry.event for entry in seen.trail.timeline.entries if isinstance(entry, Arrived)]
