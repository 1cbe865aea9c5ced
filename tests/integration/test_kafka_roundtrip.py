"""The local broker behaves like Kafka: idempotent acks=all produce, exact records back, exact end offsets."""

from __future__ import annotations

import asyncio

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition

from tests.support.kafka import create_topic


async def test_idempotent_produce_then_consume_exact_records_and_end_offsets(kafka_bootstrap: str, app_id: str) -> None:
    topic = f"{app_id}.roundtrip"
    await create_topic(kafka_bootstrap, topic, partitions=3)
    sent = [(f"1:{n % 7}".encode(), f"value-{n}".encode()) for n in range(354)]

    producer = AIOKafkaProducer(bootstrap_servers=kafka_bootstrap, acks="all", enable_idempotence=True)
    await producer.start()
    try:
        metadata = await asyncio.gather(*[await producer.send(topic, value=v, key=k) for k, v in sent])
    finally:
        await producer.stop()
    produced_per_partition: dict[int, int] = {}
    for record in metadata:
        produced_per_partition[record.partition] = produced_per_partition.get(record.partition, 0) + 1

    consumer = AIOKafkaConsumer(
        topic, bootstrap_servers=kafka_bootstrap, auto_offset_reset="earliest", enable_auto_commit=False
    )
    await consumer.start()
    received: list[tuple[bytes | None, bytes | None, int]] = []
    try:
        async with asyncio.timeout(60):
            while len(received) < len(sent):
                batch = await consumer.getmany(timeout_ms=1000)
                for records in batch.values():
                    received.extend((r.key, r.value, r.partition) for r in records)
        partitions = [TopicPartition(topic, p) for p in range(3)]
        end_offsets = await consumer.end_offsets(partitions)
    finally:
        await consumer.stop()

    assert sorted((k, v) for k, v, _ in received) == sorted(sent)
    # One key always lands on one partition, and order within a key is kept.
    for key in {k for k, _ in sent}:
        values = [v for k, v, _ in received if k == key]
        assert values == [v for k, v in sent if k == key]
        assert len({p for k, _, p in received if k == key}) == 1
    assert {tp.partition: off for tp, off in end_offsets.items()} == {
        p: produced_per_partition.get(p, 0) for p in range(3)
    }
