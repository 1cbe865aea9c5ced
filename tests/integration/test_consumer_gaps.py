"""No record skipped (DESIGN §6, docs/consumer-gaps.md): the library fact we work around, and the workaround.

aiokafka's `seek_to_committed` leaves the fetch position where it is for a partition that has no committed
offset; Faust relies on it to rewind after dropping records it fetched while its flow was paused, so such
records were never handed to an agent. The worker therefore checks each record's offset against the one it
expects and reads a gap itself before folding on.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.structs import OffsetAndMetadata

from handlers.privacy.kek import KEK_VAR, require_keks
from handlers.worker.partition_reader import PartitionReader
from handlers.worker.ports import SourceRecord
from schemas.config import RouterConfig, Secrets, Settings
from streams.worker.app import WorkerApp
from streams.worker.env import WorkerEnv
from tests.support.env import TEST_KEK
from tests.support.kafka import create_topic


async def produce(bootstrap: str, topic: str, count: int) -> None:
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all")
    await producer.start()
    try:
        for n in range(count):
            await producer.send_and_wait(topic, key=b"1:1", value=f"record-{n}".encode(), partition=0)
    finally:
        await producer.stop()


async def test_aiokafka_does_not_rewind_a_partition_that_was_never_committed(kafka_bootstrap: str, app_id: str) -> None:
    """The bare library behaviour: after reading five records, `seek_to_committed` keeps the position at 5."""
    topic = f"{app_id}.events"
    await create_topic(kafka_bootstrap, topic, partitions=1)
    await produce(kafka_bootstrap, topic, 10)
    tp = TopicPartition(topic, 0)
    consumer = AIOKafkaConsumer(
        bootstrap_servers=kafka_bootstrap, group_id=app_id, enable_auto_commit=False, auto_offset_reset="earliest"
    )
    await consumer.start()
    try:
        consumer.assign([tp])
        read: list[int] = []
        async with asyncio.timeout(30):
            while len(read) < 5:
                batch = await consumer.getmany(tp, timeout_ms=500, max_records=5 - len(read))
                read.extend(r.offset for r in batch.get(tp, []))
        assert read == [0, 1, 2, 3, 4]
        await consumer.seek_to_committed(tp)
        assert await consumer.position(tp) == 5  # not 0: what was fetched and dropped is never read again
    finally:
        await consumer.stop()


def worker_app(tmp_path: Path, bootstrap: str, app_id: str, commit_interval_ms: int = 2800) -> WorkerApp:
    config = RouterConfig.model_validate(
        {
            "chatwoot": {"baseUrl": "http://127.0.0.1:9"},
            "routing": {"botIds": {"1": 5}, "accounts": {"1": {"sales": {"assignee": 3, "covers": "Quotes."}}}},
        }
    )
    secrets = Secrets(chatwoot_token="t", agent_bot_tokens={1: "b"}, agent_bot_secrets={1: "s"}, typesafe_api_key="k")
    env = WorkerEnv(
        app_id=app_id,
        bootstrap=bootstrap,
        partitions=1,
        data_dir=tmp_path / "state",
        commit_interval_ms=commit_interval_ms,
    )
    return WorkerApp(Settings(config=config, secrets=secrets), env, keks=require_keks({KEK_VAR: TEST_KEK}))


async def test_the_commit_interval_is_the_operators(tmp_path: Path, kafka_bootstrap: str, app_id: str) -> None:
    """ROUTER_COMMIT_INTERVAL_MS reaches Faust: its commit timer writes the cache and commits at that interval."""
    worker = worker_app(tmp_path, kafka_bootstrap, app_id)
    assert worker.app.conf.broker_commit_interval == 2.8
    await worker.service.executor.aclose()
    slower = worker_app(tmp_path / "other", kafka_bootstrap, app_id, commit_interval_ms=8000)
    assert slower.app.conf.broker_commit_interval == 8.0
    await slower.service.executor.aclose()


async def test_a_gap_is_read_and_folded_in_order_before_the_record_that_revealed_it(
    tmp_path: Path, kafka_bootstrap: str, app_id: str
) -> None:
    topic = f"{app_id}.conversations"
    await create_topic(kafka_bootstrap, topic, partitions=1)
    await produce(kafka_bootstrap, topic, 8)
    worker = worker_app(tmp_path, kafka_bootstrap, app_id)
    service = worker.service  # reads the gap with the worker's real PartitionReader
    tp = (topic, 0)
    folded: list[tuple[int, bytes | None]] = []

    async def handler(record: SourceRecord) -> None:
        folded.append((record.offset, record.value))

    def handed(offset: int) -> SourceRecord:
        return SourceRecord(topic, 0, offset, b"1:1", f"record-{offset}".encode())

    try:
        service.offsets.assign([tp], await worker.reader.resume_points([tp]))
        assert service.offsets.expected(tp) == 0  # nothing committed: the log start
        await service.in_order("router", handed(5), handler)  # Faust skipped 0..4
        assert folded == [(n, f"record-{n}".encode()) for n in range(6)]
        await service.in_order("router", handed(3), handler)  # delivered again after a seek back: skipped
        await service.in_order("router", handed(6), handler)
        assert [offset for offset, _ in folded] == [0, 1, 2, 3, 4, 5, 6]
    finally:
        await worker.reader.close()
        await service.executor.aclose()


async def test_the_group_resumes_at_its_committed_offset(kafka_bootstrap: str, app_id: str) -> None:
    topic = f"{app_id}.effects"
    await create_topic(kafka_bootstrap, topic, partitions=1)
    await produce(kafka_bootstrap, topic, 9)
    committer = AIOKafkaConsumer(bootstrap_servers=kafka_bootstrap, group_id=app_id, enable_auto_commit=False)
    await committer.start()
    try:
        committer.assign([TopicPartition(topic, 0)])
        await committer.commit({TopicPartition(topic, 0): OffsetAndMetadata(7, "")})
    finally:
        await committer.stop()
    reader = PartitionReader(kafka_bootstrap, app_id)
    try:
        assert await reader.resume_points([(topic, 0)]) == {(topic, 0): 7}
    finally:
        await reader.close()
