"""One partition of `replay state`: copy it (blue/green), fold it, write its table values (DESIGN §8).

A partition is independent of the others (each conversation and each sweep key lives in one), so the rebuild runs
this once per partition, in as many processes as `--jobs` allows (handlers/logs/shards.py), and only one partition's
states are ever in memory in a process. Everything here is resumable: a copy appends only what the target lacks,
and the table values written are the same each time.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from aiokafka import AIOKafkaProducer

from handlers.kafka.topic_io import durable_producer
from handlers.kafka.topics import changelog_topic
from handlers.logs.key_copy import PartitionKeys
from handlers.logs.reader import Progress, Records, Share, Span, batches, key_shares, log_consumer, plan, read
from handlers.privacy.kek import load_keks
from projections.logs.rebuild import TableBuilder
from schemas.configs import ConfigBook
from schemas.records import HISTORY_MISSING_HEADER

SOURCE_TOPICS = ("conversations", "sweeps")
REBUILT_TABLES = ("conversation_state", "sweep_state", "timers", "partition_configs")
Feed = Callable[[bytes | None, int, int], None]
Values = Callable[[Records], Awaitable[list[bytes | None]]]
IN_FLIGHT = 20_000  # sends awaited together: bounded memory, and the producer still batches
BATCH_BYTES = 1024 * 1024  # a copy produces a lot at once: large batches, a short linger


@dataclass(frozen=True)
class RebuildJob:
    """What every partition's task needs (picklable: it goes to the pool's processes)."""

    bootstrap: str
    source_app: str
    target_app: str
    book: ConfigBook
    copy: bool
    delete_stale: bool


@dataclass(frozen=True)
class PartitionRebuilt:
    copied: int
    records: int
    conversations: int
    runs_in_flight: int
    undecodable: int
    keys_written: int = 0
    sealed: int = 0


async def rebuild_partition(job: RebuildJob, partition: int, progress: Progress) -> PartitionRebuilt:
    """Copy (when blue/green), fold and write one partition of the target app; a long partition is folded in
    several passes, each over a share of its keys (`log_reader.key_shares`), its table values written before the
    next pass starts, so memory holds about the same number of states however long the history is."""
    copied = 0
    async with durable_producer(job.bootstrap, linger_ms=20, max_batch_size=BATCH_BYTES) as producer:
        keks = load_keks() if job.copy else None  # only sealing on the way needs it
        keys = PartitionKeys(job.bootstrap, job.source_app, job.target_app, partition, producer, keks)
        if job.copy:  # the data keys go first, and each key a sealed record needs before it (handlers/logs/key_copy)
            await keys.start()
            for name in SOURCE_TOPICS:
                source, target = f"{job.source_app}.{name}", f"{job.target_app}.{name}"
                values = keys.values if name == "conversations" else None
                copied += await copy_partition(job.bootstrap, source, target, partition, producer, progress, values)
        spans = {name: await _spans(job.bootstrap, f"{job.target_app}.{name}", partition) for name in SOURCE_TOPICS}
        written: dict[str, set[bytes]] = {}
        records = conversations = in_flight = undecodable = 0
        for index, share in enumerate(key_shares(sum(s.size for found in spans.values() for s in found))):
            builder = TableBuilder(job.book)
            for name, feed in (("conversations", builder.feed_conversation), ("sweeps", builder.feed_sweep)):

                def fold(p: int, batch: Records, feed: Feed = feed, share: Share | None = share) -> None:
                    for record in batch:
                        if share is None or share(record.key):
                            feed(record.value, p, record.offset)

                read_now = await read(job.bootstrap, spans[name], fold, progress=progress)
                records += read_now if index == 0 else 0
            await write_tables(job.target_app, builder, producer, written)
            conversations += len(builder.states)
            in_flight += builder.runs_in_flight()
            undecodable += builder.undecodable
            del builder, fold  # this pass's states go before the next pass folds its own
        if job.delete_stale:
            await delete_stale(job.bootstrap, job.target_app, producer, partition, written)
    return PartitionRebuilt(copied, records, conversations, in_flight, undecodable, keys.written, keys.sealed)


def passes(records: int) -> int:
    """How many times `rebuild_partition` reads a partition of `records` records to fold it."""
    return len(key_shares(records))


async def _spans(bootstrap: str, topic: str, partition: int) -> tuple[Span, ...]:
    try:
        return (await plan(bootstrap, topic, partitions=[partition], look_at_heads=False)).spans
    except LookupError:  # no sweeps topic yet: nothing to fold
        return ()


async def copy_partition(
    bootstrap: str,
    source: str,
    target: str,
    partition: int,
    producer: AIOKafkaProducer,
    progress: Progress,
    values: Values | None = None,
) -> int:
    """Append to `target`'s partition what it lacks of `source`'s (a resumed copy skips the records already there),
    reading and producing batch by batch, each record with its key, headers and time, and its value as `values`
    gives it for the batch (the same bytes without it). The copy starts at offset 0, so when the source lost records
    from its head, the first record copied says how many (`missing_header`)."""
    try:
        source_plan = await plan(bootstrap, source, partitions=[partition])
    except LookupError:
        return 0
    span, head = source_plan.spans[0], source_plan.history.heads[0]
    have = await _spans(bootstrap, target, partition)
    already = have[0].end if have else 0
    span = Span(span.topic, span.partition, span.start + already, span.end)
    copied = 0
    pending: list[asyncio.Future[object]] = []
    async with log_consumer(bootstrap) as consumer:
        async for batch in batches(consumer, span, progress=progress):
            copied_values = await values(batch) if values is not None else [record.value for record in batch]
            for record, value in zip(batch, copied_values, strict=True):
                headers = list(record.headers)
                if already == 0 and copied == 0 and head.missing:
                    headers = missing_header(headers, head.missing)
                pending.append(
                    await producer.send(
                        target,
                        value=value,
                        key=record.key,
                        partition=partition,
                        timestamp_ms=record.timestamp,
                        headers=headers,
                    )
                )
                copied += 1
            if len(pending) >= IN_FLIGHT:
                await asyncio.gather(*pending)
                pending.clear()
    await asyncio.gather(*pending)
    return copied


def missing_header(headers: list[tuple[str, bytes]], missing: int) -> list[tuple[str, bytes]]:
    """`headers` with the count of records lost before this one (replacing a count an earlier copy wrote)."""
    kept = [(name, value) for name, value in headers if name != HISTORY_MISSING_HEADER]
    return [*kept, (HISTORY_MISSING_HEADER, str(missing).encode())]


async def write_tables(
    app_id: str, builder: TableBuilder, producer: AIOKafkaProducer, written: dict[str, set[bytes]]
) -> None:
    """Write every table value the builder holds to its changelog (as Faust writes them: JSON key and value), at
    its partition; `written` collects the keys written per table."""
    for table, rows in builder.encoded_tables().items():
        topic = changelog_topic(app_id, table)
        keys = written.setdefault(table, set())
        pending: list[asyncio.Future[object]] = []
        for raw_key, at, value in rows:
            keys.add(raw_key)
            pending.append(await producer.send(topic, key=raw_key, value=value, partition=at))
            if len(pending) >= IN_FLIGHT:
                await asyncio.gather(*pending)
                pending.clear()
        await asyncio.gather(*pending)


async def delete_stale(
    bootstrap: str, app_id: str, producer: AIOKafkaProducer, partition: int, written: dict[str, set[bytes]]
) -> None:
    """In place: delete the keys of the partition's changelogs that the fold no longer produces."""
    for table in REBUILT_TABLES:
        topic = changelog_topic(app_id, table)
        wanted = written.get(table, set())
        pending = [
            await producer.send(topic, key=raw_key, value=None, partition=partition)
            for raw_key in await existing_keys(bootstrap, topic, partition)
            if raw_key not in wanted
        ]
        await asyncio.gather(*pending)


async def existing_keys(bootstrap: str, topic: str, partition: int) -> set[bytes]:
    """The keys a changelog partition holds a value for now (its last record per key is not a tombstone)."""
    keys: dict[bytes, bool] = {}

    def keep(p: int, records: Records) -> None:
        for record in records:
            if record.key is not None:
                keys[record.key] = record.value is not None

    await read(bootstrap, await _spans(bootstrap, topic, partition), keep)
    return {key for key, live in keys.items() if live}
