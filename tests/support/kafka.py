"""The real broker from a test: create a topic, count its partitions, read back everything in it (who owns which
partition: `handlers.kafka.topic_io.group_members`)."""

from __future__ import annotations

import asyncio
import json
from typing import Any

from aiokafka.admin import AIOKafkaAdminClient, NewTopic

from handlers.kafka import topic_io as kafka_io


async def create_topic(bootstrap: str, name: str, partitions: int) -> None:
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        await admin.create_topics([NewTopic(name, num_partitions=partitions, replication_factor=1)])
    finally:
        await admin.close()


async def partition_count(bootstrap: str, topic: str) -> int:
    """How many partitions the topic has (0 when it does not exist)."""
    try:
        return len(await kafka_io.topic_partitions(bootstrap, topic))
    except LookupError:
        return 0


async def read_topic(bootstrap: str, topic: str) -> list[tuple[str, dict[str, Any]]]:
    """Every record now in the topic, as (key, decoded value), read from the start of each partition."""
    records: list[tuple[str, dict[str, Any]]] = []
    async with asyncio.timeout(20):
        await kafka_io.read_topic(bootstrap, topic, lambda m: records.append((m.key.decode(), json.loads(m.value))))
    return records


async def read_all(bootstrap: str, topic: str) -> list[Any]:
    """Every record in `topic` (all partitions), as aiokafka's records; none when the topic does not exist."""
    records: list[Any] = []
    try:
        async with asyncio.timeout(60):
            await kafka_io.read_topic(bootstrap, topic, records.append)
    except LookupError:
        return []
    return records
