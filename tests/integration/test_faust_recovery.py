"""A Faust worker with a RocksDB table survives restarts: with local state kept, and with it wiped.

The worker runs as a real subprocess against the real broker; the table content must be exactly right after
each restart, including the last record written before the stop, and never counted twice.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from aiokafka import AIOKafkaProducer

from handlers.processes import Child
from streams.kafka.local import free_port
from tests.support.kafka import create_topic

ROOT = Path(__file__).resolve().parents[2]


class ProbeWorker(Child):
    """The probe app's Faust worker (`faust_probe_app.py`) as a child process, its log beside its data dir."""

    def __init__(self, bootstrap: str, app_id: str, data_dir: Path) -> None:
        self.bootstrap, self.app_id, self.data_dir = bootstrap, app_id, data_dir
        self.port = free_port()
        env = dict(
            os.environ,
            PROBE_BOOTSTRAP=self.bootstrap,
            PROBE_APP_ID=self.app_id,
            PROBE_DATA_DIR=str(self.data_dir),
            PROBE_WEB_PORT=str(self.port),
        )
        log_path = data_dir.parent / f"{app_id}.log"
        super().__init__(
            "probe worker",
            ["worker", "-l", "warn"],
            env,
            log_path,
            cwd=ROOT,
            append=True,
            new_session=False,
            module="tests.integration.faust_probe_app",
        )

    def get(self, path: str) -> Any:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.port}{path}", timeout=2) as response:
            return json.loads(response.read())

    def stop(self, sig: int = signal.SIGTERM, timeout_s: float = 60) -> None:
        super().stop(sig, timeout_s)


def wait_for_table(worker: ProbeWorker, expected: dict[str, Any], deadline_s: float = 90) -> None:
    """Poll the worker's table until it equals `expected`; fail at once if any key is over-counted."""
    deadline = time.monotonic() + deadline_s
    seen: Any = None
    while time.monotonic() < deadline:
        assert worker.alive(), "worker exited"
        try:
            if worker.get("/ready")["ready"]:
                seen = {k: {"count": v["count"], "last": v["last"]} for k, v in worker.get("/table").items()}
                for key, value in seen.items():
                    assert value["count"] <= expected.get(key, {"count": 0})["count"], f"{key} counted twice"
                if seen == expected:
                    return
        except OSError:
            pass
        time.sleep(0.2)  # polling interval between reads of the table, bounded by the deadline
    pytest.fail(f"table never became {expected!r}; last seen {seen!r}")


async def produce(bootstrap: str, topic: str, records: list[tuple[str, str]]) -> None:
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all", enable_idempotence=True)
    await producer.start()
    try:
        for key, value in records:
            await producer.send_and_wait(topic, value=value.encode(), key=key.encode())
    finally:
        await producer.stop()


def expected_for(records: list[tuple[str, str]]) -> dict[str, Any]:
    result: dict[str, Any] = {}
    for key, value in records:
        result[key] = {"count": result.get(key, {"count": 0})["count"] + 1, "last": value}
    return result


@pytest.fixture
def worker_factory(kafka_bootstrap: str, app_id: str, tmp_path: Path) -> Iterator[Any]:
    workers: list[ProbeWorker] = []

    def make() -> ProbeWorker:
        worker = ProbeWorker(kafka_bootstrap, app_id, tmp_path / "state")
        workers.append(worker)
        worker.start()
        return worker

    yield make
    for worker in workers:
        worker.stop()


@pytest.mark.parametrize("wipe_local_state", [False, True], ids=["state-kept", "state-wiped"])
async def test_table_survives_worker_restart(
    kafka_bootstrap: str, app_id: str, worker_factory: Any, wipe_local_state: bool
) -> None:
    topic = f"{app_id}.events"
    await create_topic(kafka_bootstrap, topic, partitions=4)
    first = [(f"1:{n % 9}", f"v{n}") for n in range(60)]
    worker = worker_factory()
    await asyncio.to_thread(wait_for_table, worker, {})  # topics exist and the worker is ready
    await produce(kafka_bootstrap, topic, first)
    await asyncio.to_thread(wait_for_table, worker, expected_for(first))
    # The last record before the stop is a new key and a new value for an old key.
    last = [("1:last", "final"), ("1:0", "v-final")]
    await produce(kafka_bootstrap, topic, last)
    await asyncio.to_thread(wait_for_table, worker, expected_for(first + last))
    worker.stop()

    if wipe_local_state:
        shutil.rmtree(worker.data_dir)
    restarted = worker_factory()
    await asyncio.to_thread(wait_for_table, restarted, expected_for(first + last))

    more = [("1:1", "after-restart")]
    await produce(kafka_bootstrap, topic, more)
    await asyncio.to_thread(wait_for_table, restarted, expected_for(first + last + more))
