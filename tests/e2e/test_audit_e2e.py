"""`chatwoot-router audit` against the live system: a routed conversation's timeline, and a verified table."""

from __future__ import annotations

import asyncio

from schemas.codec import decode_conversation_event
from tests.support.kafka import read_all
from tests.support.stack import BILLING, Stack
from tests.support.waiting import wait_until


def test_audit_prints_the_timeline_and_verifies_the_live_state(e2e: Stack) -> None:
    conversation = e2e.new_conversation()
    e2e.customer_says(1, conversation, "I was charged twice on my invoice, please refund the payment")
    e2e.wait_conversation(1, conversation, "assigned", lambda c: c["assignee_id"] == BILLING)
    e2e.control("POST", "/settle", {"timeout_s": 10})

    timeline = e2e.run_cli("audit", "--conversation", f"1:{conversation}")
    assert timeline.returncode == 0, timeline.stderr
    assert "Jev decided" in timeline.stdout and "owner=billing" in timeline.stdout
    assert f"assigned to user {BILLING}" in timeline.stdout
    assert "charged twice" not in timeline.stdout  # the timeline shows ids and outcomes, never customer text
    # reads run back to back are one ChainedOutcomes record (a sweep's record arriving between two reads of the
    # turn ends a chain early, so how many chains a turn has depends on timing), and the timeline shows every read
    records = asyncio.run(read_all(e2e.env["KAFKA_BOOTSTRAP_SERVERS"], f"{e2e.env['ROUTER_APP_ID']}.conversations"))
    key = f"1:{conversation}".encode()
    kinds = [decode_conversation_event(r.value).type for r in records if r.key == key]
    assert "chained_outcomes" in kinds, kinds
    assert timeline.stdout.count("read_turn ok") >= 3 and timeline.stdout.count("get_inbox_bot ok") >= 3

    def verified() -> bool:
        result = e2e.run_cli("audit", "--verify", "--conversation", f"1:{conversation}")
        return result.returncode == 0 and "1 conversations replayed, 0 undecodable records, 0 differences" in (
            result.stdout
        )

    wait_until("the replayed state to equal the live table", verified, 60, every_s=1)
