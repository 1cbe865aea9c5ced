"""A worker pointed at a Chatwoot older than the minimum touches nothing and says why; it starts routing by
itself once the version is right (issue 30: a sandbox that says it is Chatwoot 4.15.1, then 4.18.0; a closed gate
asks again every 15 s)."""

from __future__ import annotations

import signal

from tests.support.stack import BILLING, Stack, bot_messages
from tests.support.trail import last_seq, sandbox_calls
from tests.support.waiting import wait_until

BILLING_QUESTION = "I was charged twice on my invoice, please refund the payment"


def test_an_old_chatwoot_is_not_touched_until_it_is_upgraded(e2e: Stack) -> None:
    # created while Chatwoot is recent (so the inbox bot owns it, #14875); the customer writes after the downgrade
    conversation = e2e.new_conversation()
    e2e.control("POST", "/settings", {"chatwoot_version": "4.15.1"})
    try:
        e2e.worker.stop(signal.SIGTERM)  # a worker asks at start (and every 5 minutes)
        e2e.worker.start()
        unhealthy = wait_until(
            "the worker to say why it routes nothing",
            lambda: "older than" in (((r := e2e.healthz()).status_code == 503 and r.json().get("chatwoot")) or ""),
            60,
            0.5,
        )
        reason = e2e.healthz().json()["chatwoot"]
        assert unhealthy and "version 4.15.1 is older than 4.17.0" in reason
        stuck = e2e.http.get(f"http://127.0.0.1:{e2e.web_port}/stuck").json()
        assert "4.15.1" in stuck["chatwoot"]
        since = last_seq(e2e)
        e2e.customer_says(1, conversation, BILLING_QUESTION)
        e2e.settle()
        e2e.log.wait(1, conversation, "the webhook folded", lambda s: s.consumed)
        assert sandbox_calls(e2e, conversation, since_seq=since) == []  # not even a read
        current = e2e.conversation(1, conversation)
        assert current["status"] == "pending" and current["assignee_id"] is None  # not handed off either
        held = [line for line in e2e.metrics().splitlines() if line.startswith("router_commands_held_total ")]
        assert held and float(held[0].split()[1]) >= 1
    finally:  # the worker asks again within 15 s while it routes nothing
        e2e.control("POST", "/settings", {"chatwoot_version": "4.18.0"})
    done = e2e.wait_conversation(
        1, conversation, "assigned once Chatwoot is new enough", lambda c: c["assignee_id"] == BILLING
    )
    assert done["status"] == "open" and bot_messages(done) == []
    e2e.wait_worker_healthy()
    seen = e2e.log.wait_settled(1, conversation, "the turn ended")
    assert [o.result for o in seen.trail.outcomes if o.result != "nothing"] == ["assigned"]  # no failure, no handoff
