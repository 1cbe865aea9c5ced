"""`chatwoot-router worker` as an operator runs it: refuses bad configuration, quarantines poison records in the
DLQ without stalling the partition, folds webhooks into effect commands, and serves /healthz and /metrics."""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition

from schemas.records import WebhookReceived
from streams.kafka.local import free_port
from tests.support.env import router_env

ROOT = Path(__file__).resolve().parents[2]
CONFIG = {
    # nothing listens here: effects fail fast, which is all these tests need
    "chatwoot": {"baseUrl": "http://127.0.0.1:9"},
    "routing": {"botIds": {"3": 30}, "accounts": {"3": {"sales": {"assignee": 8, "covers": "Quotes."}}}},
}


def environment(tmp_path: Path, bootstrap: str, app_id: str, config: dict[str, Any], **extra: str) -> dict[str, str]:
    path = tmp_path / "router.json"
    path.write_text(json.dumps(config))
    # no Chatwoot answers here (baseUrl port 9): the operator states its version, else the worker routes nothing
    # and its /healthz says so (handlers/worker/chatwoot_gate.py)
    defaults = {
        "ROUTER_DATA_DIR": str(tmp_path / "state"),
        "ROUTER_RETRY_BASE_MS": "100000",
        "ROUTER_CHATWOOT_VERSION": "4.18.0",
    }
    return router_env(path, bootstrap, app_id, **{**defaults, **extra})


def worker_command(port: int) -> list[str]:
    return [sys.executable, "-m", "streams.cli", "worker", "--web-port", str(port)]


@pytest.mark.parametrize(
    ("change", "key_path"),
    [
        ({"ROUTER_RETRY_BASE_MS": "soon"}, "ROUTER_RETRY_BASE_MS"),
        ({"ROUTER_SWEEP_INTERVAL_S": "-1"}, "ROUTER_SWEEP_INTERVAL_S"),
        ({"CHATWOOT_TOKEN": ""}, "CHATWOOT_TOKEN"),
    ],
)
def test_invalid_configuration_refuses_to_start(tmp_path: Path, change: dict[str, str], key_path: str) -> None:
    env = environment(tmp_path, "127.0.0.1:1", "unused", CONFIG, **change)
    result = subprocess.run(
        worker_command(free_port()), cwd=ROOT, env=env, capture_output=True, text=True, timeout=60, check=False
    )
    assert result.returncode == 2
    assert key_path in result.stderr


def test_invalid_routing_document_names_its_key_path(tmp_path: Path) -> None:
    bad = json.loads(json.dumps(CONFIG))
    bad["routing"]["minConfidence"] = 0.1
    env = environment(tmp_path, "127.0.0.1:1", "unused", bad)
    result = subprocess.run(
        worker_command(free_port()), cwd=ROOT, env=env, capture_output=True, text=True, timeout=60, check=False
    )
    assert result.returncode == 2
    assert "routing.minConfidence" in result.stderr


@pytest.fixture
def worker(tmp_path: Path, kafka_bootstrap: str, app_id: str) -> Iterator[tuple[int, subprocess.Popen[bytes]]]:
    port = free_port()
    log = (tmp_path / "worker.log").open("wb")
    process = subprocess.Popen(
        worker_command(port),
        cwd=ROOT,
        env=environment(tmp_path, kafka_bootstrap, app_id, CONFIG),
        stdout=log,
        stderr=log,
    )
    try:
        deadline = time.monotonic() + 120
        while True:
            assert process.poll() is None, (tmp_path / "worker.log").read_text()[-3000:]
            try:
                if httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline, "worker never became healthy"
            time.sleep(0.2)  # poll interval for the health check, bounded by the deadline
        yield port, process
    finally:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(60)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        log.close()


async def read_until(bootstrap: str, topic: str, key: bytes, deadline_s: float = 60) -> list[Any]:
    """Read `topic` from the beginning until a record with `key` arrived; returns those (fails at the deadline)."""
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False)
    await consumer.start()
    try:
        partitions = [TopicPartition(topic, p) for p in range(2)]
        consumer.assign(partitions)
        await consumer.seek_to_beginning(*partitions)
        records: list[Any] = []
        async with asyncio.timeout(deadline_s):
            while not records:
                batch = await consumer.getmany(timeout_ms=500)
                for messages in batch.values():
                    records += [m for m in messages if m.key == key]
        return records
    finally:
        await consumer.stop()


async def test_poison_record_goes_to_the_dlq_and_the_partition_moves_on(
    worker: tuple[int, subprocess.Popen[bytes]], kafka_bootstrap: str, app_id: str
) -> None:
    port, _ = worker
    webhook = WebhookReceived(account_id=3, conversation_id=12, event="message_created", at_ms=1_700_000_000_000)
    producer = AIOKafkaProducer(bootstrap_servers=kafka_bootstrap, acks="all")
    await producer.start()
    try:
        poison = await producer.send_and_wait(f"{app_id}.conversations", key=b"3:12", value=b"{not json")
        await producer.send_and_wait(f"{app_id}.conversations", key=b"3:12", value=webhook.model_dump_json().encode())
    finally:
        await producer.stop()

    [dead] = await read_until(kafka_bootstrap, f"{app_id}.dlq", b"3:12")
    assert dead.key == b"3:12" and dead.value == b"{not json"
    headers = {name: value.decode() for name, value in dead.headers}
    assert headers["source_topic"] == f"{app_id}.conversations"
    assert headers["source_partition"] == str(poison.partition)
    assert headers["source_offset"] == str(poison.offset)
    assert headers["attempts"] == "1"
    assert "conversation event" in headers["error"]

    # the webhook behind it on the same partition was folded: the run's first read was commanded
    [command] = await read_until(kafka_bootstrap, f"{app_id}.effects", b"3:12")
    assert command.key == b"3:12"
    assert json.loads(command.value)["params"]["op"] == "get_conversation"

    metrics = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=5).text
    assert 'router_dlq_records_total{topic="' + app_id + '.conversations"} 1.0' in metrics
    assert 'router_events_folded_total{topic="conversations",type="webhook_received"} 1.0' in metrics
