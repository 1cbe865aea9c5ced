"""Partitions move between workers (DESIGN §3 "scale out by starting more workers"): a second worker joins,
the first leaves, and conversations keep being routed, including a retry whose durable timer was set on the
worker that left (DESIGN §7: durable timers are records and tables, so they move with the partition).

The stack is this test's own, with a retry base of 8 s, so the retry timer is still pending when its worker
leaves: the test checks from outside that the leaving worker owned the conversation's partition (the group's
assignment), that the injected failure happened and was folded and committed there, and that the timer fired
only after that worker was gone.
"""

from __future__ import annotations

import asyncio
import signal
import time
from pathlib import Path

import pytest

from handlers.kafka.topic_io import group_members
from handlers.logs.audit import conversation_partition
from streams.kafka.local import free_port
from tests.support.processes import Process
from tests.support.stack import BILLING, Stack
from tests.support.waiting import wait_until

QUESTION = "I was charged twice on my invoice, please refund the payment"
RETRY_BASE_MS = 8000  # the first retry is due 8 s after the failure: long enough to outlive its worker
SECOND = "scale-worker-2"  # the second worker's static id names it in the group's assignment


def first_workers_partitions(stack: Stack) -> set[int]:
    """The partitions of `conversations` the first worker owns now: the group's other member than SECOND (whose
    member id starts with its worker id); empty while the group does not have both."""
    topic = f"{stack.env['ROUTER_APP_ID']}.conversations"
    members = asyncio.run(group_members(stack.env["KAFKA_BOOTSTRAP_SERVERS"], stack.env["ROUTER_APP_ID"]))
    others = [owned for name, owned in members.items() if not name.startswith(SECOND)]
    if len(members) != 2 or len(others) != 1:
        return set()
    return {partition for t, partition in others[0] if t == topic}


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_conversations_keep_routing_while_partitions_move(kafka_bootstrap: str, app_id: str, tmp_path: Path) -> None:
    stack = Stack(kafka_bootstrap, app_id, tmp_path)
    stack.env["ROUTER_RETRY_BASE_MS"] = str(RETRY_BASE_MS)
    port = free_port()
    env = dict(stack.env, ROUTER_DATA_DIR=str(tmp_path / "state2"), ROUTER_WORKER_ID=SECOND)  # its own RocksDB
    second = Process("worker2", ["worker", "--web-port", str(port)], env, tmp_path)
    try:
        stack.start()
        second.start()
        wait_until(
            "the second worker to join and the group to settle",
            lambda: (
                stack.http.get(f"http://127.0.0.1:{port}/healthz").status_code == 200
                and stack.healthz().is_success
                and first_workers_partitions(stack)
            ),
            120,
            0.5,
        )
        # one conversation per partition, routed while two workers share the partitions
        shared = [stack.new_conversation() for _ in range(8)]
        for conversation in shared:
            stack.customer_says(1, conversation, QUESTION)
        for conversation in shared:
            stack.wait_conversation(1, conversation, "assigned", lambda c: c["assignee_id"] == BILLING)

        # a conversation on a partition of the first worker whose first turn read fails: its retry is a timer
        owned = first_workers_partitions(stack)
        topic = f"{app_id}.conversations"
        retried = stack.new_conversation()
        while asyncio.run(conversation_partition(kafka_bootstrap, topic, f"1:{retried}")) not in owned:
            retried = stack.new_conversation()
        stack.fault(op="list_messages", mode="fail", status=503, times=1, account_id=1, conversation_id=retried)
        stack.customer_says(1, retried, QUESTION)
        failed = stack.log.wait(
            1,
            retried,
            "the failed read folded and committed by the first worker, its retry pending",
            lambda s: s.consumed and s.failed("read_turn") and s.trail.state.job is not None,
            60,
        )
        assert first_workers_partitions(stack) == owned  # no rebalance moved it meanwhile
        assert [c.get("fault") for c in stack.state()["api_calls"] if c["op"] == "list_messages"].count("fail") >= 1
        left_at_ms = int(time.time() * 1000)
        stack.worker.stop(signal.SIGTERM)
        assert not any(o.op == "read_turn" and o.error is None for _, o in failed.effects)  # not retried yet

        later = [stack.new_conversation() for _ in range(4)]
        for conversation in later:
            stack.customer_says(1, conversation, QUESTION)
        for conversation in [retried, *later]:  # the stack's own worker is gone: poll Chatwoot's state directly
            wait_until(
                f"1:{conversation} assigned by the remaining worker",
                lambda c=conversation: stack.conversation(1, c)["assignee_id"] == BILLING,
                120,
            )
        # the retry ran on the remaining worker: its timer fired after the first worker had left
        seen = stack.log.seen(1, retried)
        fired = [t.at_ms for t in seen.timers if not t.resume]
        assert fired and min(fired) >= left_at_ms, (fired, left_at_ms)

        # the first worker comes back, the second leaves: the first takes every partition again
        stack.worker.start()
        stack.wait_worker_healthy()
        second.stop()
        again = stack.new_conversation()
        stack.customer_says(1, again, QUESTION)
        stack.wait_conversation(1, again, "assigned", lambda c: c["assignee_id"] == BILLING, 120)
    finally:
        second.stop()
        stack.stop()
