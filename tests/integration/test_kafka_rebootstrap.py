"""A Kafka client that knows only dead brokers asks the bootstrap servers again (handlers/kafka/rebootstrap.py).

The client's cluster layout is replaced by one broker that does not exist (what a client is left with when the
only brokers its last metadata listed have died); its next metadata update must still find the real broker.

`install` patches aiokafka for the whole process, by design (the worker and the ingress call it once at start).
Here each test gets its own aiokafka, patched or not, and the attributes are put back as they were after it, so
the other tests of the session run against aiokafka as they found it."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest
from aiokafka.client import AIOKafkaClient
from aiokafka.structs import BrokerMetadata

from handlers.kafka import rebootstrap as kafka_rebootstrap
from streams.kafka.local import free_port

GONE = 9999  # a node id no broker has


async def update_with_only_a_dead_broker_known(bootstrap: str) -> tuple[bool, set[int]]:
    client = AIOKafkaClient(bootstrap_servers=bootstrap, request_timeout_ms=2000)
    await client.bootstrap()
    try:
        client.cluster._brokers = {GONE: BrokerMetadata(GONE, "127.0.0.1", free_port(), None)}
        updated = await client._metadata_update(client.cluster, [])
        return updated, {broker.nodeId for broker in client.cluster.brokers()}
    finally:
        await client.close()


@pytest.fixture
def unpatched(monkeypatch: pytest.MonkeyPatch) -> Iterator[kafka_rebootstrap.MetadataUpdate]:
    """aiokafka's own `_metadata_update` for this test, whether or not the process installed the patch before;
    monkeypatch restores both attributes (the class's method and the module's `_original`) after the test,
    whatever `install` did to them meanwhile."""
    before = AIOKafkaClient._metadata_update
    original = kafka_rebootstrap._original or before
    monkeypatch.setattr(AIOKafkaClient, "_metadata_update", original)
    monkeypatch.setattr(kafka_rebootstrap, "_original", None)
    yield original
    monkeypatch.undo()
    assert AIOKafkaClient._metadata_update is before, "aiokafka left patched after the test"


def test_a_client_that_knows_only_dead_brokers_gets_the_layout_from_the_bootstrap_servers(
    kafka_bootstrap: str, unpatched: kafka_rebootstrap.MetadataUpdate
) -> None:
    kafka_rebootstrap.install()
    assert kafka_rebootstrap.installed() and AIOKafkaClient._metadata_update is not unpatched
    updated, brokers = asyncio.run(update_with_only_a_dead_broker_known(kafka_bootstrap))
    assert updated and GONE not in brokers and brokers  # the real broker again


def test_without_the_patch_the_client_stays_stuck(
    kafka_bootstrap: str, unpatched: kafka_rebootstrap.MetadataUpdate
) -> None:
    """What aiokafka does alone (aio-libs/aiokafka#459): the guard above is what makes the difference."""
    assert AIOKafkaClient._metadata_update is unpatched
    updated, brokers = asyncio.run(update_with_only_a_dead_broker_known(kafka_bootstrap))
    assert not updated and brokers == {GONE}
