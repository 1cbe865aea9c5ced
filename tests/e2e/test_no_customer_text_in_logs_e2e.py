"""Logs and metrics carry no customer text at any level (issue 32 item 1, docs/privacy.md "Logs" and "Metrics").

A stack of its own, its worker at DEBUG (`worker --log-level debug`; the ingress has no level setting and logs at
INFO), routes one conversation whose contact has a unique name and e-mail address and whose message carries a
unique marker word. Once the conversation is routed and the marker has reached System One (so it went through
the worker's memory), none of the marker, the name, the address nor its domain may appear in the worker's or
the ingress's log file, nor in the `/metrics` of either. The sandbox's own log is Chatwoot's, not the router's.
"""

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

from projections.topic_settings import TABLES
from tests.support.kafka import read_all
from tests.support.processes import Process
from tests.support.stack import SALES, Stack
from tests.support.waiting import wait_until


@pytest.fixture(scope="module")
def debug_stack(kafka_bootstrap: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    """A stack of its own whose worker logs at DEBUG (the shared stack's worker logs at INFO)."""
    tmp = tmp_path_factory.mktemp("e2e-privacy")
    running = Stack(kafka_bootstrap, f"e2e-privacy-{os.getpid()}-{int(time.time())}", tmp)
    running.worker = Process(
        "worker", ["worker", "--web-port", str(running.web_port), "--log-level", "debug"], running.env, tmp
    )
    try:
        running.start()
        yield running
    finally:
        running.stop()


def _forms(text: str) -> tuple[str, ...]:
    """`text` as it could appear in a file: itself, and JSON-escaped as the JSON log lines write it."""
    return (text, json.dumps(text)[1:-1], json.dumps(text, ensure_ascii=False)[1:-1])


def _systemone_inputs(stack: Stack) -> list[str]:
    """The bodies System One received (the redacted customer text the worker sent)."""
    calls: list[dict[str, Any]] = stack.control("GET", "/log?since_seq=0&include=systemone_calls")["systemone_calls"]
    return [json.dumps(call.get("body")) for call in calls]


def test_logs_and_metrics_carry_no_customer_text(debug_stack: Stack) -> None:
    """DEBUG logs, INFO logs and /metrics of the worker and the ingress hold no text, name or address."""
    stack = debug_stack
    tag = uuid.uuid4().hex[:8]
    marker = f"quokka{tag}"  # short enough to survive redaction: it must reach System One
    name = f"Zebulon Quimbyfield{tag}"
    address = f"zq.{tag}@mail{tag}.example"
    domain = f"mail{tag}.example"
    conversation = stack.new_conversation(contact_name=name, contact_email=address)
    stack.customer_says(
        1, conversation, f"I need a quote for your pricing plans and a discount {marker}, regards {name} {address}"
    )
    routed = stack.wait_conversation(1, conversation, "assigned to sales", lambda c: c["assignee_id"] == SALES, 90)
    assert routed["status"] != "pending"
    # the marker went through the worker (its redacted text reached System One), so the check below is not vacuous
    assert wait_until("the marker at System One", lambda: any(marker in b for b in _systemone_inputs(stack)), 30)
    stack.log.wait_settled(1, conversation, "the run to end")  # every record of it folded: its log lines written

    pages = {
        "worker /metrics": stack.metrics(),
        "ingress /metrics": stack.http.get(f"http://127.0.0.1:{stack.ingress_port}/metrics").text,
    }
    logs = {
        process.name: Path(process.log_path).read_text(errors="replace") for process in (stack.worker, stack.ingress)
    }
    assert '"level": "debug"' in logs["worker"] or '"level":"debug"' in logs["worker"], "the worker logged no DEBUG"
    assert f"1:{conversation}" in logs["worker"]  # the worker did log about this conversation (by its key)
    leaks = [
        f"{private!r} in {where}"
        for where, text in {**{f"{k} log": v for k, v in logs.items()}, **pages}.items()
        for private in (marker, name, *name.split(), address, domain)
        if any(form in text for form in _forms(private))
    ]
    assert not leaks, "customer data in logs or metrics: " + "; ".join(leaks)


def test_topics_and_changelogs_carry_only_sealed_customer_text(debug_stack: Stack) -> None:
    """Issue 32 item 2: the customer's text and e-mail domain enter every record sealed under the conversation's
    data key, so no topic of the app holds them in clear (`conversations`, `effects`, the changelogs, `keys`),
    while the routing still happened on them (System One received the text)."""
    stack = debug_stack
    tag = uuid.uuid4().hex[:8]
    marker = f"wombat{tag}"
    domain = f"post{tag}.example"
    conversation = stack.new_conversation(contact_name=f"Ottoline Vexley{tag}", contact_email=f"ov.{tag}@{domain}")
    stack.customer_says(1, conversation, f"I need a quote for your pricing plans {marker}")
    stack.wait_conversation(1, conversation, "assigned to sales", lambda c: c["assignee_id"] == SALES, 90)
    assert wait_until("the marker at System One", lambda: any(marker in b for b in _systemone_inputs(stack)), 30)
    assert any(domain in b for b in _systemone_inputs(stack))  # opened in memory to ask System One
    stack.log.wait_settled(1, conversation, "the run to end")
    app, bootstrap = stack.env["ROUTER_APP_ID"], stack.env["KAFKA_BOOTSTRAP_SERVERS"]
    topics = [
        f"{app}.conversations",
        f"{app}.effects",
        f"{app}.keys",
        *(f"{app}-{table}-changelog" for table in TABLES),
    ]
    held = {topic: asyncio.run(read_all(bootstrap, topic)) for topic in topics}
    assert held[f"{app}.keys"], "no data key was made"
    sealed = [r for r in held[f"{app}.conversations"] if b'"sealed_text"' in (r.value or b"")]
    assert any(r.key == f"1:{conversation}".encode() for r in sealed), "the turn read was not sealed"
    leaks = [
        f"{private!r} on {topic}"
        for topic, records in held.items()
        for private in (marker, domain)
        if any(private.encode() in (r.value or b"") for r in records)
    ]
    assert not leaks, "customer data in clear on Kafka: " + "; ".join(leaks)
