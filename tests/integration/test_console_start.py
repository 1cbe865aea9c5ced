"""The console answers from its first moment, at any history length and whether workers ran or not (issue 32
item 4): `chatwoot-router console` listens before it reads anything from Kafka, and its API says what it has folded
so far and that it is catching up while a backlog is still being read; with no configuration version applied yet
it answers and says what it waits for.

Only what the answers say is asserted; the deadlines only catch a console that never gets there. The time to the
first answer is measured by `bench/scale_bench.py --only console-start` (docs/benchmarks.md).
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from aiokafka import AIOKafkaProducer

from handlers.kafka.config_store import apply
from handlers.kafka.topics import ensure_app_topics
from schemas.configs import ConfigDocument, FoldSettings
from schemas.keys import partition_for
from streams.kafka.local import free_port
from tests.golden.histories import interleaved, settings_of
from tests.support.env import outside_env
from tests.support.processes import ROOT, Process
from tests.support.waiting import wait_until

DEMO = ROOT / "tests" / "golden" / "demo"
PARTITIONS = 2
BACKLOG = 150_000  # records: a first start folds them one partition per process, for seconds on any machine


async def write_backlog(bootstrap: str, app_id: str, wanted: int) -> tuple[int, int, str]:
    """At least `wanted` records of renamed demo histories (`interleaved`), after `config apply` of the demo's
    configuration; no worker runs. Returns (records, conversations, newest key)."""
    config, retry_base_ms = settings_of(DEMO)
    await ensure_app_topics(bootstrap, app_id, PARTITIONS)
    await apply(bootstrap, app_id, ConfigDocument.of(config, FoldSettings(retry_base_ms=retry_base_ms)))
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all", linger_ms=20, max_batch_size=512 * 1024)
    await producer.start()
    written, keys = 0, dict[str, None]()  # the conversations in the order they started
    try:
        for key, record in interleaved(wanted):
            topic, partition = f"{app_id}.conversations", partition_for(key, PARTITIONS)
            await producer.send(topic, key=key.encode(), value=record.encode(), partition=partition)
            written += 1
            keys.setdefault(key)
        await producer.flush()
    finally:
        await producer.stop()
    return written, len(keys), list(keys)[-1]


@pytest.fixture
def start_console(kafka_bootstrap: str, app_id: str, tmp_path: Path) -> Iterator[Any]:
    """Start `chatwoot-router console` on the test's app (no configuration file: the applied versions only) and
    return its URL once it says it listens."""
    started: list[Process] = []

    def start() -> str:
        port = free_port()
        env = {**outside_env(), "KAFKA_BOOTSTRAP_SERVERS": kafka_bootstrap, "ROUTER_APP_ID": app_id}
        env["ROUTER_DATA_DIR"] = str(tmp_path / "data")
        process = Process(f"console-{port}", ["console", "--port", str(port)], env, tmp_path)
        process.start()
        started.append(process)

        def listening() -> bool:
            assert process.alive(), f"console exited:\n{process.log_tail()}"
            return "ready url=" in process.log_path.read_text(errors="replace")

        wait_until("the console to listen", listening, 60, every_s=0.02)
        return f"http://127.0.0.1:{port}"

    yield start
    for process in started:
        process.stop()


def test_the_console_answers_while_it_reads_a_backlog(kafka_bootstrap: str, app_id: str, start_console: Any) -> None:
    records, conversations, newest = asyncio.run(write_backlog(kafka_bootstrap, app_id, BACKLOG))
    url = start_console()
    with httpx.Client(timeout=30) as http:
        first = http.get(f"{url}/api/overview")
        assert first.status_code == 200
        answer = first.json()
        # what it has so far, and that it is still catching up: the backlog is not folded yet
        assert answer["catching_up"] is True and answer["progress"]["catching_up"] is True
        assert answer["data"]["records"] < records and answer["progress"]["records"] < records
        assert answer["progress"]["step"] and answer["fragments"]["live"].startswith("catching up")

        page = http.get(f"{url}/api/conversations/{newest}")  # read from the log meanwhile: at once, or "reading"
        assert page.status_code in (200, 202), page.text
        assert page.json()["reading"] is (page.status_code == 202)

        def caught_up() -> dict[str, Any] | None:
            answer = http.get(f"{url}/api/overview").json()
            return answer if not answer["catching_up"] else None

        done = wait_until("the console to catch up with the backlog", caught_up, 300, every_s=0.5)
        progress = done["progress"]
        assert progress["step"] is None and progress["behind"] == 0 and progress["error"] is None
        assert done["data"]["records"] == records and done["data"]["conversations"] == conversations
        assert done["fragments"]["live"].startswith("live")

        def timeline() -> dict[str, Any] | None:
            page = http.get(f"{url}/api/conversations/{newest}")
            return page.json() if page.status_code == 200 else None

        shown = wait_until("the newest conversation's timeline", timeline, 60, every_s=0.5)
        assert shown["reading"] is False and shown["catching_up"] is False and shown["calls"] > 0


def test_the_console_answers_before_any_configuration_was_applied(
    kafka_bootstrap: str, app_id: str, start_console: Any
) -> None:
    asyncio.run(ensure_app_topics(kafka_bootstrap, app_id, PARTITIONS))
    url = start_console()
    with httpx.Client(timeout=30) as http:

        def waiting() -> dict[str, Any] | None:
            answer = http.get(f"{url}/api/overview").json()
            return answer if answer["progress"]["error"] else None

        answer = wait_until("the console to say what it waits for", waiting, 60, every_s=0.1)
        assert answer["catching_up"] is True and answer["data"]["conversations"] == 0
        assert f"no configuration version was applied on {app_id}.configs yet" in answer["progress"]["error"]
        assert "waiting" in answer["fragments"]["live"]
        assert http.get(f"{url}/").status_code == 200

        records, conversations, _ = asyncio.run(write_backlog(kafka_bootstrap, app_id, 200))

        def counted() -> dict[str, Any] | None:
            answer = http.get(f"{url}/api/overview").json()
            return answer if not answer["catching_up"] and answer["data"]["records"] == records else None

        done = wait_until("the console to fold the log once a version was applied", counted, 120, every_s=0.5)
        assert done["data"]["conversations"] == conversations and done["progress"]["error"] is None
