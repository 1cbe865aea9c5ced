"""Faust's tables, topics and events behind the worker service's ports (`handlers/worker_ports.py`)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import faust

from handlers.worker_ports import Headers, SourceRecord


class FaustTable:
    """A Faust table behind `handlers.worker_ports.Table` (keys are text; Faust may hand them back as bytes)."""

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
    """The app's topics behind `handlers.worker_ports.Sink`; `flush` also flushes the tables' changelog writes."""

    def __init__(self, app: faust.App, topics: dict[str, Any]) -> None:
        self.app = app
        self.topics = topics

    async def send(self, topic: str, key: str, value: bytes, headers: Headers | None = None) -> None:
        await self.topics[topic].send(key=key.encode(), value=value, headers=headers)

    async def flush(self) -> None:
        await self.app.producer.flush()


def source_record(event: Any) -> SourceRecord:
    message = event.message
    return SourceRecord(message.topic, message.partition, message.offset, event.key, event.value)
