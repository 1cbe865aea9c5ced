"""The step every reader of the event log repeats, once (DESIGN §8 "Readers at scale"). Pure: no I/O, no clock.

A record of `<app>.conversations` (or `<app>.sweeps`) is one of three things: a `ConfigApplied` marker, which
switches its partition to the configuration version it names exactly where the worker switched; an event,
validated by the worker's own decoder (`schemas/codec.py`) before any fold sees it, since a replay trusts the log
no more than the worker does; or neither, counted as undecodable (the worker dead-lettered it). `LogScan` is that
step for `replay state`, `audit`, `audit --verify`, `whatif` and the console.

`History` is the other thing every reader must say: whether each partition still starts at offset 0. A log whose
head was deleted (finite retention, `deleteRecords`) holds only part of the history, and what is folded from it
is only part of the truth.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Generic, TypeVar

from projections.logs.versions import PartitionVersions
from schemas.codec import Undecodable, decode_conversation_event, decode_sweep_event
from schemas.configs import ConfigBook, ConfigDocument
from schemas.keys import partition_slot
from schemas.records import HISTORY_MISSING_HEADER, ConversationEvent, SweepEvent

E = TypeVar("E")


class LogScan(Generic[E]):
    """Markers, validation and the undecodable count for the records of one topic, partition by partition."""

    def __init__(self, book: ConfigBook, decode: Callable[[bytes | None], E], topic: str = "conversations") -> None:
        self.book = book
        self.decode = decode
        self.topic = topic
        self.versions = PartitionVersions(book)
        self.records = 0
        self.undecodable = 0
        self.by_partition: Counter[int] = Counter()

    def event(self, value: bytes | None, partition: int) -> E | None:
        """The event `value` holds; None for a marker (its version is now in force) or an undecodable record."""
        self.records += 1
        self.by_partition[partition] += 1
        if self.versions.switch(value, partition, self.topic):
            return None
        try:
            return self.decode(value)
        except Undecodable:
            self.undecodable += 1
            return None

    def document(self, partition: int) -> ConfigDocument | None:
        """The version in force for the partition's next record (None: the book is empty, an old log)."""
        return self.versions.document(partition, self.topic)

    def version(self, partition: int) -> str | None:
        """The version the partition's last marker named (None before any)."""
        return self.versions.slots.get(partition_slot(self.topic, partition))

    def resume(self, partition: int, version: str | None) -> None:
        """A read that starts inside the partition: `version` was in force there (None: the book's first)."""
        slot = partition_slot(self.topic, partition)
        if version is not None and version in self.book:
            self.versions.slots[slot] = version
        else:
            self.versions.slots.pop(slot, None)

    def add_documents(self, documents: Iterable[ConfigDocument]) -> None:
        """Versions applied after the book was read (the console tails a live log)."""
        for document in documents:
            if document.version not in self.book:
                self.book.add(document)


def conversation_scan(book: ConfigBook) -> LogScan[ConversationEvent]:
    return LogScan(book, decode_conversation_event, "conversations")


def sweep_scan(book: ConfigBook) -> LogScan[SweepEvent]:
    return LogScan(book, decode_sweep_event, "sweeps")


# --- a log that lost its head says so ---------------------------------------------------------------------


@dataclass(frozen=True)
class PartitionHead:
    """Where a partition's log starts now, the time of the first record it still holds, and how many records the
    history it was copied from had already lost (`replay state --to-app` from a partial history writes that count
    on the first record it copies: `schemas.records.HISTORY_MISSING_HEADER`)."""

    partition: int
    log_start: int
    end: int
    first_ms: int | None = None
    inherited: int = 0

    @property
    def missing(self) -> int:
        """Records missing from its head: those deleted here (retention or `deleteRecords`: the log start, as
        offsets begin at 0), and those its source had lost before it was copied."""
        return self.log_start + self.inherited


@dataclass(frozen=True)
class History:
    """Every partition's head: the history is complete only when each still starts at offset 0."""

    topic: str
    heads: tuple[PartitionHead, ...] = field(default_factory=tuple)

    @property
    def partial(self) -> tuple[PartitionHead, ...]:
        return tuple(h for h in self.heads if h.missing > 0)

    @property
    def is_partial(self) -> bool:
        return bool(self.partial)

    @property
    def missing(self) -> int:
        return sum(h.missing for h in self.partial)

    @property
    def complete_from_ms(self) -> int | None:
        """From when every partition's history is kept: the latest first kept record of a partial partition."""
        times = [h.first_ms for h in self.partial if h.first_ms is not None]
        return max(times) if times else None

    def only(self, partitions: Iterable[int]) -> History:
        wanted = set(partitions)
        return History(self.topic, tuple(h for h in self.heads if h.partition in wanted))

    def describe(self) -> str:
        """One line naming the partitions that lost records, how many, and from when the history is kept."""
        if not self.is_partial:
            return f"{self.topic}: the history is complete (every partition starts at offset 0)"
        parts = ", ".join(
            f"{h.partition} ({h.missing:,} missing"
            + (f", {h.inherited:,} of them before the copy" if h.inherited else "")
            + (f", kept from {iso(h.first_ms)}" if h.first_ms else "")
            + ")"
            for h in self.partial
        )
        since = self.complete_from_ms
        tail = f"; complete only from {iso(since)}" if since is not None else ""
        copied = " (or by the history it was copied from)" if any(h.inherited for h in self.partial) else ""
        return (
            f"{self.topic}: the history is partial: {self.missing:,} records deleted from the head of "
            f"partition(s) {parts}{copied}{tail}"
        )


def missing_before(headers: Iterable[tuple[str, bytes]]) -> int:
    """The count of records a copied history had lost before this record (its `HISTORY_MISSING_HEADER`), or 0."""
    for name, value in headers:
        if name == HISTORY_MISSING_HEADER:
            try:
                return max(0, int(value))
            except ValueError:
                return 0
    return 0


def iso(at_ms: int) -> str:
    return datetime.fromtimestamp(at_ms / 1000, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
