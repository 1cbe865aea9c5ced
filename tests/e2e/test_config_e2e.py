"""Configuration is an event (DESIGN §8): `config apply` switches every partition at a marker the log records,
so `audit --verify` needs nothing but the bootstrap servers and the app id, and a timeline shows the switch."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.processes import ROOT
from tests.support.stack import Stack, router_config
from tests.support.waiting import wait_until

SPAM = "Casino spam advertising: unsolicited marketing offers for you"


def bare_env(stack: Stack) -> dict[str, str]:
    """No configuration file, no fold settings, no secrets: only where the log is."""
    keep = {k: v for k, v in os.environ.items() if k in ("PATH", "HOME", "LANG", "PYTHONPATH")}
    return {
        **keep,
        "KAFKA_BOOTSTRAP_SERVERS": stack.env["KAFKA_BOOTSTRAP_SERVERS"],
        "ROUTER_APP_ID": stack.env["ROUTER_APP_ID"],
    }


def audit(stack: Stack, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "streams.cli", "audit", *args],
        cwd=ROOT,
        env=bare_env(stack),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


@pytest.mark.timeout(300)
def test_a_configuration_applied_mid_stream_is_folded_from_its_marker_and_audits_clean(
    kafka_bootstrap: str, app_id: str, tmp_path: Path
) -> None:
    stack = Stack(kafka_bootstrap, app_id, tmp_path)
    try:
        stack.start()
        before = stack.new_conversation()
        stack.customer_says(1, before, SPAM)
        stack.wait_conversation(1, before, "spam resolved", lambda c: c["status"] == "resolved")

        changed = router_config(stack.sandbox_url)
        changed["routing"]["kinds"]["1"]["spam"]["status"] = "snoozed"
        path = tmp_path / "changed.json"
        path.write_text(json.dumps(changed))
        applied = stack.run_cli("config", "apply", str(path))
        assert applied.returncode == 0, applied.stderr
        assert "partitions marked" in applied.stdout
        version = applied.stdout.split("version ")[1].split(":")[0]
        again = stack.run_cli("config", "apply", str(path))
        assert "already in force" in again.stdout

        after = stack.new_conversation()
        stack.customer_says(1, after, SPAM)
        stack.wait_conversation(1, after, "spam snoozed under the new version", lambda c: c["status"] == "snoozed")
        assert stack.conversation(1, before)["status"] == "resolved"  # nothing re-decided

        verified = wait_until(
            "audit --verify with only the bootstrap and app id to report 0 differences",
            lambda: (result := audit(stack, "--verify")).returncode == 0 and result,
            deadline_s=90,
            every_s=1,
        )
        assert " 0 differences" in verified.stdout
        timeline = audit(stack, "--conversation", f"1:{after}")
        assert timeline.returncode == 0, timeline.stderr
        assert f"version {version} in force" in timeline.stdout
    finally:
        stack.stop()
