"""`replay state`: rebuild the router's tables from its event log, never executing an effect (DESIGN §8).

Blue/green (`to_app`): the old app's `conversations` and `sweeps` are copied, partition by partition and in
order, into the new app's topics (resuming where an interrupted copy stopped), the configuration documents
with them; the new topics are then folded with the current code and the resulting table values are written to
the new app's changelog topics; last, the new consumer group's offsets are set to the end of what was folded
(and of `effects`, so no command is ever consumed from before the rebuild). A worker started with the new app
id recovers exactly this state and resumes the runs that were waiting for an outcome.

In place: the same fold over the app's own topics, written over its own changelogs (keys no longer produced are
deleted), with the app's group offsets moved to the end. Both refuse while a worker of the target group runs.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, ConsumerRecord, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.structs import OffsetAndMetadata

from handlers.config_store import configs_topic, ensure_configs_topic, read_book
from handlers.kafka_io import durable_producer, read_topic, topic_partitions
from handlers.kafka_topics import TABLES, changelog_topic, ensure_topics
from projections.rebuild import TableBuilder
from schemas.configs import ConfigBook

SOURCE_TOPICS = ("conversations", "sweeps")
ALL_TOPICS = ("conversations", "effects", "sweeps", "dlq")
REBUILT_TABLES = ("conversation_state", "sweep_state", "timers", "partition_configs")

Progress = Callable[[str, int], None]


class RebuildRefused(Exception):
    """The rebuild would race a running worker, or has nothing to start from; `str()` says why."""


@dataclass
class Summary:
    copied: int
    records: int
    conversations: int
    runs_in_flight: int
    undecodable: int
    seconds: float


async def live_members(bootstrap: str, group: str) -> int:
    """How many members the consumer group has now (0 when it is empty or unknown)."""
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        responses = await admin.describe_consumer_groups([group])
    finally:
        await admin.close()
    members = 0
    for response in responses:
        for described in getattr(response, "groups", []):
            members += len(described[5]) if len(described) > 5 else 0
    return members


async def _read(bootstrap: str, topic: str) -> dict[int, list[ConsumerRecord[bytes, bytes]]]:
    by_partition: dict[int, list[ConsumerRecord[bytes, bytes]]] = {}

    def keep(record: ConsumerRecord[bytes, bytes]) -> None:
        by_partition.setdefault(record.partition, []).append(record)

    for tp in await topic_partitions(bootstrap, topic):
        by_partition.setdefault(tp.partition, [])
    await read_topic(bootstrap, topic, keep)
    return by_partition


async def _copy(bootstrap: str, source: str, target: str, producer: AIOKafkaProducer, progress: Progress | None) -> int:
    """Append to `target` what it lacks of `source`, partition by partition (a resumed copy skips what is there)."""
    have = await _end_offsets(bootstrap, target)
    copied = 0
    for partition, records in sorted((await _read(bootstrap, source)).items()):
        pending = []
        for record in records[have.get(partition, 0) :]:
            pending.append(
                await producer.send(
                    target, value=record.value, key=record.key, partition=partition, headers=list(record.headers)
                )
            )
            copied += 1
            if progress is not None and copied % 1000 == 0:
                progress("copied", copied)
        for future in pending:
            await future
    return copied


async def _end_offsets(bootstrap: str, topic: str) -> dict[int, int]:
    partitions = await topic_partitions(bootstrap, topic)
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False)
    await consumer.start()
    try:
        ends = await consumer.end_offsets(partitions)
    finally:
        await consumer.stop()
    return {tp.partition: offset for tp, offset in ends.items()}


async def _fold(bootstrap: str, app_id: str, book: ConfigBook, progress: Progress | None) -> TableBuilder:
    builder = TableBuilder(book)
    for name, feed in (("conversations", builder.feed_conversation), ("sweeps", builder.feed_sweep)):
        for partition, records in sorted((await _read(bootstrap, f"{app_id}.{name}")).items()):
            for record in records:
                feed(record.value, partition, record.offset)
                if progress is not None and builder.records % 1000 == 0:
                    progress("folded", builder.records)
    return builder


async def _existing_keys(bootstrap: str, topic: str) -> dict[bytes, int]:
    keys: dict[bytes, int] = {}

    def keep(record: ConsumerRecord[bytes, bytes]) -> None:
        if record.key is not None:
            if record.value is None:
                keys.pop(record.key, None)
            else:
                keys[record.key] = record.partition

    try:
        await read_topic(bootstrap, topic, keep)
    except LookupError:
        return {}
    return keys


async def _write_tables(
    bootstrap: str, app_id: str, builder: TableBuilder, producer: AIOKafkaProducer, *, delete_stale: bool
) -> None:
    """Write every table value to its changelog (as Faust writes them: JSON key and value) at its partition."""
    tables = builder.tables()
    for table in REBUILT_TABLES:
        topic = changelog_topic(app_id, table)
        values = tables[table]
        futures = []
        for key, (partition, value) in values.items():
            raw_key = json.dumps(key).encode()
            futures.append(
                await producer.send(topic, key=raw_key, value=json.dumps(value).encode(), partition=partition)
            )
        if delete_stale:
            wanted = {json.dumps(key).encode() for key in values}
            for raw_key, partition in (await _existing_keys(bootstrap, topic)).items():
                if raw_key not in wanted:
                    futures.append(await producer.send(topic, key=raw_key, value=None, partition=partition))
        for future in futures:
            await future


async def _set_group_offsets(bootstrap: str, app_id: str) -> None:
    """The group resumes after everything folded, and after every command issued before the rebuild."""
    offsets: dict[TopicPartition, OffsetAndMetadata] = {}
    for name in ("conversations", "sweeps", "effects"):
        for partition, end in (await _end_offsets(bootstrap, f"{app_id}.{name}")).items():
            offsets[TopicPartition(f"{app_id}.{name}", partition)] = OffsetAndMetadata(end, "replay state")
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, group_id=app_id, enable_auto_commit=False)
    await consumer.start()
    try:
        consumer.assign(list(offsets))
        await consumer.commit(offsets)
    finally:
        await consumer.stop()


async def rebuild(
    bootstrap: str, app_id: str, *, to_app: str | None = None, progress: Progress | None = None
) -> Summary:
    """Rebuild `app_id`'s tables in place, or into the new app `to_app` (blue/green)."""
    started = time.monotonic()
    target = to_app or app_id
    if await live_members(bootstrap, target):
        raise RebuildRefused(f"workers of {target} are running (consumer group {target} has members); stop them first")
    book = await read_book(bootstrap, app_id)
    if not len(book):
        raise RebuildRefused(f"no configuration version on {configs_topic(app_id)}: start a worker of {app_id} once")
    copied = 0
    async with durable_producer(bootstrap, linger_ms=5) as producer:
        if to_app is not None:
            partitions = len(await topic_partitions(bootstrap, f"{app_id}.conversations"))
            await ensure_topics(bootstrap, {f"{to_app}.{name}": partitions for name in ALL_TOPICS})
            compacted = {"cleanup.policy": "compact"}
            logs = {changelog_topic(to_app, table): partitions for table in TABLES}
            await ensure_topics(bootstrap, logs, configs={name: compacted for name in logs})
            await ensure_configs_topic(bootstrap, to_app)
            copied += await _copy(bootstrap, configs_topic(app_id), configs_topic(to_app), producer, None)
            for name in SOURCE_TOPICS:
                copied += await _copy(bootstrap, f"{app_id}.{name}", f"{to_app}.{name}", producer, progress)
        builder = await _fold(bootstrap, target, await read_book(bootstrap, target), progress)
        await _write_tables(bootstrap, target, builder, producer, delete_stale=to_app is None)
    await _set_group_offsets(bootstrap, target)
    return Summary(
        copied=copied,
        records=builder.records,
        conversations=len(builder.states),
        runs_in_flight=builder.runs_in_flight(),
        undecodable=builder.undecodable,
        seconds=time.monotonic() - started,
    )
