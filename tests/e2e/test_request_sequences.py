"""The HTTP requests Chatwoot and System One receive, per demo conversation, against a checked-in expectation.

A change of the HTTP stack (client, transport, pool) must not change what the other side sees: the same
requests, in the same order, with the same tokens, queries and bodies. The demo's conversations are played one
after another (so ids and the order of shared reads are the same every run) through the real sandbox, ingress
and worker; each conversation's requests come from the sandbox's own request log, Chatwoot's and System One's
merged by arrival time (one conversation's commands run one at a time, so arrival order is their order).
Consecutive identical re-reads of the conversation count as one (see `_collapse_rereads`).

After a deliberate change of the requests, regenerate the expectation and review its diff like code:

    GOLDEN_REQUESTS_UPDATE=1 .venv/bin/pytest tests/e2e/test_request_sequences.py
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import re
import time
import uuid
from collections.abc import Iterator
from functools import partial
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from handlers.demo.run import DemoPlayer, LogWatcher, load_bundled
from schemas.config import parse_config
from streams.demo_cmd import _prepare_config
from streams.kafka.local import free_port
from tests.e2e.conftest import Process, wait_until

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

GOLDEN = Path(__file__).resolve().parents[1] / "golden" / "requests" / "demo.json"
RETRY_BASE_MS = 500
SWEEP_CALLS_AT_START = 4  # the worker's start-up sweep: 2 accounts x (pending, open), before any conversation


class DemoStack:
    """Sandbox, ingress and one worker with the demo's configuration; only the start-up sweep runs."""

    def __init__(self, bootstrap: str, tmp: Path) -> None:
        self.bootstrap = bootstrap
        self.sandbox_url = f"http://127.0.0.1:{free_port()}"
        ingress_port, web_port = free_port(), free_port()
        self.health_urls = [f"http://127.0.0.1:{ingress_port}/healthz", f"http://127.0.0.1:{web_port}/healthz"]
        config_path, scenario_path, secrets = _prepare_config(tmp, self.sandbox_url)
        self.config = parse_config(yaml.safe_load(config_path.read_text(encoding="utf-8")))
        self.app_id = f"golden-requests-{uuid.uuid4().hex[:8]}"
        env = {k: v for k, v in os.environ.items() if not k.startswith(("ROUTER_", "CHATWOOT_", "TYPESAFE_"))}
        env.update(
            KAFKA_BOOTSTRAP_SERVERS=bootstrap,
            ROUTER_CONFIG=str(config_path),
            ROUTER_APP_ID=self.app_id,
            ROUTER_PARTITIONS="4",
            ROUTER_DATA_DIR=str(tmp / "state"),
            ROUTER_RETRY_BASE_MS=str(RETRY_BASE_MS),
            ROUTER_SWEEP_INTERVAL_S="3600",  # no periodic sweep: its reads would land between conversations
            # an inbox's bot and an account's agents read once per 5 s would be read or not by how long the
            # conversation before took: each conversation reads them here (tests/integration/test_read_reuse.py
            # shows the reuse)
            ROUTER_SETTINGS_REUSE_MS="0",
            **secrets,
        )
        port = self.sandbox_url.rsplit(":", 1)[1]
        hook = f"http://127.0.0.1:{ingress_port}/chatwoot/agent-bot"
        self.processes = [
            Process(
                "sandbox",
                [
                    *("sandbox", "--port", port, "--scenario", str(scenario_path)),
                    "--webhook-url",
                    hook,
                    "--retry-delay",
                    "1",
                ],
                env,
                tmp,
            ),
            Process("ingress", ["ingress", "--host", "127.0.0.1", "--port", str(ingress_port)], env, tmp),
            Process("worker", ["worker", "--web-port", str(web_port)], env, tmp),
        ]
        self.http = httpx.Client(timeout=10)

    def start(self) -> None:
        for process in self.processes:
            process.start()
        wait_until("the sandbox", lambda: self.http.get(f"{self.sandbox_url}/_sandbox/state").is_success)
        for url in self.health_urls:
            wait_until(url, partial(self._answers_200, url), deadline_s=180, every_s=0.25)

        def start_up_sweep_done() -> bool:
            calls = self.http.get(f"{self.sandbox_url}/_sandbox/log", params={"include": "api_calls"}).json()
            done = [c for c in calls["api_calls"] if c["op"] == "list_conversations" and c["status"] is not None]
            return len(done) >= SWEEP_CALLS_AT_START

        wait_until("the worker's start-up sweep", start_up_sweep_done, deadline_s=60)

    def _answers_200(self, url: str) -> bool:
        return self.http.get(url).status_code == 200

    def stop(self) -> None:
        for process in reversed(self.processes):
            process.stop()
        self.http.close()


@pytest.fixture(scope="module")
def demo_stack(kafka_bootstrap: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[DemoStack]:
    stack = DemoStack(kafka_bootstrap, tmp_path_factory.mktemp("golden-requests"))
    try:
        stack.start()
        yield stack
    finally:
        stack.stop()


def _digest(value: Any) -> str:
    return hashlib.sha256(json.dumps(value, sort_keys=True).encode()).hexdigest()[:16]


def _chatwoot_request(call: dict[str, Any], conversation_id: int) -> dict[str, Any]:
    path = re.sub(rf"/conversations/{conversation_id}(?=/|$)", "/conversations/{c}", call["path"])
    query = "&".join(f"{k}={v}" for k, v in sorted(call["query"].items()))
    row: dict[str, Any] = {"request": f"{call['method']} {path}" + (f"?{query}" if query else "")}
    row.update(token=call["token"], status=call["status"])
    if call.get("fault"):
        row["fault"] = call["fault"]
    if "body" in call:
        row["body"] = call["body"]
    return row


def _systemone_request(call: dict[str, Any]) -> dict[str, Any]:
    # the body is the redacted ticket plus the configuration's questions: a digest proves it unchanged
    return {"request": "POST /v1/systemone", "status": call["status"], "body_sha256": _digest(call["body"])}


def _collapse_rereads(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Consecutive identical reads of the conversation count as one.

    The router's own changes come back as webhooks, and each batch of them folded together starts a run that
    re-reads the conversation and stops (it is no longer pending). How many such webhooks are folded together
    depends on when the sandbox delivers them, not on the HTTP client, so only "at least one re-read" is kept.
    """
    kept: list[dict[str, Any]] = []
    for row in rows:
        if kept and row == kept[-1] and row["request"].startswith("GET ") and row["request"].endswith("/{c}"):
            continue
        kept.append(row)
    return kept


async def _play_one_by_one(stack: DemoStack) -> dict[str, list[dict[str, Any]]]:
    """Each demo conversation played to its end, then the requests that arrived meanwhile and concern it."""
    watcher = LogWatcher(stack.bootstrap, f"{stack.app_id}.conversations", stack.config, RETRY_BASE_MS)
    await watcher.start()
    player = DemoPlayer(stack.sandbox_url, watcher)
    sequences: dict[str, list[dict[str, Any]]] = {}
    try:
        for script in load_bundled("conversations.yaml"):
            before = await player.control("GET", "/log?include=systemone_calls")
            played = await player.play(script)
            assert played.error is None, (script["id"], played.error)
            log = await player.control("GET", f"/log?since_seq={before['last_seq']}")
            timed: list[tuple[float, dict[str, Any]]] = []
            mine = re.compile(rf"^/api/v1/accounts/{played.account_id}/conversations/{played.conversation_id}(/|$)")
            for call in log["api_calls"]:
                if call["op"] == "list_conversations":  # sweeps page the account, not this conversation
                    continue
                if call["op"] in ("get_inbox_bot", "list_canned", "list_agents") or mine.match(call["path"]):
                    timed.append((call["at"], _chatwoot_request(call, played.conversation_id)))
                else:
                    pytest.fail(f"{script['id']}: a request for another conversation: {call['path']}")
            for call in log["systemone_calls"][len(before["systemone_calls"]) :]:
                timed.append((call["at"], _systemone_request(call)))
            sequences[script["id"]] = _collapse_rereads([row for _, row in sorted(timed, key=lambda pair: pair[0])])
    finally:
        await player.aclose()
        await watcher.stop()
    return sequences


def test_the_sandbox_sees_the_recorded_requests_for_every_demo_conversation(
    demo_stack: DemoStack, tmp_path: Path
) -> None:
    began = time.monotonic()
    recorded = asyncio.run(_play_one_by_one(demo_stack))
    if os.environ.get("GOLDEN_REQUESTS_UPDATE"):
        GOLDEN.parent.mkdir(parents=True, exist_ok=True)
        GOLDEN.write_text(json.dumps(recorded, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
        pytest.skip(f"wrote {GOLDEN} ({time.monotonic() - began:.0f} s); review its diff")
    expected = json.loads(GOLDEN.read_text(encoding="utf-8"))
    seen = tmp_path / "recorded.json"  # to diff against the expectation when this fails
    seen.write_text(json.dumps(recorded, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    assert list(recorded) == list(expected)
    for script_id, requests in expected.items():
        assert recorded[script_id] == requests, f"{script_id}: diff {GOLDEN} {seen}"
