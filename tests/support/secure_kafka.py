"""A secured local Kafka for the tests that need authentication and ACLs (issue 31): the session fixture
`secure_kafka`, one SASL_SSL broker (`streams.kafka.local.start_broker(secure=True)`) with a user per role, each
holding its role's ACLs for the session's app id; its properties files are in `properties_dir`.

The session's plaintext broker (`kafka_bootstrap`) stays what every other test uses; a test with this fixture
marks itself `kafka` (it runs in that stage, beside the plaintext broker)."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from tests.support.processes import remember_child

if TYPE_CHECKING:  # the broker's modules load when the fixture runs: a unit run imports none of them
    from streams.kafka.local import LocalKafka


@dataclass(frozen=True)
class SecureKafka:
    """The running secured broker, the app id its role users have ACLs for, and their properties files."""

    broker: LocalKafka
    app_id: str
    properties_dir: Path

    @property
    def bootstrap(self) -> str:
        return self.broker.bootstrap

    def properties(self, role: str) -> Path:
        """`<role>.properties`: admin, ingress, worker or reader."""
        return self.properties_dir / f"{role}.properties"


@pytest.fixture(scope="session")
def secure_kafka(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SecureKafka]:
    """One secured broker for the session; its ACLs are for an app id of its own."""
    from streams.kafka.local import start_broker

    app_id = f"secure-{uuid.uuid4().hex[:8]}"
    broker = start_broker(data_dir=tmp_path_factory.mktemp("secure-kafka"), secure=True, app_id=app_id)
    remember_child(f"secured kafka broker {broker.bootstrap}", broker.stop, lambda: broker.process.poll() is None)
    try:
        assert broker.properties_dir is not None
        yield SecureKafka(broker, app_id, broker.properties_dir)
    finally:
        broker.stop()
