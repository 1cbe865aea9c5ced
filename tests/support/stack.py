"""The end-to-end stack: the real broker, `chatwoot-router sandbox`, `ingress` and `worker` as subprocesses,
talking over loopback HTTP exactly as in production, and the sandbox's control API to act as customers and people.

The router is configured with two accounts: account 1 (owners billing/sales; kinds spam -> resolved, hours
-> canned reply "hours") and account 2 (one owner), whose inbox the disconnect test unlinks by a fault rule.
Retries back off from 200 ms so failure paths finish in seconds.
"""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import httpx

from sandbox.scenario import from_config
from schemas.config import parse_config
from streams.kafka.local import free_port
from tests.support.env import TEST_KEK, outside_env
from tests.support.processes import ROOT, Process
from tests.support.trail import ConversationLog
from tests.support.waiting import wait_until

USER_TOKEN = "e2e-user-token"
BOT_TOKENS = {1: "e2e-bot-1", 2: "e2e-bot-2"}
BOT_SECRETS = {1: "e2e-secret-1", 2: "e2e-secret-2"}
API_KEY = "e2e-jev-key"
BILLING, SALES = 2, 3  # user ids of the owners in account 1
INBOX_1, INBOX_2 = 101, 201
RETRY_BASE_MS = 200


def router_config(sandbox_url: str) -> dict[str, Any]:
    return {
        "chatwoot": {"baseUrl": sandbox_url},
        "routing": {
            "endpoint": f"{sandbox_url}/v1/systemone",
            "botIds": {"1": 5, "2": 6},
            "accounts": {
                "1": {
                    "billing": {"assignee": BILLING, "covers": "Billing, invoices, charges, payments and refunds."},
                    "sales": {"assignee": SALES, "covers": "Sales quotes, pricing plans and discounts."},
                },
                "2": {"support": {"assignee": BILLING, "covers": "Technical support for broken devices."}},
            },
            "kinds": {
                "1": {
                    "spam": {
                        "covers": "Spam, advertising, unsolicited marketing offers, casino.",
                        "status": "resolved",
                    },
                    "hours": {"covers": "Opening hours, when the shop is open or closed.", "cannedResponse": "hours"},
                }
            },
        },
    }


class Stack:
    """The running system plus helpers that act as customers and people through the sandbox's control API."""

    def __init__(
        self,
        bootstrap: str,
        app_id: str,
        tmp: Path,
        sandbox_args: Sequence[str] = (),
        env: Mapping[str, str] | None = None,
    ) -> None:
        """`sandbox_args` go to `chatwoot-router sandbox` (e.g. `--realistic`); `env` comes on top of the router's
        variables for every process."""
        self.tmp = tmp
        self.realistic = "--realistic" in sandbox_args
        self.sandbox_port, self.ingress_port, self.web_port = free_port(), free_port(), free_port()
        self.sandbox_url = f"http://127.0.0.1:{self.sandbox_port}"
        self.config_path = tmp / "router.json"
        config = router_config(self.sandbox_url)
        self.config_path.write_text(json.dumps(config))
        scenario = from_config(
            parse_config(config),
            user_token=USER_TOKEN,
            bot_tokens=BOT_TOKENS,
            bot_secrets=BOT_SECRETS,
            api_key=API_KEY,
        )
        # a failed webhook leaves the conversation pending (so a lost webhook is the sweep's to find)
        scenario["accounts"][0]["keep_pending_on_bot_failure"] = True
        (tmp / "scenario.json").write_text(json.dumps(scenario))
        self.env = outside_env()
        self.env.update(
            ROUTER_CONFIG=str(self.config_path),
            KAFKA_BOOTSTRAP_SERVERS=bootstrap,
            ROUTER_APP_ID=app_id,
            ROUTER_PARTITIONS="4",
            ROUTER_DATA_DIR=str(tmp / "state"),
            ROUTER_RETRY_BASE_MS=str(RETRY_BASE_MS),
            ROUTER_SWEEP_INTERVAL_S="15",
            CHATWOOT_TOKEN=USER_TOKEN,
            CHATWOOT_AGENT_BOT_TOKENS=json.dumps({str(k): v for k, v in BOT_TOKENS.items()}),
            CHATWOOT_AGENT_BOT_SECRETS=json.dumps({str(k): v for k, v in BOT_SECRETS.items()}),
            TYPESAFE_API_KEY=API_KEY,
            ROUTER_KEY_ENCRYPTION_KEY=TEST_KEK,
        )
        self.env.update(env or {})
        self.sandbox = Process(
            "sandbox",
            [
                "sandbox",
                "--port",
                str(self.sandbox_port),
                "--scenario",
                str(tmp / "scenario.json"),
                "--webhook-url",
                f"http://127.0.0.1:{self.ingress_port}/chatwoot/agent-bot",
                "--retry-delay",
                "0.3",
                *sandbox_args,
            ],
            self.env,
            tmp,
        )
        self.ingress = Process(
            "ingress", ["ingress", "--host", "127.0.0.1", "--port", str(self.ingress_port)], self.env, tmp
        )
        self.worker = Process("worker", ["worker", "--web-port", str(self.web_port)], self.env, tmp)
        self.http = httpx.Client(timeout=10)
        self.log = ConversationLog(bootstrap, app_id, parse_config(config), RETRY_BASE_MS)

    # --- processes ---

    def start(self) -> None:
        """Start the three processes and wait until each answers; a start that fails stops what it started."""
        try:
            for process in (self.sandbox, self.ingress, self.worker):
                process.start()
            wait_until("the sandbox", lambda: self.http.get(f"{self.sandbox_url}/_sandbox/state").status_code == 200)
            wait_until("the ingress", lambda: self.http.get(f"http://127.0.0.1:{self.ingress_port}/healthz").is_success)
            self.wait_worker_healthy()
        except BaseException:
            self.stop()
            raise

    def wait_worker_healthy(self, deadline_s: float = 120) -> None:
        def healthy() -> bool:
            assert self.worker.alive(), f"worker exited:\n{self.worker.log_tail()}"
            return self.healthz().status_code == 200

        wait_until("the worker's /healthz", healthy, deadline_s, every_s=0.25)

    def healthz(self) -> httpx.Response:
        return self.http.get(f"http://127.0.0.1:{self.web_port}/healthz")

    def metrics(self) -> str:
        return self.http.get(f"http://127.0.0.1:{self.web_port}/metrics").text

    def stop(self) -> None:
        """Stop every process (each is stopped even when another's stop fails); safe to call twice."""
        try:
            for process in (self.worker, self.ingress, self.sandbox):
                with contextlib.suppress(Exception):
                    process.stop()
        finally:
            self.http.close()

    def run_cli(self, *args: str, timeout_s: float = 60) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "streams.cli", *args],
            cwd=ROOT,
            env=self.env,
            capture_output=True,
            text=True,
            timeout=timeout_s,
            check=False,
        )

    # --- the sandbox's control API ---

    def control(self, method: str, path: str, body: dict[str, Any] | None = None) -> Any:
        response = self.http.request(method, f"{self.sandbox_url}/_sandbox{path}", json=body)
        assert response.is_success, f"{method} {path}: {response.status_code} {response.text}"
        return response.json()

    def new_conversation(self, account: int = 1, inbox: int = INBOX_1, **fields: Any) -> int:
        created = self.control("POST", "/conversations", {"account_id": account, "inbox_id": inbox, **fields})
        return int(created["id"])

    def customer_says(self, account: int, conversation: int, text: str) -> dict[str, Any]:
        result: dict[str, Any] = self.control(
            "POST", f"/conversations/{account}/{conversation}/incoming", {"content": text}
        )
        return result

    def conversation(self, account: int, conversation: int) -> dict[str, Any]:
        result: dict[str, Any] = self.control("GET", f"/conversations/{account}/{conversation}")
        return result

    def settle(self, timeout_s: float = 30) -> None:
        """Every webhook the sandbox queued so far is delivered (answered by the door, so durable on the log):
        says nothing about the worker; wait on the conversation's own records for that (`self.log`)."""
        self.control("POST", "/settle", {"timeout_s": timeout_s})

    def fault(self, **rule: Any) -> None:
        self.control("POST", "/faults", rule)

    def clear_faults(self) -> None:
        self.control("DELETE", "/faults")

    def state(self) -> dict[str, Any]:
        result: dict[str, Any] = self.control("GET", "/state")
        return result

    def wait_conversation(
        self,
        account: int,
        conversation: int,
        what: str,
        check: Callable[[dict[str, Any]], bool],
        deadline_s: float = 60,
    ) -> dict[str, Any]:
        def probe() -> dict[str, Any] | None:
            assert self.worker.alive(), f"worker exited:\n{self.worker.log_tail()}"
            current = self.conversation(account, conversation)
            return current if check(current) else None

        result: dict[str, Any] = wait_until(f"{account}:{conversation} {what}", probe, deadline_s)
        return result


def bot_messages(conversation: dict[str, Any]) -> list[dict[str, Any]]:
    """Outgoing messages sent by an agent bot."""
    return [
        m
        for m in conversation["messages"]
        if m["message_type"] == 1 and (m.get("sender") or {}).get("type") == "agent_bot"
    ]
