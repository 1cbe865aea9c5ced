"""The one reader of `<app>.conversations` for the commands that fold it (DESIGN §8 "Readers at scale").

`replay state`, `audit`, `audit --verify`, `whatif` and the console read the event log the same way:

- `plan` asks the brokers, per partition, where the log starts and ends now, and where to start reading: the
  log start, an offset the caller knows (a conversation's first record), or the first offset at or after a time
  (`offsets_for_times`, for `whatif --since`). It also tells whether the history is complete: a partition whose
  log start is above 0 lost records from its head, and the plan says how many and from when it is kept.
- `read` streams the planned spans one partition at a time, in offset order, handing each fetched batch to a
  callback and dropping it: a reader keeps what its answer needs (states, counters), never the topic. A key
  filter skips other conversations' records before anything decodes them. It never joins a consumer group and
  never commits, so it cannot disturb the workers.

The pure step that follows (markers, validation, the undecodable count) is `projections/logs/scan.py`.
"""

from __future__ import annotations

import asyncio
import time
import zlib
from collections.abc import AsyncIterator, Callable, Collection, Iterable, Mapping, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, replace

from aiokafka import AIOKafkaConsumer, ConsumerRecord, TopicPartition

from handlers.kafka.security import client_options
from handlers.kafka.topic_io import topic_partitions
from projections.logs.scan import History, PartitionHead, missing_before
from schemas.records import MARKER_KEY

Records = Sequence[ConsumerRecord[bytes, bytes]]
OnRecords = Callable[[int, Records], None]
MARKER = MARKER_KEY.encode()
Progress = Callable[[int, int], None]  # (partition, records just read)

FETCH_BYTES = 4 * 1024 * 1024  # per partition and fetch: one partition is read at a time, so ask for a lot
HEAD_FETCH_BYTES = 64 * 1024  # a plan looks at one record per partition (a fetch still returns a whole batch)
STALL_S = 60.0
PASS_RECORDS = 100_000
"""A partition longer than this is folded in several passes, each over a share of its keys (`key_shares`)."""

Share = Callable[[bytes | None], bool]


class ReadStalled(Exception):
    """No record came for a span that is not finished, for `STALL_S` (broker gone, say)."""


@dataclass(frozen=True)
class Span:
    """The records `start <= offset < end` of one partition."""

    topic: str
    partition: int
    start: int
    end: int

    @property
    def size(self) -> int:
        return max(0, self.end - self.start)


@dataclass(frozen=True)
class Plan:
    """What to read, per partition, and the state of the topic's history."""

    topic: str
    spans: tuple[Span, ...]
    history: History

    @property
    def records(self) -> int:
        return sum(span.size for span in self.spans)

    @property
    def partitions(self) -> tuple[int, ...]:
        return tuple(span.partition for span in self.spans)

    def span(self, partition: int) -> Span:
        return next(s for s in self.spans if s.partition == partition)

    def only(self, partitions: Iterable[int]) -> Plan:
        wanted = set(partitions)
        spans = tuple(s for s in self.spans if s.partition in wanted)
        return Plan(self.topic, spans, self.history.only(wanted))

    def starting(self, starts: Mapping[int, int]) -> Plan:
        """The same plan, starting each partition named in `starts` there (never before its log start)."""
        heads = {h.partition: h for h in self.history.heads}
        spans = tuple(
            replace(s, start=max(starts[s.partition], heads[s.partition].log_start)) if s.partition in starts else s
            for s in self.spans
        )
        return Plan(self.topic, spans, self.history)


def key_shares(records: int, per_pass: int | None = None) -> list[Share | None]:
    """How to fold a partition of `records` records in bounded memory: one pass over everything (`[None]`), or one
    pass per share of its keys (a conversation's records are all in one share; markers are in every share), so a
    pass holds the states of about `per_pass` records' conversations however long the partition is. A raw read
    costs a tenth of a fold, so reading a long partition twice or thrice is cheap next to holding it all."""
    count = max(1, -(-records // (per_pass or PASS_RECORDS)))
    if count == 1:
        return [None]
    return [_Share(count, index) for index in range(count)]


class _Share:
    """Keys whose CRC-32 is `index` modulo `count`, and the markers (picklable: it goes to pool processes)."""

    def __init__(self, count: int, index: int) -> None:
        self.count, self.index = count, index

    def __call__(self, key: bytes | None) -> bool:
        return key == MARKER or zlib.crc32(key or b"") % self.count == self.index


@asynccontextmanager
async def log_consumer(bootstrap: str, fetch_bytes: int = FETCH_BYTES) -> AsyncIterator[AIOKafkaConsumer]:
    """A started consumer without a group (it never commits), tuned to read one partition at a time fast (or,
    with small `fetch_bytes`, to look at a few records cheaply)."""
    consumer = AIOKafkaConsumer(
        bootstrap_servers=bootstrap,
        group_id=None,
        enable_auto_commit=False,
        auto_offset_reset="earliest",
        max_partition_fetch_bytes=fetch_bytes,
        fetch_max_bytes=4 * fetch_bytes,
        fetch_max_wait_ms=100,
        **client_options(),
    )
    await consumer.start()
    try:
        yield consumer
    finally:
        await _stop(consumer)


async def _stop(consumer: AIOKafkaConsumer) -> None:
    """Stop the consumer. aiokafka 0.14 raises CancelledError from `stop()` when its coordinator's first task has
    not run yet (a consumer stopped right after it started); that is not a cancellation of ours."""
    try:
        await consumer.stop()
    except asyncio.CancelledError:
        task = asyncio.current_task()
        if task is not None and task.cancelling():
            raise


async def plan(
    bootstrap: str,
    topic: str,
    *,
    partitions: Collection[int] | None = None,
    starts: Mapping[int, int] | None = None,
    from_ms: int | None = None,
    look_at_heads: bool = True,
) -> Plan:
    """Where each partition of `topic` (or of `partitions`) starts and ends now, and where to read it from;
    LookupError when the topic does not exist. Each partition's first record is looked at (`look_at_heads`) for
    the time it holds and for the count of records lost before a copy (`HISTORY_MISSING_HEADER`)."""
    tps = [tp for tp in await topic_partitions(bootstrap, topic) if partitions is None or tp.partition in partitions]
    async with log_consumer(bootstrap, HEAD_FETCH_BYTES) as consumer:
        begins = await consumer.beginning_offsets(tps)
        ends = await consumer.end_offsets(tps)
        at_time: dict[TopicPartition, int] = {}
        if from_ms is not None and tps:
            found = await consumer.offsets_for_times({tp: from_ms for tp in tps})
            at_time = {tp: (hit.offset if (hit := found.get(tp)) is not None else ends[tp]) for tp in tps}
        heads = []
        for tp in tps:
            first_ms, inherited = None, 0
            if look_at_heads and ends[tp] > begins[tp]:
                first = await _record_at(consumer, tp, begins[tp])
                inherited = missing_before(first.headers) if first is not None else 0
                if first is not None and (begins[tp] > 0 or inherited):
                    first_ms = first.timestamp
            heads.append(PartitionHead(tp.partition, begins[tp], ends[tp], first_ms, inherited))
    spans = []
    for tp in tps:
        start = max(begins[tp], (starts or {}).get(tp.partition, begins[tp]), at_time.get(tp, begins[tp]))
        spans.append(Span(topic, tp.partition, start, ends[tp]))
    return Plan(topic, tuple(spans), History(topic, tuple(heads)))


async def _record_at(
    consumer: AIOKafkaConsumer, tp: TopicPartition, offset: int
) -> ConsumerRecord[bytes, bytes] | None:
    """The first record at or after `offset` (the first one a partition still holds)."""
    consumer.assign([tp])
    consumer.seek(tp, offset)
    batch = await consumer.getmany(tp, timeout_ms=2000, max_records=1)
    records = batch.get(tp, [])
    return records[0] if records else None


async def read(
    bootstrap: str,
    spans: Iterable[Span],
    on_records: OnRecords,
    *,
    keys: Collection[bytes] | None = None,
    progress: Progress | None = None,
) -> int:
    """Feed the records of every span to `on_records(partition, records)`, one partition after the other, in
    offset order; with `keys`, only the records with one of those keys (the others are never decoded). Returns the
    records read (filtered or not)."""
    total = 0
    spans = [span for span in spans if span.size > 0]
    if not spans:
        return 0
    async with log_consumer(bootstrap) as consumer:
        for span in spans:
            total += await read_span(consumer, span, on_records, keys=keys, progress=progress)
    return total


async def last_of(
    bootstrap: str, topic: str, partition: int, keys: Collection[bytes], *, chunk: int = 2000
) -> ConsumerRecord[bytes, bytes] | None:
    """The last record with one of `keys` in the partition (a table's current value, from its changelog), read
    backwards from the end in growing chunks: a recently written key is found in the first chunk however long the
    changelog is; only a key last written long ago costs a longer read. None when there is none (or no topic)."""
    try:
        span = (await plan(bootstrap, topic, partitions=[partition], look_at_heads=False)).span(partition)
    except (LookupError, StopIteration):
        return None
    high = span.end
    async with log_consumer(bootstrap) as consumer:
        while high > span.start:
            low = max(span.start, high - chunk)
            found = None
            async for batch in batches(consumer, Span(topic, partition, low, high), keys=keys):
                found = batch[-1]
            if found is not None:
                return found
            high, chunk = low, chunk * 2
    return None


async def read_span(
    consumer: AIOKafkaConsumer,
    span: Span,
    on_records: OnRecords,
    *,
    keys: Collection[bytes] | None = None,
    progress: Progress | None = None,
) -> int:
    """One span through `consumer` (see `read`)."""
    count = 0

    def counted(partition: int, records: int) -> None:
        nonlocal count
        count += records
        if progress is not None:
            progress(partition, records)

    async for batch in batches(consumer, span, keys=keys, progress=counted):
        on_records(span.partition, batch)
    return count


async def batches(
    consumer: AIOKafkaConsumer,
    span: Span,
    *,
    keys: Collection[bytes] | None = None,
    progress: Progress | None = None,
) -> AsyncIterator[Records]:
    """The span's records through `consumer`, batch by batch as fetched (for readers that await per batch: a copy
    that produces what it reads). `progress` counts every record read, kept by `keys` or not."""
    if span.size == 0:
        return
    tp = TopicPartition(span.topic, span.partition)
    consumer.assign([tp])
    consumer.seek(tp, span.start)
    position, last_seen = span.start, time.monotonic()
    while position < span.end:
        batch = (await consumer.getmany(tp, timeout_ms=500)).get(tp, [])
        if not batch:
            position = max(position, await consumer.position(tp))  # a gap (deleted head, compaction) moves it on
            if time.monotonic() - last_seen > STALL_S:
                raise ReadStalled(f"{span.topic}[{span.partition}]: nothing read for {STALL_S:.0f} s at {position}")
            continue
        last_seen = time.monotonic()
        if batch[-1].offset >= span.end:
            batch = [r for r in batch if r.offset < span.end]
        if not batch:
            break
        position = batch[-1].offset + 1
        if progress is not None:
            progress(span.partition, len(batch))
        if keys is not None:
            batch = [r for r in batch if r.key in keys]
        if batch:
            yield batch
        await asyncio.sleep(0)  # a long read must not starve the rest of the loop (the console's web server)
