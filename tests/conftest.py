"""Shared fixtures: one real Kafka broker per test session, and a unique app id per test.

The broker is `KAFKA_BOOTSTRAP_SERVERS` when set, else testcontainers' Kafka when a Docker engine answers, else
a local Apache Kafka 4.x started by `streams.kafka.local` (DESIGN §10). Each test isolates itself by app id,
which prefixes its topics and names its consumer group. Every test gets the marker of its directory (unit,
integration, e2e), and `kafka` when it uses the broker; the suite runs in stages (STAGES, docs/testing.md). The
helpers the tests share are in `tests/support/`.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.env import router_env
from tests.support.processes import remember_child, stop_every_child
from tests.support.secure_kafka import secure_kafka

__all__ = ["router_env", "secure_kafka"]  # router_env: moved to tests/support/env.py; secure_kafka: a fixture

TESTS = Path(__file__).resolve().parent
DIRECTORY_MARKERS = ("unit", "integration", "e2e")  # tests/<name>/ gets the marker <name> (pyproject.toml)
STAGES = ("unit", "no broker", "kafka", "e2e", "cluster")
"""The order the suite runs in, fastest feedback first (docs/testing.md): `.ci/run` runs each stage on its own,
and a plain `pytest` runs everything in this order too."""


def stage_of(item: pytest.Item) -> str:
    """The stage a test belongs to, by its markers."""
    names = {marker.name for marker in item.iter_markers()}
    if "cluster" in names:
        return "cluster"
    if "e2e" in names:
        return "e2e"
    if "kafka" in names:
        return "kafka"
    return "unit" if "unit" in names else "no broker"


@pytest.hookimpl(tryfirst=True)  # before `-m` deselects by these markers
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark every test by the directory it lives in (so `-m "not e2e"` and the like need nothing in the files),
    mark `kafka` every test that uses the session's broker, and run the stages in order: unit first."""
    for item in items:
        path = item.path.resolve()
        if path.is_relative_to(TESTS) and path.relative_to(TESTS).parts[0] in DIRECTORY_MARKERS:
            item.add_marker(path.relative_to(TESTS).parts[0])
        if "kafka_bootstrap" in getattr(item, "fixturenames", ()):
            item.add_marker("kafka")
    items.sort(key=lambda item: STAGES.index(stage_of(item)))  # stable: file order within a stage


def pytest_configure(config: pytest.Config) -> None:
    """A CI timeout or `kill` (SIGTERM) ends the run like Ctrl-C does, so every fixture's teardown still stops the
    brokers and processes it started (they run in sessions of their own and would outlive a killed pytest)."""

    def interrupt(signum: int, frame: object) -> None:
        raise KeyboardInterrupt(f"signal {signum}")

    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, interrupt)


@pytest.hookimpl(trylast=True)  # after the fixtures' own teardown (runner.py's pytest_sessionfinish)
def pytest_sessionfinish(session: pytest.Session) -> None:
    """Whatever a test left running (an interrupted test, a fixture whose teardown failed) is stopped here."""
    left = stop_every_child()
    if left:
        print(f"\nstopped {len(left)} process(es) a test left running: {', '.join(left)}", file=sys.stderr)


def _docker_answers() -> bool:
    if not os.environ.get("DOCKER_HOST") and not os.path.exists("/var/run/docker.sock"):
        return False
    import docker  # testcontainers depends on it

    try:
        client = docker.from_env(timeout=3)
    except Exception:
        return False
    try:
        return bool(client.ping())
    except Exception:
        return False
    finally:
        client.close()


@pytest.fixture(scope="session")
def kafka_bootstrap(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """Bootstrap address of a real Kafka broker shared by the whole session."""
    configured = os.environ.get("KAFKA_BOOTSTRAP_SERVERS")
    if configured:
        yield configured
        return
    if _docker_answers():
        from testcontainers.kafka import KafkaContainer

        with KafkaContainer("apache/kafka:4.1.1").with_kraft() as container:
            yield container.get_bootstrap_server()
        return
    from streams.kafka.local import running_broker

    with running_broker(data_dir=tmp_path_factory.mktemp("kafka")) as broker:
        remember_child(f"kafka broker {broker.bootstrap}", broker.stop, lambda: broker.process.poll() is None)
        yield broker.bootstrap


@pytest.fixture
def app_id(request: pytest.FixtureRequest) -> str:
    """A unique app id (topic prefix and consumer group) for one test."""
    name = request.node.name.replace("[", "-").replace("]", "").replace("_", "-")[:40]
    return f"t-{name}-{uuid.uuid4().hex[:8]}"
