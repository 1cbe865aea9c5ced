"""`chatwoot-router whatif` against a live-routed sandbox scenario (DESIGN §8): candidates that change one kind's
status, remove an owner, and change nothing, re-decided from the event log alone; `--ask` puts the new questions
to System One once (then the cache answers), and Chatwoot never sees a request from any of it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.e2e.conftest import BILLING, ROOT, SALES, Stack, bot_messages, router_config, wait_until

pytestmark = pytest.mark.e2e

BILLING_QUESTION = "I was charged twice on my invoice, please refund the payment"
SPAM = "Casino spam advertising: unsolicited marketing offers for you"
SALES_QUESTION = "Can I get a sales quote and pricing plans for a discount?"
HOURS = "What are your opening hours? When is the shop open or closed?"


def whatif(stack: Stack, *args: str, ask: bool = False, kek: bool = True) -> subprocess.CompletedProcess[str]:
    """The command with only where the log is, the key-encryption key that opens its sealed inputs (issue 32) and
    System One's key for --ask: no Chatwoot token at all."""
    keep = {k: v for k, v in os.environ.items() if k in ("PATH", "HOME", "LANG", "PYTHONPATH")}
    env = {
        **keep,
        "KAFKA_BOOTSTRAP_SERVERS": stack.env["KAFKA_BOOTSTRAP_SERVERS"],
        "ROUTER_APP_ID": stack.env["ROUTER_APP_ID"],
    }
    if kek:
        env["ROUTER_KEY_ENCRYPTION_KEY"] = stack.env["ROUTER_KEY_ENCRYPTION_KEY"]
    if ask:
        env["TYPESAFE_API_KEY"] = stack.env["TYPESAFE_API_KEY"]
    return subprocess.run(
        [sys.executable, "-m", "streams.cli", "whatif", *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def candidate(stack: Stack, tmp: Path, name: str, change: Any = None) -> str:
    config = router_config(stack.sandbox_url)
    if change is not None:
        change(config["routing"])
    path = tmp / f"{name}.json"
    path.write_text(json.dumps(config))
    return str(path)


def report(stack: Stack, tmp: Path, config: str, *extra: str, ask: bool = False) -> tuple[str, dict[str, Any]]:
    out = tmp / "report.json"
    result = whatif(stack, "--config", config, "--json", str(out), *extra, ask=ask)
    assert result.returncode == 0, result.stderr
    return result.stdout, json.loads(out.read_text())


def sandbox_log(stack: Stack, since: int) -> dict[str, Any]:
    response = httpx.get(f"{stack.sandbox_url}/_sandbox/log", params={"since_seq": since}, timeout=10)
    response.raise_for_status()
    log: dict[str, Any] = response.json()
    return log


@pytest.mark.timeout(400)
def test_whatif_re_decides_the_recorded_turns_without_touching_chatwoot(
    kafka_bootstrap: str, app_id: str, tmp_path: Path
) -> None:
    stack = Stack(kafka_bootstrap, app_id, tmp_path)
    try:
        stack.start()
        conversations = {}
        for name, text in (("billing", BILLING_QUESTION), ("spam", SPAM), ("sales", SALES_QUESTION), ("hours", HOURS)):
            conversations[name] = stack.new_conversation()
            stack.customer_says(1, conversations[name], text)
        stack.wait_conversation(1, conversations["billing"], "assigned", lambda c: c["assignee_id"] == BILLING)
        stack.wait_conversation(1, conversations["sales"], "assigned", lambda c: c["assignee_id"] == SALES)
        stack.wait_conversation(
            1, conversations["spam"], "resolved", lambda c: c["status"] == "resolved" and c["bot_assignee_id"] is None
        )
        stack.wait_conversation(
            1, conversations["hours"], "replied and handed off", lambda c: c["status"] == "open" and bot_messages(c)
        )
        identity = candidate(stack, tmp_path, "identity")

        def all_recorded() -> bool:
            result = whatif(stack, "--config", identity, "--json", str(tmp_path / "probe.json"))
            return result.returncode == 0 and json.loads((tmp_path / "probe.json").read_text())["totals"][
                "compared"
            ] == len(conversations)

        wait_until("every decided turn's ending to be on the log", all_recorded, deadline_s=90, every_s=1)
        stack.worker.stop()  # from here on, any Chatwoot request could only come from whatif
        stack.ingress.stop()
        since = sandbox_log(stack, 0)["last_seq"]
        key = {name: f"1:{c}" for name, c in conversations.items()}

        text, same = report(stack, tmp_path, identity, "--html", str(tmp_path / "same.html"))
        assert same["totals"] == {"compared": 4, "unchanged": 4, "changed": 0, "needs_new_decision": 0}
        assert {(c["live"], c["candidate"], c["turns"]) for c in same["matrix"]} == {
            (f"assigned to billing (user {BILLING})", f"assigned to billing (user {BILLING})", 1),
            (f"assigned to sales (user {SALES})", f"assigned to sales (user {SALES})", 1),
            ("ended resolved", "ended resolved", 1),
            ("handed off: unclear_owner", "handed off: unclear_owner", 1),
        }
        assert "changed turns (0)" in text
        page = (tmp_path / "same.html").read_text()
        assert "<script" not in page and "turns compared" in page
        hours = next(t for t in same["turns"] if t["conversation"] == key["hours"])
        assert hours["live"]["canned_reply"] is True and hours["candidate"]["canned_reply"] is True

        snoozed = candidate(stack, tmp_path, "snoozed", lambda r: r["kinds"]["1"]["spam"].update(status="snoozed"))
        text, changed = report(stack, tmp_path, snoozed)
        assert changed["totals"] == {"compared": 4, "unchanged": 3, "changed": 1, "needs_new_decision": 0}
        assert {"live": "ended resolved", "candidate": "ended snoozed", "turns": 1} in changed["matrix"]
        (turn,) = [t for t in changed["turns"] if t["status"] == "changed"]
        assert turn["conversation"] == key["spam"]
        assert f"  {key['spam']} run 1 at " in text
        assert "    live:      ended resolved; labels spam\n    candidate: ended snoozed; labels spam\n" in text
        assert 'routing.kinds.1.spam.status: "resolved" → "snoozed"' in text
        only_spam = whatif(stack, "--config", snoozed, "--conversation", key["spam"])
        assert "  turns compared             1" in only_spam.stdout
        assert "  turns compared             0" in whatif(stack, "--config", snoozed, "--account", "2").stdout

        no_sales = candidate(stack, tmp_path, "no-sales", lambda r: r["accounts"]["1"].pop("sales"))
        text, needs = report(stack, tmp_path, no_sales)
        assert needs["totals"] == {"compared": 4, "unchanged": 0, "changed": 0, "needs_new_decision": 4}
        assert {t["conversation"]: t["needs_new_decision"] for t in needs["turns"]} == {
            k: ["owners"] for k in key.values()
        }
        assert "    candidate: needs a new decision (owners)" in text
        assert "routing.accounts.1.sales.assignee: 3 → (absent)" in text
        # without the key-encryption key the sealed inputs stay shut: not re-decidable, and never asked
        asked_so_far = len(sandbox_log(stack, since)["systemone_calls"])
        shut = whatif(stack, "--config", no_sales, "--ask", "--cache", str(tmp_path / "shut"), ask=True, kek=False)
        assert shut.returncode == 0, shut.stderr
        assert shut.stdout.count("its input is sealed: not re-decidable without opening it") == 4
        assert len(sandbox_log(stack, since)["systemone_calls"]) == asked_so_far  # nothing sealed was sent

        cache = str(tmp_path / "cache")
        before = len(sandbox_log(stack, since)["systemone_calls"])  # the log keeps every System One call
        text, asked = report(stack, tmp_path, no_sales, "--ask", "--cache", cache, ask=True)
        assert len(sandbox_log(stack, since)["systemone_calls"]) == before + 4
        assert asked["ask"] == {"asked": 4, "cached": 0, "failed": 0}
        assert asked["totals"] == {"compared": 4, "unchanged": 3, "changed": 1, "needs_new_decision": 0}
        (turn,) = [t for t in asked["turns"] if t["status"] == "changed"]
        assert turn["conversation"] == key["sales"]
        assert turn["live"]["outcome"] == f"assigned to sales (user {SALES})"
        assert turn["candidate"]["outcome"] == "handed off: unclear_owner"

        text, again = report(stack, tmp_path, no_sales, "--ask", "--cache", cache, ask=True)
        assert len(sandbox_log(stack, since)["systemone_calls"]) == before + 4  # the cache answered everything
        assert again["ask"] == {"asked": 0, "cached": 4, "failed": 0}
        assert again["totals"] == asked["totals"] and again["matrix"] == asked["matrix"]
        assert "System One: 0 asked, 4 from the cache, 0 failed" in text

        invalid = candidate(stack, tmp_path, "invalid", lambda r: r.update(minConfidence=2))
        refused = whatif(stack, "--config", invalid)
        assert refused.returncode == 2 and refused.stderr.startswith("Invalid CONFIG: ")
        assert "routing.minConfidence" in refused.stderr

        quiet = sandbox_log(stack, since)
        assert quiet["api_calls"] == [], "whatif must never send a request to Chatwoot"
        for text_seen in (BILLING_QUESTION, SALES_QUESTION, "charged twice"):
            assert text_seen not in json.dumps(asked) and text_seen not in text
    finally:
        stack.stop()
