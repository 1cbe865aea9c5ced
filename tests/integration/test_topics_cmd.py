"""Topics that say what they need (issue 26 item 1) and `config apply` as the first step (issue 25 item 5), on the
real broker: `chatwoot-router topics` names what a stock-created topic set lacks, `topics --fix` sets it in place
without touching anything else, the start-up check logs one line per finding, and `config apply` on an app id
with no topic at all creates them with the settings a worker would.
"""

from __future__ import annotations

import asyncio
import json
import logging
import subprocess
import sys
from pathlib import Path

import pytest
from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.admin.config_resource import ConfigResource, ConfigResourceType

from handlers.kafka.topics import log_topic_findings
from projections.topic_settings import DLQ_RETENTION_MS, Kind, app_topics
from tests.support.env import router_env
from tests.support.waiting import within

ROOT = Path(__file__).resolve().parents[2]
WEEK_MS = str(7 * 86_400_000)
CONFIG = {
    "chatwoot": {"baseUrl": "http://127.0.0.1:9"},
    "routing": {"botIds": {"3": 30}, "accounts": {"3": {"sales": {"assignee": 8, "covers": "Quotes."}}}},
}


def cli(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "streams.cli", *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120
    )


@pytest.fixture
def env(tmp_path: Path, kafka_bootstrap: str, app_id: str) -> dict[str, str]:
    config = tmp_path / "router.json"
    config.write_text(json.dumps(CONFIG))
    return router_env(config, kafka_bootstrap, app_id)


async def create_stock(bootstrap: str, app_id: str, **extra: dict[str, str]) -> None:
    """The app's topics as a stock broker makes them from a partition count alone: retention 7 days, min ISR
    and cleanup policy the broker's defaults (changelogs compacted, as Faust asks), plus `extra` per kind."""
    topics = []
    for name, kind in app_topics(app_id).items():
        configs = {"retention.ms": WEEK_MS, "segment.bytes": "10485760"}  # segment.bytes: an operator's own
        if kind is Kind.CHANGELOG:
            configs["cleanup.policy"] = "compact"
        configs.update(extra.get(kind.value, {}))
        topics.append(NewTopic(name, 1 if kind is Kind.CONFIGS else 2, 1, topic_configs=configs))
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        await admin.create_topics(topics)
    finally:
        await admin.close()


async def metadata_visible(bootstrap: str, names: list[str], deadline_s: float = 30) -> None:
    """Until the broker's metadata lists every topic of `names` with a leader for each of its partitions, which the
    commands under test read first (a topic just created reaches the metadata a moment after the create answers)."""
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        async with within(deadline_s, f"the metadata of {names} with a leader for every partition"):
            while True:
                topics = {t["topic"]: t for t in await admin.describe_topics(names)}
                if all(
                    name in topics
                    and topics[name]["error_code"] == 0
                    and topics[name]["partitions"]
                    and all(p["leader"] >= 0 for p in topics[name]["partitions"])
                    for name in names
                ):
                    return
                await asyncio.sleep(0.05)  # polling interval, bounded by the deadline
    finally:
        await admin.close()


async def described(bootstrap: str, names: list[str]) -> dict[str, dict[str, str]]:
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        responses = await admin.describe_configs([ConfigResource(ConfigResourceType.TOPIC, n) for n in names])
    finally:
        await admin.close()
    return {
        resource["resource_name"]: {e["config_names"]: e["config_value"] for e in resource["config_entries"]}
        for response in responses
        for resource in response.to_object()["resources"]
    }


async def test_topics_names_the_stock_settings_and_fix_sets_them_in_place(
    kafka_bootstrap: str, app_id: str, env: dict[str, str]
) -> None:
    await create_stock(
        kafka_bootstrap,
        app_id,
        configs={"cleanup.policy": "delete"},
        dlq={"unclean.leader.election.enable": "true"},
    )
    await metadata_visible(kafka_bootstrap, list(app_topics(app_id)))

    listed = await asyncio.to_thread(cli, env, "topics")
    assert listed.returncode == 1, listed.stdout + listed.stderr
    out = listed.stdout
    print(out)
    assert f"{app_id}.conversations  partitions=2 replication=1" in out
    assert f"wrong: retention.ms={WEEK_MS} (7 days): the event log loses its head" in out
    assert "fix: set retention.ms=-1 (`chatwoot-router topics --fix`)" in out
    for expected in (
        "wrong: cleanup.policy=delete",  # configs not compacted
        f"wrong: retention.ms={WEEK_MS} (7 days): dead letters",  # dlq shorter than 30 days
        "wrong: unclean.leader.election.enable=true",
    ):
        assert expected in out, expected
    assert "missing" not in out and "partitions=" in out
    assert "run `chatwoot-router topics --fix`" in out.splitlines()[-1]

    fixed = await asyncio.to_thread(cli, env, "topics", "--fix")
    print(fixed.stdout)
    assert fixed.returncode == 0, fixed.stdout + fixed.stderr
    assert f"fixed {app_id}.conversations retention.ms: {WEEK_MS} (7 days) -> -1" in fixed.stdout
    assert fixed.stdout.splitlines()[-1] == "nothing to fix"

    names = {kind.value: name for name, kind in app_topics(app_id).items()}
    after = await described(kafka_bootstrap, list(app_topics(app_id)))
    assert after[names["conversations"]]["retention.ms"] == "-1"
    assert after[names["sweeps"]]["retention.ms"] == "-1"
    assert after[names["dlq"]]["retention.ms"] == str(DLQ_RETENTION_MS)
    assert after[names["dlq"]]["unclean.leader.election.enable"] == "false"
    assert after[names["configs"]]["cleanup.policy"] == "compact"
    assert after[names["effects"]]["retention.ms"] == WEEK_MS  # already the router's choice: untouched
    assert all(configs["segment.bytes"] == "10485760" for configs in after.values())  # incremental: kept

    again = await asyncio.to_thread(cli, env, "topics")
    assert again.returncode == 0, again.stdout + again.stderr
    assert again.stdout.splitlines()[-1] == "nothing to fix"


async def test_a_partition_count_is_reported_never_changed(
    kafka_bootstrap: str, app_id: str, env: dict[str, str]
) -> None:
    admin = AIOKafkaAdminClient(bootstrap_servers=kafka_bootstrap)
    await admin.start()
    try:
        await admin.create_topics([NewTopic(f"{app_id}.conversations", 2, 1), NewTopic(f"{app_id}.effects", 3, 1)])
    finally:
        await admin.close()
    await metadata_visible(kafka_bootstrap, [f"{app_id}.conversations", f"{app_id}.effects"])
    result = await asyncio.to_thread(cli, env, "topics", "--fix")
    assert result.returncode == 1, result.stdout + result.stderr
    assert f"still to fix: {app_id}.effects wrong: partitions=3: co-partitioned with {app_id}.conversations" in (
        result.stdout
    )
    assert f"{app_id}.effects  partitions=3" in result.stdout
    assert "1 setting(s) to fix, 0 of them in place" in result.stdout.splitlines()[-1]


async def test_the_start_check_logs_one_line_per_finding(
    kafka_bootstrap: str, app_id: str, caplog: pytest.LogCaptureFixture
) -> None:
    await create_stock(kafka_bootstrap, app_id)
    await metadata_visible(kafka_bootstrap, list(app_topics(app_id)))
    with caplog.at_level(logging.WARNING, logger="chatwoot_router.topics"):
        findings = await log_topic_findings(kafka_bootstrap, app_id)
    lines = [r for r in caplog.records if r.name == "chatwoot_router.topics"]
    assert len(lines) == len(findings) > 0
    log_line = next(r for r in lines if r.topic == f"{app_id}.conversations" and r.setting == "retention.ms")
    assert log_line.getMessage() == "topic setting needs a fix"
    assert (log_line.value, log_line.wanted) == (f"{WEEK_MS} (7 days)", "-1")
    assert "topics --fix" in log_line.fix and log_line.exc_info is None


async def test_the_start_check_without_a_broker_is_one_line_and_no_exception(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with caplog.at_level(logging.WARNING, logger="chatwoot_router.topics"):
        assert await log_topic_findings("127.0.0.1:1", "nobody", timeout_s=5) == []
    [line] = [r for r in caplog.records if r.name == "chatwoot_router.topics"]
    assert line.getMessage() == "topic settings not checked" and line.exc_info is None


async def test_config_apply_is_the_first_step_on_an_app_without_topics(
    kafka_bootstrap: str, app_id: str, env: dict[str, str], tmp_path: Path
) -> None:
    path = tmp_path / "apply.json"
    path.write_text(json.dumps(CONFIG))
    applied = await asyncio.to_thread(cli, env, "config", "apply", str(path))
    assert applied.returncode == 0, applied.stderr
    assert "partitions marked" in applied.stdout
    assert applied.stdout.strip().endswith("4 partitions marked")  # ROUTER_PARTITIONS=2: conversations, sweeps
    names = {kind.value: name for name, kind in app_topics(app_id).items()}
    settings = await described(kafka_bootstrap, list(app_topics(app_id)))
    assert set(settings) == set(app_topics(app_id))  # every topic a worker would create, changelogs too
    assert settings[names["conversations"]]["retention.ms"] == "-1"
    assert settings[names["configs"]]["cleanup.policy"] == "compact"
    checked = await asyncio.to_thread(cli, env, "topics")
    assert checked.returncode == 0, checked.stdout
    again = await asyncio.to_thread(cli, env, "config", "apply", str(path))
    assert again.returncode == 0 and "already in force" in again.stdout
