"""A mutation is never made on an old read, even when its worker died before making it (issue 22).

The worker issues a billing question's assignment to its owner (on `<app>.effects`) and is frozen (SIGSTOP) the
moment the command is on the topic, then SIGKILLed: verified from outside, Chatwoot never saw the mutation. A person
then takes the conversation over while the partition has no owner; their webhook reaches `<app>.conversations`. The
restarted worker consumes that very command copy, which its run still awaits, and must not make it: its fold
first passes the head the worker found at assignment (the takeover), and the read is older than
ROUTER_FRESH_READ_MS by then anyway. The conversation stays the person's.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import threading
from typing import Any

import pytest
from aiokafka import AIOKafkaConsumer

from handlers.kafka.topic_io import topic_partitions
from tests.support.stack import SALES, Stack
from tests.support.waiting import wait_until

BILLING = "I was charged twice on my invoice, please refund the payment"
ADMIN = 1  # the sandbox's administrator, who assigns the conversation to the sales agent (not the router's choice)
ATTEMPTS = 12
MUTATIONS = {"set_labels", "toggle_status", "assign", "create_message"}


class FreezeOnCommand:
    """Watches `<app>.effects` and freezes the worker (SIGSTOP) as soon as a wanted command is on it."""

    def __init__(self, bootstrap: str, topic: str, pid: int) -> None:
        self.bootstrap, self.topic, self.pid = bootstrap, topic, pid
        self.wanted: tuple[str, str] | None = None  # (key, op)
        self.frozen = threading.Event()
        self.ready = threading.Event()
        self.stopping = threading.Event()
        self.thread = threading.Thread(target=lambda: asyncio.run(self._watch()), daemon=True)

    def start(self) -> None:
        self.thread.start()
        assert self.ready.wait(30), "the effects watcher did not start"

    def arm(self, key: str, op: str) -> None:
        self.frozen.clear()
        self.wanted = (key, op)

    def stop(self) -> None:
        self.stopping.set()
        self.thread.join(10)

    async def _watch(self) -> None:
        partitions = await topic_partitions(self.bootstrap, self.topic)
        consumer = AIOKafkaConsumer(bootstrap_servers=self.bootstrap, enable_auto_commit=False, fetch_max_wait_ms=5)
        await consumer.start()
        try:
            consumer.assign(partitions)
            await consumer.seek_to_end(*partitions)
            for tp in partitions:
                await consumer.position(tp)
            self.ready.set()
            while not self.stopping.is_set():
                batches = await consumer.getmany(timeout_ms=50)
                for records in batches.values():
                    for record in records:
                        command = json.loads(record.value)
                        if self.wanted == (command.get("key"), command.get("params", {}).get("op")):
                            os.kill(self.pid, signal.SIGSTOP)
                            self.wanted = None
                            self.frozen.set()
        finally:
            await consumer.stop()


def api_calls(stack: Stack, conversation: int) -> list[dict[str, Any]]:
    log = stack.control("GET", "/log?include=api_calls")
    path = f"/api/v1/accounts/1/conversations/{conversation}"
    return [c for c in log["api_calls"] if c["path"] == path or c["path"].startswith(path + "/")]


def mutations(stack: Stack, conversation: int) -> list[dict[str, Any]]:
    return [c for c in api_calls(stack, conversation) if c["op"] in MUTATIONS and c["token"] == "bot"]


@pytest.mark.timeout(600)
def test_a_command_issued_before_the_worker_died_is_not_made_after_a_persons_takeover(
    stack: Stack, kafka_bootstrap: str
) -> None:
    app_id = stack.env["ROUTER_APP_ID"]
    stack.wait_worker_healthy()
    pid = stack.worker.pid
    assert pid is not None
    watcher = FreezeOnCommand(kafka_bootstrap, f"{app_id}.effects", pid)
    watcher.start()
    conversation = None
    try:
        for _ in range(ATTEMPTS):  # the freeze must land between the command's write and its execution
            candidate = stack.new_conversation()
            watcher.arm(f"1:{candidate}", "assign")
            stack.customer_says(1, candidate, BILLING)
            assert watcher.frozen.wait(60), "the assignment never reached the effects topic"
            stack.worker.stop(signal.SIGKILL)
            if not mutations(stack, candidate):
                conversation = candidate
                break
            stack.worker.start()  # too late: the assignment was made before the freeze; try another conversation
            stack.wait_worker_healthy()
            watcher.pid = stack.worker.pid or 0
    finally:
        watcher.stop()
    assert conversation is not None, f"no freeze landed between issue and execution in {ATTEMPTS} tries"

    # a person takes the conversation over while its partition has no owner; the webhook reaches the log
    path = f"/conversations/1/{conversation}/assign"
    stack.control("POST", path, {"user_id": ADMIN, "assignee_id": SALES})
    assert stack.conversation(1, conversation)["status"] == "open"
    stack.control("POST", "/settle", {"timeout_s": 30})
    takeover_seq = stack.control("GET", "/log?include=person_actions")["last_seq"]

    stack.worker.start()
    stack.wait_worker_healthy()
    # seen from outside: the customer writes again, and that run's first read reaches Chatwoot through the
    # conversation's lane after the assignment command consumed before it (dropped or made, in order); then the
    # conversation's records show every run ended
    stack.customer_says(1, conversation, "Any news on my refund?")
    wait_until(
        "the next run's read to reach Chatwoot",
        lambda: [
            c for c in api_calls(stack, conversation) if c["seq"] > takeover_seq and c["op"] == "get_conversation"
        ],
        120,
        0.5,
    )
    stack.log.wait_settled(1, conversation, "every run of the conversation to end", deadline_s=120)
    after = [c for c in api_calls(stack, conversation) if c["seq"] > takeover_seq]
    assert [c for c in after if c["op"] in MUTATIONS and c["token"] == "bot"] == [], after
    final = stack.conversation(1, conversation)
    assert final["assignee_id"] == SALES and final["status"] == "open" and final["labels"] == []
