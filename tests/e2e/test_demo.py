"""`chatwoot-router demo` end to end: every bundled conversation ends the way its script expects.

The demo runs as a user would start it (a subprocess of the installed command), against the session's broker,
with its own sandbox, ingress and worker; the test reads the JSON report it writes. It runs twice: against the
kind sandbox and against the realistic one (issue 30), with the same outcomes.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from streams.kafka.local import free_port

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("mode", [[], ["--realistic"]], ids=["kind", "realistic"])
def test_demo_routes_every_bundled_conversation_as_expected(
    kafka_bootstrap: str, tmp_path: Path, mode: list[str]
) -> None:
    report = tmp_path / "report.json"
    ports = [str(free_port()) for _ in range(3)]
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "streams.cli",
            "demo",
            "--json",
            str(report),
            "--work-dir",
            str(tmp_path / "work"),
            "--sandbox-port",
            ports[0],
            "--ingress-port",
            ports[1],
            "--worker-port",
            ports[2],
            *mode,
        ],
        cwd=ROOT,
        env={**os.environ, "KAFKA_BOOTSTRAP_SERVERS": kafka_bootstrap},
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    rows = {row["id"]: row for row in json.loads(report.read_text())}

    assert len(rows) == 19
    assert rows["billing"]["result"] == "assigned" and rows["billing"]["assignee_id"] == 11
    assert rows["billing"]["labels"] == ["invoices"]
    assert rows["greeting-then-request"]["outcomes"][0] == "waited"
    assert rows["greeting-then-request"]["assignee_id"] == 11
    assert rows["spam"]["status"] == "resolved" and rows["praise"]["status"] == "snoozed"
    assert rows["startup-application"]["replies"] == 1
    assert rows["human-first"]["reason"] == "public_reply"
    assert rows["identifier-only"]["decision"] is None  # handed off without asking System One
    assert rows["chatwoot-flaky"]["outcomes"][:3] == ["retry", "retry", "retry"]
    assert rows["chatwoot-flaky"]["reason"] == "handoff_mode"
    # What Jev saw was redacted: no contact name, e-mail address, phone number or IP address.
    seen = rows["personal-data"]["input"]
    for secret in ("Alice", "Chen", "alice.chen@example.test", "415-555-0199", "10.1.2.3"):
        assert secret not in seen
    assert seen.startswith("Contact email domain: example.test\n")
    assert sum(row["replies"] for row in rows.values()) == 1  # one canned reply, sent exactly once
    for row in rows.values():
        assert not row["error"], row
    assert "as expected 19 of 19" in result.stdout
