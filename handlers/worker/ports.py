"""The small interfaces the worker service works through, with in-memory implementations for tests.

Faust gives the service its tables (RocksDB, changelog-backed) and topics; `streams/worker/app.py` adapts them
to `Table` and `Sink`. Tests use `MemoryTable` and `MemorySink`, so the service's crash-safety behaviour (the
reply-attempt guard, resume after takeover, DLQ routing, timer re-emission) is tested in-process.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field
from typing import Any, Protocol

from schemas.config import RouterConfig
from schemas.records import EffectCommand, EffectOutcome

Headers = list[tuple[str, bytes]]
TP = tuple[str, int]


@dataclass(frozen=True)
class SourceRecord:
    """One record of a source topic as the service sees it, from Faust's consumer or a gap read."""

    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None

    @property
    def tp(self) -> TP:
        return (self.topic, self.partition)


class Table(Protocol):
    """A key-value table partitioned like the source topics (a JSON value per key)."""

    def get(self, key: str) -> Any | None: ...

    def set(self, key: str, value: Any) -> None: ...

    def delete(self, key: str) -> None: ...

    def items(self) -> Iterator[tuple[str, Any]]: ...


class PartitionScope(Protocol):
    """Where a table write outside a record's handling lands: `with scope(p):` writes go to partition `p`.

    Faust takes a table write's partition (its store's and its changelog's) from the event being processed; the
    write cache writes at commit time, outside any event, so it names the partition of each key it writes."""

    def __call__(self, partition: int) -> AbstractContextManager[object]: ...


def any_partition(partition: int) -> AbstractContextManager[object]:
    """The scope of tables that do not care (`MemoryTable`)."""
    return nullcontext()


class Sink(Protocol):
    """Sends records to the app's topics ("conversations", "effects", "sweeps", "dlq") by key."""

    async def send(self, topic: str, key: str, value: bytes, headers: Headers | None = None) -> None: ...

    async def flush(self) -> None:
        """Return once everything sent so far (table changelog writes included) is durable in Kafka; raise
        `handlers.worker.barrier.BarrierBroken` when a write failed or is not acknowledged in time."""


class Executor(Protocol):
    async def execute(
        self, command: EffectCommand, config: RouterConfig | None = None, *, unchanged_since: float | None = None
    ) -> EffectOutcome: ...

    def forget(self, key: str) -> None:
        """The conversation was erased: keep nothing of it (reads kept for reuse)."""

    async def aclose(self) -> None: ...


class GapReader(Protocol):
    """Reads records a consumer skipped (`handlers.worker.partition_reader.PartitionReader`)."""

    async def read_range(self, topic: str, partition: int, start: int, end: int) -> list[SourceRecord]: ...


# --- in memory ----------------------------------------------------------------------------------------------


@dataclass
class MemoryTable:
    """A dict behind the `Table` interface; `writes` counts every set/delete (a rewrite is a write too)."""

    data: dict[str, Any] = field(default_factory=dict)
    writes: int = 0

    def get(self, key: str) -> Any | None:
        return self.data.get(key)

    def set(self, key: str, value: Any) -> None:
        self.data[key] = value
        self.writes += 1

    def delete(self, key: str) -> None:
        self.data.pop(key, None)
        self.writes += 1

    def items(self) -> Iterator[tuple[str, Any]]:
        return iter(list(self.data.items()))


@dataclass(frozen=True)
class Sent:
    topic: str
    key: str
    value: bytes
    headers: Headers | None


@dataclass
class MemorySink:
    """Keeps what was sent, in order; `flushes` counts flushes (the service flushes before risky calls)."""

    sent: list[Sent] = field(default_factory=list)
    flushes: int = 0

    async def send(self, topic: str, key: str, value: bytes, headers: Headers | None = None) -> None:
        self.sent.append(Sent(topic, key, value, headers))

    async def flush(self) -> None:
        self.flushes += 1

    def on(self, topic: str) -> list[Sent]:
        return [s for s in self.sent if s.topic == topic]
