"""A Kafka client that knows only dead brokers asks the bootstrap servers again (handlers/kafka/rebootstrap.py).

The client's cluster layout is replaced by one broker that does not exist (what a client is left with when the
only brokers its last metadata listed have died); its next metadata update must still find the real broker."""

from __future__ import annotations

import asyncio

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


def test_a_client_that_knows_only_dead_brokers_gets_the_layout_from_the_bootstrap_servers(
    kafka_bootstrap: str,
) -> None:
    kafka_rebootstrap.install()
    updated, brokers = asyncio.run(update_with_only_a_dead_broker_known(kafka_bootstrap))
    assert updated and GONE not in brokers and brokers  # the real broker again


def test_without_the_patch_the_client_stays_stuck(kafka_bootstrap: str) -> None:
    """What aiokafka does alone (aio-libs/aiokafka#459): the guard above is what makes the difference."""
    original = kafka_rebootstrap._original or AIOKafkaClient._metadata_update
    patched = AIOKafkaClient._metadata_update
    AIOKafkaClient._metadata_update = original
    try:
        updated, brokers = asyncio.run(update_with_only_a_dead_broker_known(kafka_bootstrap))
    finally:
        AIOKafkaClient._metadata_update = patched
    assert not updated and brokers == {GONE}
