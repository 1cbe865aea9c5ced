"""The real broker from a test: create a topic, count its partitions, read back everything in it."""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient, NewTopic


async def create_topic(bootstrap: str, name: str, partitions: int) -> None:
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        await admin.create_topics([NewTopic(name, num_partitions=partitions, replication_factor=1)])
    finally:
        await admin.close()


async def partition_count(bootstrap: str, topic: str) -> int:
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        (described,) = await admin.describe_topics([topic])
        return len(described["partitions"])
    finally:
        await admin.close()


async def read_topic(bootstrap: str, topic: str) -> list[tuple[str, dict[str, Any]]]:
    """Every record now in the topic, as (key, decoded value), read from the start of each partition."""
    partitions = [TopicPartition(topic, p) for p in range(await partition_count(bootstrap, topic))]
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False)
    await consumer.start()
    try:
        consumer.assign(partitions)
        await consumer.seek_to_beginning(*partitions)
        ends = await consumer.end_offsets(partitions)
        expected = sum(ends.values())
        records: list[tuple[str, dict[str, Any]]] = []
        deadline = time.monotonic() + 20
        while len(records) < expected and time.monotonic() < deadline:
            batch = await consumer.getmany(timeout_ms=500)
            for messages in batch.values():
                records += [(m.key.decode(), json.loads(m.value)) for m in messages]
        assert len(records) == expected
        return records
    finally:
        await consumer.stop()


async def read_all(bootstrap: str, topic: str) -> list[Any]:
    """Every record in `topic` (all partitions), in partition order, as aiokafka's records."""
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False)
    await consumer.start()
    try:
        partitions = [TopicPartition(topic, p) for p in range(await partition_count(bootstrap, topic))]
        consumer.assign(partitions)
        await consumer.seek_to_beginning(*partitions)
        ends = await consumer.end_offsets(partitions)
        records: list[Any] = []
        async with asyncio.timeout(60):
            while [tp for tp in partitions if await consumer.position(tp) < ends[tp]]:
                batch = await consumer.getmany(timeout_ms=500)
                for messages in batch.values():
                    records += messages
        return records
    finally:
        await consumer.stop()
