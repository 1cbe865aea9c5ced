"""`replay state --to-app` carries the data keys and seals an older log on the way (issue 32 item 4).

Checked from outside: `<new>.keys` read raw holds the old app's wrapped keys as they were and, for a forgotten
conversation, its fence only; `audit` of the new app opens a kept conversation's text with the KEK and shows the
forgotten one erased. A log written before sealing (the recorded demo histories, written straight onto an old app's
topic) is refused without a KEK, and with one comes out with no text or domain in any record of any topic of the
new app, while `audit` with the KEK still shows the text and `audit --verify` finds 0 differences.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import uuid
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest
from aiokafka import AIOKafkaProducer

from handlers.kafka.config_store import apply
from handlers.kafka.topics import ensure_app_topics
from projections.topic_settings import app_topics
from schemas.configs import ConfigDocument, FoldSettings
from schemas.keys import partition_for
from tests.golden.histories import ROOT as GOLDEN
from tests.golden.histories import settings_of
from tests.support.env import TEST_KEK, outside_env
from tests.support.kafka import read_all
from tests.support.processes import run_cli
from tests.support.stack import SALES, Stack

DEMO = GOLDEN / "demo"
PARTITIONS = 2


def cli(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return run_cli(env, *args, timeout_s=240)


def key_records(bootstrap: str, app: str) -> dict[str, list[dict[str, Any]]]:
    """Every record of `<app>.keys`, by conversation, in offset order (compaction may not have run)."""
    found: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for record in asyncio.run(read_all(bootstrap, f"{app}.keys")):
        value = json.loads(record.value)
        found[value["key"]].append(value)
    return found


def routed(stack: Stack, text: str) -> int:
    conversation = stack.new_conversation()
    stack.customer_says(1, conversation, text)
    stack.wait_conversation(1, conversation, "assigned to sales", lambda c: c["assignee_id"] == SALES, 90)
    stack.log.wait_settled(1, conversation, "its turn to end")
    return conversation


@pytest.mark.timeout(600)
def test_the_copy_carries_the_wrapped_keys_and_a_forgotten_conversations_fence_only(e2e: Stack, tmp_path: Path) -> None:
    old_app, bootstrap = e2e.env["ROUTER_APP_ID"], e2e.env["KAFKA_BOOTSTRAP_SERVERS"]
    new_app = f"{old_app}-keys{uuid.uuid4().hex[:4]}"
    new_env = {**e2e.env, "ROUTER_APP_ID": new_app}
    marker, other = f"okapi{uuid.uuid4().hex[:6]}", f"tapir{uuid.uuid4().hex[:6]}"
    kept = f"1:{routed(e2e, f'I need a quote for your pricing plans {marker}')}"
    gone = f"1:{routed(e2e, f'I need a quote for your pricing plans {other}')}"
    forgot = e2e.run_cli("forget", "--conversation", gone, "--reason", "the customer asked")
    assert forgot.returncode == 0, forgot.stderr

    replayed = e2e.run_cli("replay", "state", "--to-app", new_app, timeout_s=240)
    assert replayed.returncode == 0, replayed.stderr
    assert f"rebuilt {old_app} into {new_app}" in replayed.stdout and "data keys written" in replayed.stdout

    old_keys, new_keys = key_records(bootstrap, old_app), key_records(bootstrap, new_app)
    assert new_keys[kept][-1] == old_keys[kept][-1] and new_keys[kept][-1]["type"] == "data_key"  # as it was
    assert [r["type"] for r in new_keys[gone]] == ["erased"]  # the fence only: its key never reached the new app
    assert all("wrapped" not in r for r in new_keys[gone])
    assert {k for k, rs in old_keys.items() if rs[-1]["type"] == "data_key"} <= {
        k for k, rs in new_keys.items() if rs[-1]["type"] == "data_key"
    }

    shown = cli(new_env, "audit", "--conversation", kept, "--html", str(tmp_path / "kept.html"))
    assert shown.returncode == 0, shown.stderr
    assert marker in (tmp_path / "kept.html").read_text()  # opened with the KEK from the new app's keys
    erased = cli(new_env, "audit", "--conversation", gone, "--html", str(tmp_path / "gone.html"))
    assert erased.returncode == 0, erased.stderr
    page = (tmp_path / "gone.html").read_text()
    assert other not in page and "erased" in page and "forgotten" in erased.stdout

    again = e2e.run_cli("replay", "state", "--to-app", new_app, timeout_s=240)
    assert again.returncode == 0, again.stderr
    twice = key_records(bootstrap, new_app)
    for conversation, records in twice.items():  # a resumed copy never makes or copies a second key
        assert len({r["wrapped"] for r in records if r["type"] == "data_key"}) <= 1, conversation
    verified = cli(new_env, "audit", "--verify")
    assert verified.returncode == 0 and " 0 differences" in verified.stdout, verified.stdout + verified.stderr


# --- a log written before sealing -----------------------------------------------------------------------------


def demo_records() -> list[tuple[str, bytes]]:
    """(key, value) of every recorded demo history, written by a release before sealing."""
    found = []
    for path in sorted(DEMO.glob("*.events.jsonl")):
        account, conversation = path.name.removesuffix(".events.jsonl").split("-")
        for line in path.read_text().splitlines():
            record = json.loads(line)["record"]
            found.append((f"{account}:{conversation}", json.dumps(record, separators=(",", ":")).encode()))
    return found


def plaintexts(records: list[tuple[str, bytes]]) -> set[str]:
    """The customer texts (their first 24 characters, past any redaction token) and e-mail domains in clear."""
    found: set[str] = set()

    def visit(node: Any) -> None:
        if isinstance(node, dict):
            for name, value in node.items():
                if name in ("text", "email_domain") and isinstance(value, str):
                    fragment = value.split("]")[-1].strip()[:24] if name == "text" else value
                    if len(fragment) >= 8:
                        found.add(fragment)
                else:
                    visit(value)
        elif isinstance(node, list):
            for value in node:
                visit(value)

    for _, value in records:
        visit(json.loads(value))
    return found


async def write_old_log(bootstrap: str, app_id: str, records: list[tuple[str, bytes]]) -> None:
    """The demo's configuration applied, then its recorded records, as an older release left them."""
    config, retry_base_ms = settings_of(DEMO)
    await ensure_app_topics(bootstrap, app_id, PARTITIONS)
    await apply(bootstrap, app_id, ConfigDocument.of(config, FoldSettings(retry_base_ms=retry_base_ms)))
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all")
    await producer.start()
    try:
        for key, value in records:
            partition = partition_for(key, PARTITIONS)
            await producer.send(f"{app_id}.conversations", key=key.encode(), value=value, partition=partition)
        await producer.flush()
    finally:
        await producer.stop()


def found_in(bootstrap: str, app_id: str, needles: set[str]) -> dict[str, int]:
    """How often each needle (as is, and as JSON escapes it) occurs in the bytes of every record of every topic of
    the app: keys, values and headers."""
    forms = {
        n: {n.encode(), json.dumps(n)[1:-1].encode(), json.dumps(n, ensure_ascii=False)[1:-1].encode()} for n in needles
    }
    counts: dict[str, int] = defaultdict(int)
    for topic in app_topics(app_id):
        for record in asyncio.run(read_all(bootstrap, topic)):
            blob = b"\0".join(
                [record.key or b"", record.value or b"", *(name.encode() + value for name, value in record.headers)]
            )
            for needle, encodings in forms.items():
                counts[needle] += sum(blob.count(form) for form in encodings)
    return {needle: count for needle, count in counts.items() if count}


@pytest.mark.timeout(600)
def test_a_log_written_before_sealing_is_sealed_by_the_copy(kafka_bootstrap: str, app_id: str, tmp_path: Path) -> None:
    records = demo_records()
    secrets = plaintexts(records)
    assert "lopez-consulting.test" in secrets and len(secrets) > 10
    asyncio.run(write_old_log(kafka_bootstrap, app_id, records))
    new_app = f"{app_id}-sealed"
    old_env = {**outside_env(), "KAFKA_BOOTSTRAP_SERVERS": kafka_bootstrap, "ROUTER_APP_ID": app_id}
    new_env = {**old_env, "ROUTER_APP_ID": new_app, "ROUTER_KEY_ENCRYPTION_KEY": TEST_KEK}

    refused = cli(old_env, "replay", "state", "--to-app", new_app)
    assert refused.returncode == 1, refused.stdout + refused.stderr
    said = [line for line in refused.stderr.splitlines() if "waiting up to" not in line]  # a fresh broker's wait
    assert len(said) == 1 and "ROUTER_KEY_ENCRYPTION_KEY" in said[0], refused.stderr
    assert found_in(kafka_bootstrap, new_app, secrets) == {}  # stopped before the first field in clear

    sealed = cli({**old_env, "ROUTER_KEY_ENCRYPTION_KEY": TEST_KEK}, "replay", "state", "--to-app", new_app)
    assert sealed.returncode == 0, sealed.stderr
    assert found_in(kafka_bootstrap, app_id, secrets)  # the old app's log holds them (the scan finds them)
    assert found_in(kafka_bootstrap, new_app, secrets) == {}  # not one record of the new app does
    keys = key_records(kafka_bootstrap, new_app)
    assert keys and all(rs[-1]["type"] == "data_key" for rs in keys.values())

    shown = cli(new_env, "audit", "--conversation", "1:1", "--html", str(tmp_path / "1-1.html"))
    assert shown.returncode == 0, shown.stderr
    page = (tmp_path / "1-1.html").read_text()
    assert "lopez-consulting.test" in page and "charged twice" in page  # the KEK opens what the copy sealed
    withheld = cli(
        {**new_env, "ROUTER_KEY_ENCRYPTION_KEY": ""},
        "audit",
        "--conversation",
        "1:1",
        "--html",
        str(tmp_path / "w.html"),
    )
    assert withheld.returncode == 0 and "charged twice" not in (tmp_path / "w.html").read_text()
    verified = cli(new_env, "audit", "--verify")
    assert verified.returncode == 0 and " 0 differences" in verified.stdout, verified.stdout + verified.stderr
