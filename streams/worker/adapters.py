"""Faust's tables, topics and events behind the worker service's ports (`handlers/worker/ports.py`)."""

from __future__ import annotations

import weakref
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import faust
from faust import streams as faust_streams

from handlers.worker.barrier import Barrier
from handlers.worker.ports import Headers, SourceRecord


class FaustTable:
    """A Faust table behind `handlers.worker.ports.Table` (keys are text; Faust may hand them back as bytes)."""

    def __init__(self, table: Any) -> None:
        self.table = table

    def get(self, key: str) -> Any | None:
        return self.table.get(key)

    def set(self, key: str, value: Any) -> None:
        self.table[key] = value

    def delete(self, key: str) -> None:
        del self.table[key]

    def items(self) -> Iterator[tuple[str, Any]]:
        for key, value in self.table.items():
            yield (key.decode() if isinstance(key, bytes) else str(key)), value


class FaustSink:
    """The app's topics behind `handlers.worker.ports.Sink`. `flush` is the commit barrier: it returns once every
    record sent and every table changelog write so far is acknowledged, and raises `BarrierBroken` otherwise."""

    def __init__(self, app: faust.App, topics: dict[str, Any], barrier: Barrier) -> None:
        self.app = app
        self.topics = topics
        self.barrier = barrier

    async def send(self, topic: str, key: str, value: bytes, headers: Headers | None = None) -> None:
        # Topic.send hands the record to aiokafka and returns its future, resolved (or failed) by the broker's answer
        future = await self.topics[topic].send(key=key.encode(), value=value, headers=headers)
        self.barrier.add(future)

    async def flush(self) -> None:
        await self.barrier.wait(hand_over=self.app.producer.flush)


def source_record(event: Any) -> SourceRecord:
    message = event.message
    return SourceRecord(message.topic, message.partition, message.offset, event.key, event.value)


@dataclass(frozen=True)
class _Message:
    topic: str
    partition: int


class _PartitionEvent:
    """What a Faust table write reads of the current event: its message's source topic and partition."""

    __slots__ = ("__weakref__", "message")

    def __init__(self, topic: str, partition: int) -> None:
        self.message = _Message(topic, partition)


class FaustPartitionScope:
    """`handlers.worker.ports.PartitionScope` for Faust tables: writes inside `with scope(p):` go to partition p.

    A Faust table write (`table[key] = value`, its RocksDB store's put and its changelog record) takes the
    partition from `faust.streams.current_event()`, a ContextVar, and raises outside an event. The write cache
    writes at commit time, outside any event, so this sets a stand-in event of partition p of `topic` (a source
    topic co-partitioned with the tables) for the duration of the block, and restores the previous one after.
    """

    def __init__(self, topic: str) -> None:
        if not hasattr(faust_streams, "_current_event"):
            raise RuntimeError("faust.streams has no _current_event: revisit streams/worker/adapters.py")
        self.topic = topic

    @contextmanager
    def __call__(self, partition: int) -> Iterator[None]:
        event = _PartitionEvent(self.topic, partition)  # held here while the ContextVar refers to it
        token = faust_streams._current_event.set(weakref.ref(event))  # type: ignore[arg-type]
        try:
            yield
        finally:
            faust_streams._current_event.reset(token)
