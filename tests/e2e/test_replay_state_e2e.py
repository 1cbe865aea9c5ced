"""`replay state --to-app` (DESIGN §8): a blue/green rebuild of the tables from the log, then a cut-over.

The old app routes some conversations and leaves one retrying (a run with a timer); its processes stop; the
rebuild copies the log into the new app, folds it and writes the new changelogs without a single request to
Chatwoot; a worker and an ingress of the new app then finish the retrying conversation, repeat nothing for the
others, and `audit --verify` of the new app is clean. In place, the rebuild refuses while a worker runs.
"""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import pytest

from streams.kafka.local import free_port
from tests.support.processes import Process, run_cli
from tests.support.stack import BILLING, Stack, bot_messages
from tests.support.waiting import wait_until

BILLING_QUESTION = "I was charged twice on my invoice, please refund the payment"
SPAM = "Casino spam advertising: unsolicited marketing offers for you"
MUTATIONS = ("toggle_status", "assign", "set_labels", "create_message")


def cli(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return run_cli(env, *args, timeout_s=180)


def calls(stack: Stack, conversation: int, ops: tuple[str, ...] | None = None) -> list[dict[str, Any]]:
    prefix = f"/api/v1/accounts/1/conversations/{conversation}"
    return [c for c in stack.state()["api_calls"] if c["path"].startswith(prefix) and (ops is None or c["op"] in ops)]


@pytest.mark.timeout(420)
def test_replay_state_to_a_new_app_then_cut_over(kafka_bootstrap: str, app_id: str, tmp_path: Path) -> None:
    stack = Stack(kafka_bootstrap, app_id, tmp_path)
    new_app = f"{app_id}-v2"
    new_env = {**stack.env, "ROUTER_APP_ID": new_app, "ROUTER_DATA_DIR": str(tmp_path / "state-v2")}
    new_web_port = free_port()
    new_worker = Process("worker-v2", ["worker", "--web-port", str(new_web_port)], new_env, tmp_path)
    new_ingress = Process(
        "ingress-v2", ["ingress", "--host", "127.0.0.1", "--port", str(stack.ingress_port)], new_env, tmp_path
    )
    try:
        stack.start()
        billing, spam = stack.new_conversation(), stack.new_conversation()
        stack.customer_says(1, billing, BILLING_QUESTION)
        stack.customer_says(1, spam, SPAM)
        # both turns ended and the bot released (the spam run unassigns it after resolving)
        stack.wait_conversation(1, billing, "assigned", lambda c: c["assignee_id"] == BILLING)
        stack.wait_conversation(
            1, spam, "resolved and released", lambda c: c["status"] == "resolved" and c["bot_assignee_id"] is None
        )
        stack.fault(op="get_conversation", mode="fail", status=503, account_id=1)
        retrying = stack.new_conversation()
        stack.customer_says(1, retrying, BILLING_QUESTION)
        wait_until("the run to retry", lambda: len(calls(stack, retrying, ("get_conversation",))) >= 2)
        stack.worker.stop()
        stack.ingress.stop()
        stack.clear_faults()
        before = len(stack.state()["api_calls"])
        done = {c: len(calls(stack, c, MUTATIONS)) for c in (billing, spam)}

        replayed = stack.run_cli("replay", "state", "--to-app", new_app, timeout_s=180)
        assert replayed.returncode == 0, replayed.stderr
        assert f"rebuilt {app_id} into {new_app}" in replayed.stdout
        assert len(stack.state()["api_calls"]) == before  # the rebuild itself asked Chatwoot nothing
        again = stack.run_cli("replay", "state", "--to-app", new_app, timeout_s=180)
        assert again.returncode == 0 and "0 records copied" in again.stdout  # resumable: nothing copied twice

        new_worker.start()
        new_ingress.start()
        wait_until(
            "the retrying conversation to be routed by the new app",
            lambda: stack.conversation(1, retrying)["assignee_id"] == BILLING,
            deadline_s=120,
        )
        for conversation, count in done.items():
            assert len(calls(stack, conversation, MUTATIONS)) == count, f"{conversation} was changed again"
            assert len(bot_messages(stack.conversation(1, conversation))) == 0

        refused = cli(new_env, "replay", "state")
        assert refused.returncode == 1 and "are running" in refused.stderr

        verified = wait_until(
            "audit --verify of the new app to report 0 differences",
            lambda: (result := cli(new_env, "audit", "--verify")).returncode == 0 and result,
            deadline_s=90,
            every_s=1,
        )
        assert " 0 differences" in verified.stdout
    finally:
        new_worker.stop()
        new_ingress.stop()
        stack.stop()
