"""Partitions move between workers (DESIGN §3 "scale out by starting more workers"): a second worker joins,
the first leaves, and conversations keep being routed, including a retry whose durable timer was set on the
worker that left."""

from __future__ import annotations

import signal

from streams.kafka.local import free_port
from tests.support.processes import Process
from tests.support.stack import BILLING, Stack
from tests.support.waiting import wait_until

QUESTION = "I was charged twice on my invoice, please refund the payment"


def test_conversations_keep_routing_while_partitions_move(e2e: Stack) -> None:
    port = free_port()
    env = dict(e2e.env, ROUTER_DATA_DIR=str(e2e.tmp / "state2"))  # each worker has its own RocksDB
    second = Process("worker2", ["worker", "--web-port", str(port)], env, e2e.tmp)
    second.start()
    try:
        wait_until(
            "the second worker to join",
            lambda: e2e.http.get(f"http://127.0.0.1:{port}/healthz").status_code == 200 and e2e.healthz().is_success,
            120,
            0.25,
        )
        # one conversation per partition, routed while two workers share the partitions
        shared = [e2e.new_conversation() for _ in range(8)]
        for conversation in shared:
            e2e.customer_says(1, conversation, QUESTION)
        for conversation in shared:
            e2e.wait_conversation(1, conversation, "assigned", lambda c: c["assignee_id"] == BILLING)

        # a conversation whose first turn read fails: its retry is a durable timer, then the first worker leaves
        retried = e2e.new_conversation()
        e2e.fault(op="list_messages", mode="fail", status=503, times=1, account_id=1, conversation_id=retried)
        e2e.customer_says(1, retried, QUESTION)
        e2e.worker.stop(signal.SIGTERM)
        later = [e2e.new_conversation() for _ in range(4)]
        for conversation in later:
            e2e.customer_says(1, conversation, QUESTION)
        for conversation in [retried, *later]:
            wait_until(
                f"1:{conversation} assigned by the remaining worker",
                lambda c=conversation: e2e.conversation(1, c)["assignee_id"] == BILLING,
                120,
            )
    finally:
        if not e2e.worker.alive():
            e2e.worker.start()
        e2e.wait_worker_healthy()
        second.stop()
    # the first worker is back alone and takes every partition again
    e2e.wait_worker_healthy()
    again = e2e.new_conversation()
    e2e.customer_says(1, again, QUESTION)
    e2e.wait_conversation(1, again, "assigned", lambda c: c["assignee_id"] == BILLING, 120)
