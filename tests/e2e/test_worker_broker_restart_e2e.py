"""A worker rides out its broker's restarts (issue 26 item 5): the stack on a broker of its own that is stopped
(SIGTERM, then SIGKILL) and started again on the same port and data dir.

Asserted from outside: the worker never exits (same process throughout); its `/healthz` is not 200 while the
broker is away; once the broker serves again its `/healthz` is 200 and a new conversation is routed to its end,
each within `BACK_DEADLINE_S`, a deadline that only catches a worker that never comes back. How soon it comes back
is printed (`-s`), not asserted: the issue's 5 s target is measured by `bench/recovery_bench.py`.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest

from streams.kafka.local import start_broker
from tests.support.stack import Stack
from tests.support.waiting import wait_until

BILLING = "I was charged twice on my invoice, please refund the payment"
AWAY_DEADLINE_S = 60.0  # for /healthz to stop answering 200 once the broker is gone (its probe runs every 0.5 s)
BACK_DEADLINE_S = 120.0  # for /healthz 200, then a new conversation routed, once the broker is back


def routed(stack: Stack, conversation: int) -> bool:
    found = stack.conversation(1, conversation)
    return found["status"] != "pending" and found.get("bot_assignee_id") is None


@pytest.mark.kafka  # its own broker, restarted
@pytest.mark.slow
@pytest.mark.timeout(900)
def test_a_worker_rides_out_broker_restarts_and_routes_again(tmp_path: Path) -> None:
    data_dir = tmp_path / "kafka"
    broker = start_broker(None, data_dir)
    stack = Stack(broker.bootstrap, f"restart-{os.getpid()}-{int(time.time())}", tmp_path)
    lines: list[str] = []
    try:
        stack.start()
        first = stack.new_conversation()
        stack.customer_says(1, first, BILLING)
        wait_until("a first conversation routed", lambda: routed(stack, first), BACK_DEADLINE_S, 0.2)
        pid = stack.worker.pid
        for how in (signal.SIGTERM, signal.SIGKILL):
            if how == signal.SIGTERM:
                broker.stop()
            else:
                broker.kill()
            wait_until(
                "the worker's /healthz not 200 while the broker is away",
                lambda: stack.healthz().status_code != 200,
                AWAY_DEADLINE_S,
                0.1,
            )
            broker = start_broker(broker.port, data_dir)
            ready = time.monotonic()
            wait_until(
                "the worker's /healthz 200 after the broker is back",
                lambda: stack.healthz().status_code == 200,
                BACK_DEADLINE_S,
                0.1,
            )
            healthy_s = time.monotonic() - ready
            conversation = stack.new_conversation()
            stack.customer_says(1, conversation, BILLING)
            wait_until(
                "a conversation routed after the broker is back",
                lambda c=conversation: routed(stack, c),  # type: ignore[misc]
                BACK_DEADLINE_S,
                0.1,
            )
            routed_s = time.monotonic() - ready
            assert stack.worker.alive() and stack.worker.pid == pid, "the worker exited"
            lines.append(  # measured, not asserted (bench/recovery_bench.py tracks them)
                f"{how.name}: /healthz 200 {healthy_s:.1f} s and a new conversation routed {routed_s:.1f} s "
                "after the broker was ready"
            )
    finally:
        print("\n" + "\n".join(lines))
        stack.stop()
        broker.stop()
