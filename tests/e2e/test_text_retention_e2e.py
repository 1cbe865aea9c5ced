"""ROUTER_TEXT_RETENTION_DAYS end to end (issue 32 item 3): on a worker that keeps customer text for about 43 s,
a routed conversation's text is erased once it has been idle that long (its key fenced on `<app>.keys` with scope
`text`, a `Forgotten` of scope `text` on the log), `audit` still tells what the router did and shows the text as
erased, and the conversation is routed again when the customer comes back, under a new key."""

from __future__ import annotations

import asyncio
import json
import os
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.kafka import read_all
from tests.support.stack import SALES, Stack

RETENTION_DAYS = "0.0005"  # 43.2 s


@pytest.fixture(scope="module")
def short_retention(kafka_bootstrap: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    tmp = tmp_path_factory.mktemp("e2e-retention")
    app = f"e2e-retention-{os.getpid()}-{int(time.time())}"
    running = Stack(kafka_bootstrap, app, tmp, env={"ROUTER_TEXT_RETENTION_DAYS": RETENTION_DAYS})
    try:
        running.start()
        yield running
    finally:
        running.stop()


def records_of(stack: Stack, topic: str, key: str) -> list[dict[str, Any]]:
    app, bootstrap = stack.env["ROUTER_APP_ID"], stack.env["KAFKA_BOOTSTRAP_SERVERS"]
    found = []
    for record in asyncio.run(read_all(bootstrap, f"{app}.{topic}")):
        value = json.loads(record.value)
        if record.key == key.encode() or value.get("key") == key:  # a changelog's key is serialized its own way
            found.append(value)
    return found


def wait_for(what: str, probe: Any, deadline_s: float) -> Any:
    deadline = time.monotonic() + deadline_s
    while time.monotonic() < deadline:
        found = probe()
        if found:
            return found
        time.sleep(1)  # polling interval, bounded by the deadline
    pytest.fail(f"timed out waiting for {what}")


def test_text_older_than_the_retention_is_erased_and_the_conversation_is_routed_again(
    short_retention: Stack, tmp_path: Path
) -> None:
    stack = short_retention
    first, second = f"ocelot{uuid.uuid4().hex[:6]}", f"heron{uuid.uuid4().hex[:6]}"
    conversation = stack.new_conversation()
    key = f"1:{conversation}"
    stack.customer_says(1, conversation, f"I need a quote for your pricing plans {first}")
    stack.wait_conversation(1, conversation, "assigned to sales", lambda c: c["assignee_id"] == SALES, 90)

    def text_erased() -> list[dict[str, Any]]:
        return [
            r for r in records_of(stack, "conversations", key) if r["type"] == "forgotten" and r.get("scope") == "text"
        ]

    [proof] = wait_for("the text's erasure", text_erased, 180)
    assert proof["reason"] == "text_retention"
    fence = records_of(stack, "keys", key)[-1]
    assert fence["type"] == "erased" and fence["scope"] == "text" and "wrapped" not in fence

    audit = stack.run_cli("audit", "--conversation", key, "--html", str(tmp_path / "erased.html"))
    assert audit.returncode == 0, audit.stderr
    assert "text erased" in audit.stdout and "sales" in audit.stdout  # what the router did is still told
    page = (tmp_path / "erased.html").read_text()
    assert first not in page and "older than ROUTER_TEXT_RETENTION_DAYS" in page

    # the customer comes back: the conversation is routed again, its new text sealed under a new key
    stack.control("POST", f"/conversations/1/{conversation}/status", {"user_id": 1, "status": "resolved"})
    stack.customer_says(1, conversation, f"and a quote for the enterprise plan {second}")
    stack.wait_conversation(1, conversation, "routed again", lambda c: c["status"] == "open", 90)
    stack.log.wait_settled(1, conversation, "its second turn to end")
    latest = records_of(stack, "keys", key)[-1]
    assert latest["type"] == "data_key" and latest["created_ms"] >= fence["at_ms"]
    again = stack.run_cli("audit", "--conversation", key, "--html", str(tmp_path / "again.html"))
    assert again.returncode == 0, again.stderr
    page = (tmp_path / "again.html").read_text()
    assert second in page and first not in page  # the new text opens; the old one stays erased
