"""`replay dlq` re-publishes dead-lettered records to their source topic exactly once."""

from __future__ import annotations

import asyncio

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition

from handlers.kafka.topics import ensure_topics
from streams.replay_cmd import replay_dlq


async def _records(bootstrap: str, topic: str) -> list[tuple[bytes | None, bytes | None]]:
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False)
    await consumer.start()
    try:
        tp = TopicPartition(topic, 0)
        consumer.assign([tp])
        await consumer.seek_to_beginning(tp)
        end = (await consumer.end_offsets([tp]))[tp]
        found: list[tuple[bytes | None, bytes | None]] = []
        async with asyncio.timeout(30):
            while await consumer.position(tp) < end:
                for records in (await consumer.getmany(tp, timeout_ms=500)).values():
                    found.extend((r.key, r.value) for r in records)
        return found
    finally:
        await consumer.stop()


async def test_dead_letters_go_back_to_their_source_topic_once(kafka_bootstrap: str, app_id: str) -> None:
    await ensure_topics(kafka_bootstrap, {f"{app_id}.dlq": 1, f"{app_id}.conversations": 1})
    producer = AIOKafkaProducer(bootstrap_servers=kafka_bootstrap, acks="all")
    await producer.start()
    try:
        headers = [
            ("error", b"conversation event: type: union_tag_invalid"),
            ("source_topic", f"{app_id}.conversations".encode()),
            ("source_partition", b"0"),
            ("source_offset", b"7"),
            ("attempts", b"1"),
        ]
        await producer.send_and_wait(f"{app_id}.dlq", value=b'{"fixed": true}', key=b"1:42", headers=headers)
        await producer.send_and_wait(f"{app_id}.dlq", value=b"x", key=b"1:43", headers=[("error", b"?")])
    finally:
        await producer.stop()

    assert await replay_dlq(kafka_bootstrap, app_id, dry_run=True) == (1, 1)
    assert await _records(kafka_bootstrap, f"{app_id}.conversations") == []

    assert await replay_dlq(kafka_bootstrap, app_id, dry_run=False) == (1, 1)
    assert await _records(kafka_bootstrap, f"{app_id}.conversations") == [(b"1:42", b'{"fixed": true}')]
    # A second run finds nothing new: progress was committed.
    assert await replay_dlq(kafka_bootstrap, app_id, dry_run=False) == (0, 0)
    assert len(await _records(kafka_bootstrap, f"{app_id}.conversations")) == 1
