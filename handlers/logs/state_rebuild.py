"""`replay state`: rebuild the router's tables from its event log, never executing an effect (DESIGN §8).

Blue/green (`to_app`): the old app's `conversations` and `sweeps` are copied, partition by partition and in
order, into the new app's topics (resuming where an interrupted copy stopped), the configuration documents
with them, and the data keys of `<old>.keys` with each partition (what an older log holds in clear is sealed on
the way: handlers/logs/key_copy.py); the new topics are then folded with the current code and the resulting table
values are written to the new app's changelog topics; last, the new consumer group's offsets are set to the end of
what was folded (and of `effects`, so no command is ever consumed from before the rebuild). A worker started with
the new app id recovers exactly this state and resumes the runs that were waiting for an outcome.

In place: the same fold over the app's own topics, written over its own changelogs (keys no longer produced are
deleted), with the app's group offsets moved to the end. Both refuse while a worker of the target group runs.

At scale (DESIGN §8 "Readers at scale"): each partition is copied, folded and written on its own
(handlers/logs/rebuild_partition.py), `jobs` partitions at a time in as many processes, so memory holds one
partition's states per process and every core folds. A log whose head was deleted is refused (the rebuilt state
would lack the reply ledger and memos of what is gone) unless the operator accepts a partial history.
"""

from __future__ import annotations

import asyncio
import functools
import time
from dataclasses import dataclass

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, ConsumerRecord, TopicPartition
from aiokafka.structs import OffsetAndMetadata

from handlers.kafka.config_store import configs_topic, read_book
from handlers.kafka.security import client_options
from handlers.kafka.topic_io import durable_producer, group_members, read_topic, topic_partitions
from handlers.kafka.topics import ensure_app_topics
from handlers.logs.progress import ReadProgress
from handlers.logs.reader import plan
from handlers.logs.rebuild_partition import SOURCE_TOPICS, PartitionRebuilt, RebuildJob, passes, rebuild_partition
from handlers.logs.shards import jobs_for, run_sharded
from handlers.privacy.kek import load_keks
from projections.logs.scan import History


class RebuildRefused(Exception):
    """The rebuild would race a running worker, or has nothing to start from; `str()` says why."""


class PartialHistoryRefused(Exception):
    """The event log lost records from its head; `str()` names the partitions and how many records are gone."""

    def __init__(self, history: History) -> None:
        self.history = history
        super().__init__(
            f"{history.describe()}. A state rebuilt from it would lack what those records held (reply ledger, "
            "memos); give --accept-partial-history to rebuild from what is left"
        )


@dataclass
class Summary:
    copied: int
    records: int
    conversations: int
    runs_in_flight: int
    undecodable: int
    seconds: float
    history: History | None = None
    jobs: int = 1
    keys_written: int = 0
    sealed: int = 0


async def live_members(bootstrap: str, group: str) -> int:
    """How many members the consumer group has now (0 when it is empty or unknown)."""
    return len(await group_members(bootstrap, group))


async def _copy_configs(bootstrap: str, source: str, target: str, producer: AIOKafkaProducer) -> int:
    """Append to `target` the documents it lacks of `source` (a small compacted topic: skipped by count)."""
    have = sum((await _end_offsets(bootstrap, target)).values())
    records: list[ConsumerRecord[bytes, bytes]] = []
    await read_topic(bootstrap, source, records.append)
    for record in records[have:]:
        await producer.send_and_wait(target, value=record.value, key=record.key, partition=record.partition)
    return max(0, len(records) - have)


async def _end_offsets(bootstrap: str, topic: str) -> dict[int, int]:
    partitions = await topic_partitions(bootstrap, topic)
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False, **client_options())
    await consumer.start()
    try:
        ends = await consumer.end_offsets(partitions)
    finally:
        await consumer.stop()
    return {tp.partition: offset for tp, offset in ends.items()}


async def _set_group_offsets(bootstrap: str, app_id: str) -> None:
    """The group resumes after everything folded, and after every command issued before the rebuild."""
    offsets: dict[TopicPartition, OffsetAndMetadata] = {}
    for name in ("conversations", "sweeps", "effects"):
        for partition, end in (await _end_offsets(bootstrap, f"{app_id}.{name}")).items():
            offsets[TopicPartition(f"{app_id}.{name}", partition)] = OffsetAndMetadata(end, "replay state")
    consumer = AIOKafkaConsumer(
        bootstrap_servers=bootstrap, group_id=app_id, enable_auto_commit=False, **client_options()
    )
    await consumer.start()
    try:
        consumer.assign(list(offsets))
        await consumer.commit(offsets)
    finally:
        await consumer.stop()


async def _sizes(bootstrap: str, app_id: str) -> tuple[dict[int, int], History]:
    """Records to fold per partition, and the event log's history."""
    conversations = await plan(bootstrap, f"{app_id}.conversations")
    sizes = {span.partition: span.size for span in conversations.spans}
    try:
        for span in (await plan(bootstrap, f"{app_id}.sweeps")).spans:
            sizes[span.partition] = sizes.get(span.partition, 0) + span.size
    except LookupError:
        pass
    return sizes, conversations.history


async def rebuild(
    bootstrap: str,
    app_id: str,
    *,
    to_app: str | None = None,
    log_retention_ms: int | None = None,
    accept_partial_history: bool = False,
    jobs: int | None = None,
    show_progress: bool = True,
) -> Summary:
    """Rebuild `app_id`'s tables in place, or into the new app `to_app` (blue/green; its topics are created with
    the settings a worker gives them, `log_retention_ms` being ROUTER_LOG_RETENTION_MS), `jobs` partitions at a
    time (default: the machine's cores)."""
    started = time.monotonic()
    target = to_app or app_id
    if await live_members(bootstrap, target):
        raise RebuildRefused(f"workers of {target} are running (consumer group {target} has members); stop them first")
    book = await read_book(bootstrap, app_id)
    if not len(book):
        raise RebuildRefused(f"no configuration version on {configs_topic(app_id)}: start a worker of {app_id} once")
    sizes, history = await _sizes(bootstrap, app_id)
    if history.is_partial and not accept_partial_history:
        raise PartialHistoryRefused(history)
    copied = 0
    if to_app is not None:
        load_keks()  # a bad ROUTER_KEY_ENCRYPTION_KEY is refused now, in one line (ConfigError), not in each process
        partitions = len(await topic_partitions(bootstrap, f"{app_id}.conversations"))
        await ensure_app_topics(bootstrap, to_app, partitions, log_retention_ms=log_retention_ms)
        async with durable_producer(bootstrap) as producer:
            copied += await _copy_configs(bootstrap, configs_topic(app_id), configs_topic(to_app), producer)
    job = RebuildJob(
        bootstrap=bootstrap,
        source_app=app_id,
        target_app=target,
        book=await read_book(bootstrap, target),
        copy=to_app is not None,
        delete_stale=to_app is None,
    )
    jobs = jobs_for(sum(sizes.values()), jobs)
    reads = {p: n * (passes(n) + (1 if to_app is not None else 0)) for p, n in sizes.items()}  # copy, fold passes
    progress = ReadProgress("replay state", reads) if show_progress else None
    try:
        task = functools.partial(rebuild_partition, job)
        done: dict[int, PartitionRebuilt] = await asyncio.to_thread(run_sharded, task, sizes, jobs, progress)
    finally:
        if progress is not None:
            progress.close()
    await _set_group_offsets(bootstrap, target)
    parts = list(done.values())
    return Summary(
        copied=copied + sum(p.copied for p in parts),
        records=sum(p.records for p in parts),
        conversations=sum(p.conversations for p in parts),
        runs_in_flight=sum(p.runs_in_flight for p in parts),
        undecodable=sum(p.undecodable for p in parts),
        seconds=time.monotonic() - started,
        history=history,
        jobs=jobs,
        keys_written=sum(p.keys_written for p in parts),
        sealed=sum(p.sealed for p in parts),
    )


__all__ = ["SOURCE_TOPICS", "PartialHistoryRefused", "RebuildRefused", "Summary", "live_members", "rebuild"]
