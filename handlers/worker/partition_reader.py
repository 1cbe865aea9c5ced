"""Reads a partition range and the group's resume points outside Faust's consumer (DESIGN §6 "No record skipped").

The worker uses it when its consumer hands an agent a record past the offset it expected: the missing records
are read here, by a consumer of its own without a group (so it never joins or commits anything), and folded in
order before the record that revealed the gap. On assignment it also tells where the group resumes each
partition: the committed offset, else the log start.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Iterable

from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient

from handlers.kafka.security import client_options
from handlers.worker.ports import SourceRecord

log = logging.getLogger("chatwoot_router.worker")

TP = tuple[str, int]
READ_TIMEOUT_S = 30.0


class RangeNotRead(Exception):
    """The missing records could not be read in time (broker unreachable, say)."""


class PartitionReader:
    """One admin client and one group-less consumer, started on first use and shared by the agents."""

    def __init__(self, bootstrap: str, group_id: str) -> None:
        self.bootstrap = bootstrap
        self.group_id = group_id
        self._consumer: AIOKafkaConsumer | None = None
        self._admin: AIOKafkaAdminClient | None = None
        self._lock = asyncio.Lock()

    async def _clients(self) -> tuple[AIOKafkaConsumer, AIOKafkaAdminClient]:
        if self._consumer is None:
            consumer = AIOKafkaConsumer(
                bootstrap_servers=self.bootstrap,
                group_id=None,
                enable_auto_commit=False,
                auto_offset_reset="earliest",
                **client_options(),
            )
            await consumer.start()
            self._consumer = consumer
        if self._admin is None:
            admin = AIOKafkaAdminClient(bootstrap_servers=self.bootstrap, **client_options())
            await admin.start()
            self._admin = admin
        return self._consumer, self._admin

    async def close(self) -> None:
        consumer, admin = self._consumer, self._admin
        self._consumer = self._admin = None
        if consumer is not None:
            await consumer.stop()
        if admin is not None:
            await admin.close()

    async def resume_points(self, tps: Iterable[TP]) -> dict[TP, int]:
        """Where the group resumes each partition: its committed offset, else the partition's log start."""
        wanted = [TopicPartition(topic, partition) for topic, partition in tps]
        if not wanted:
            return {}
        async with self._lock:
            consumer, admin = await self._clients()
            committed = await admin.list_consumer_group_offsets(self.group_id, partitions=wanted)
            starts = await consumer.beginning_offsets(wanted)
        points: dict[TP, int] = {}
        for tp in wanted:
            meta = committed.get(tp)
            offset = meta.offset if meta is not None else -1  # -1: nothing committed
            points[(tp.topic, tp.partition)] = max(offset, starts.get(tp, 0))
        return points

    async def heads(self, tps: Iterable[TP]) -> dict[TP, int]:
        """Each partition's end offset now (the offset its next record will get)."""
        wanted = [TopicPartition(topic, partition) for topic, partition in tps]
        if not wanted:
            return {}
        async with self._lock:
            consumer, _ = await self._clients()
            ends = await consumer.end_offsets(wanted)
        return {(tp.topic, tp.partition): offset for tp, offset in ends.items()}

    async def read_range(self, topic: str, partition: int, start: int, end: int) -> list[SourceRecord]:
        """The records with `start <= offset < end`, in order (fewer at the head if retention removed some)."""
        tp = TopicPartition(topic, partition)
        records: list[SourceRecord] = []
        deadline = time.monotonic() + READ_TIMEOUT_S
        async with self._lock:
            consumer, _ = await self._clients()
            consumer.assign([tp])
            consumer.seek(tp, start)
            while True:
                if time.monotonic() > deadline:
                    raise RangeNotRead(f"{topic}[{partition}] {start}..{end - 1} not read in {READ_TIMEOUT_S:.0f} s")
                batch = await consumer.getmany(tp, timeout_ms=500)
                done = False
                for record in batch.get(tp, []):
                    if record.offset >= end:
                        done = True
                        break
                    if record.offset >= start:
                        records.append(SourceRecord(topic, partition, record.offset, record.key, record.value))
                    if record.offset == end - 1:
                        done = True
                if done:
                    break
                if await consumer.position(tp) >= end:
                    break
        return records
