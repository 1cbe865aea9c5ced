"""The console's I/O: it tails the event log into the read model and asks Kafka and the workers for the rest.

- `LogTail` first reads the applied configuration versions (`<app>.configs`; it waits for one, or for Kafka, when
  there is none and no configuration file), then keeps one consumer on every partition of
  `<app>.conversations`, from where the console's snapshot ends (`LiveConsole`) or from the beginning, never
  joining a group or committing (it must not disturb the workers), and feeds each record to the read model in
  offset order, committing the snapshot as it goes. Before a `ConfigApplied` marker whose version the model does
  not know, it reads `<app>.configs` again. It waits for the topic when it does not exist yet, reconnects from
  where it was after an error, and says when the log lost records from its head (the history is partial). All of
  it runs in the background of the web server, which answers from the first moment: `status` says what the tail
  is doing until it has caught up (`TailStatus.step`, `records`, `behind`).
- `Sources.refresh` gives the status at once and, at most every `ttl_s` however many browsers poll, measures the
  workers' consumer-group lag (end offsets minus committed offsets) and reads each worker's `GET /stuck` in the
  background, so no page waits for Kafka or for a worker.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import sys
import time
from collections.abc import Sequence

import httpx
from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient

from handlers.console.build import SMALL_READ
from handlers.console.live import LiveConsole
from handlers.console.status import ConsoleStatus, TailStatus, WorkerStuck
from handlers.kafka.config_store import read_book
from handlers.kafka.security import client_options
from handlers.logs.reader import FETCH_BYTES, plan
from projections.console.model import ConsoleModel
from projections.logs.scan import iso
from schemas.configs import ConfigBook

log = logging.getLogger("chatwoot_router.console")

RETRY_S = 2.0
END_OFFSETS_EVERY_S = 1.0
WAIT_S = 2.0  # between two reads of `<app>.configs` while there is no configuration version yet


class LogTail:
    """Feeds `<app>.conversations` into `model`, from the first record (or the snapshot's end) on, until stopped."""

    def __init__(self, bootstrap: str, app_id: str, model: ConsoleModel | LiveConsole) -> None:
        self.bootstrap = bootstrap
        self.app_id = app_id
        self.topic = f"{app_id}.conversations"
        topic = self.topic
        self.model = model
        self.status = TailStatus(topic=topic)
        # partition -> next offset to read (a live console's own: its timelines catch up to it)
        self.positions: dict[int, int] = model.positions if isinstance(model, LiveConsole) else {}
        self._restored = False
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="console-log-tail")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        if isinstance(self.model, LiveConsole):
            self.model.checkpoint(force=True)

    async def _run(self) -> None:
        if isinstance(self.model, LiveConsole) and not self.model.opened:
            self.model.open(await self._first_book())
        while True:
            try:
                await self._tail()
            except asyncio.CancelledError:
                raise
            except LookupError:
                self.status.error = f"waiting for topic {self.topic}"
            except Exception as exc:  # broker gone, metadata errors: say so and try again
                self.status.error = f"cannot read {self.topic}: {type(exc).__name__}"
                log.warning("log tail failed", extra={"error_type": type(exc).__name__})
            await asyncio.sleep(RETRY_S)

    async def _first_book(self) -> ConfigBook:
        """The applied configuration versions. Without a configuration file it waits until there is one (a
        console folds only under versions the workers applied); the status says what it waits for meanwhile."""
        assert isinstance(self.model, LiveConsole)
        fallback = self.model.config is not None  # the file folds a log without versions (or Kafka not there yet)
        said = False
        while True:
            self.status.step = "reading the configuration versions"
            try:
                book = await read_book(self.bootstrap, self.app_id)
            except Exception as exc:  # Kafka not reachable yet
                if fallback:
                    return ConfigBook()
                reason = f"Kafka at {self.bootstrap} does not answer ({type(exc).__name__})"
            else:
                if len(book) or fallback:
                    self.status.error = None
                    return book
                reason = f"no configuration version was applied on {self.app_id}.configs yet"
            self.status.error = f"waiting: {reason}"
            if not said:
                print(f"console: waiting: {reason}; or give --config FILE", file=sys.stderr, flush=True)
                said = True
            await asyncio.sleep(WAIT_S)

    async def _tail(self) -> None:
        self.status.step = "reading the log's partitions"
        planned = await plan(self.bootstrap, self.topic)
        history = planned.history
        self.status.partial = history.describe() if history.is_partial else None
        self.status.partial_since = iso(history.complete_from_ms) if history.complete_from_ms else None
        if isinstance(self.model, LiveConsole) and not self._restored:
            heads = {h.partition: h for h in history.heads}
            self.model.restore({p: h.log_start for p, h in heads.items()}, {p: h.end for p, h in heads.items()})
            if not self.model.restored and planned.records > SMALL_READ:  # a first start on a long log
                self.status.behind = planned.records
                self.status.step = "counting the conversations of the workers' live table"
                await self.model.seed()  # the live states' conversation count while the history is folded
                self.status.step = "folding the history, one partition per process (first start)"
                await self.model.build({s.partition: s.size for s in planned.spans}, self._built)
            self.status.records = self.model.records
            self._restored = True
        partitions = [TopicPartition(self.topic, span.partition) for span in planned.spans]
        consumer = AIOKafkaConsumer(
            bootstrap_servers=self.bootstrap,
            enable_auto_commit=False,
            group_id=None,
            auto_offset_reset="earliest",  # a position the log no longer holds: on from its start
            max_partition_fetch_bytes=FETCH_BYTES,
            **client_options(),
        )
        await consumer.start()
        try:
            consumer.assign(partitions)
            for tp in partitions:
                if tp.partition in self.positions:
                    consumer.seek(tp, self.positions[tp.partition])
                else:
                    await consumer.seek_to_beginning(tp)
            self.status.error = None
            self.status.step = "reading the log"
            checked = 0.0
            while True:
                batches = await consumer.getmany(timeout_ms=500, max_records=2000)
                for tp, records in batches.items():
                    for record in records:
                        if self.model.needs_version(record.value) is not None:  # applied after we read the book
                            self.model.add_documents((await read_book(self.bootstrap, self.app_id)).documents())
                        self.model.feed(record.value, record.offset, tp.partition, record.key)
                        self.positions[tp.partition] = record.offset + 1
                        self.status.records += 1
                    await asyncio.sleep(0)  # a long catch-up must not starve the web server
                if isinstance(self.model, LiveConsole):
                    self.model.checkpoint()
                if time.monotonic() - checked >= END_OFFSETS_EVERY_S or not batches:
                    checked = time.monotonic()
                    await self._measure(consumer, partitions)
        finally:
            await consumer.stop()

    def _built(self, partition: int, records: int) -> None:
        """Progress of a first build (from the pool's drain thread): the status line counts it."""
        self.status.records += records
        if self.status.behind is not None:
            self.status.behind = max(0, self.status.behind - records)

    async def _measure(self, consumer: AIOKafkaConsumer, partitions: Sequence[TopicPartition]) -> None:
        ends = await consumer.end_offsets(list(partitions))
        behind = sum(max(0, end - self.positions.get(tp.partition, 0)) for tp, end in ends.items())
        self.status.behind = behind
        self.status.caught_up = behind == 0
        if isinstance(self.model, LiveConsole):
            self.model.caught_up = self.status.caught_up


class Sources:
    """The status parts that come from outside the log, refreshed on demand at most every `ttl_s`."""

    def __init__(
        self,
        tail: LogTail,
        bootstrap: str,
        app_id: str,
        worker_urls: Sequence[str] = (),
        *,
        ttl_s: float = 2.0,
        http: httpx.AsyncClient | None = None,
    ) -> None:
        self.tail = tail
        self.bootstrap = bootstrap
        self.group = app_id  # the workers' consumer group is the Faust app id
        self.topics = [f"{app_id}.{name}" for name in ("conversations", "effects", "sweeps")]
        self.worker_urls = [url.rstrip("/") for url in worker_urls]
        self.ttl_s = ttl_s
        self.http = http or httpx.AsyncClient(timeout=2.0, follow_redirects=False)
        self._lag: dict[str, int] | None = None
        self._lag_error: str | None = None
        self._workers: list[WorkerStuck] = [WorkerStuck(url) for url in self.worker_urls]
        self._refreshed = -1e9
        self._task: asyncio.Task[None] | None = None
        self._admin: AIOKafkaAdminClient | None = None
        self._consumer: AIOKafkaConsumer | None = None

    def status(self) -> ConsoleStatus:
        return ConsoleStatus(
            tail=self.tail.status, group=self.group, lag=self._lag, lag_error=self._lag_error, workers=self._workers
        )

    async def refresh(self) -> ConsoleStatus:
        """The status as known now; when it is older than `ttl_s`, a refresh starts in the background (the next
        answer has it), so a page never waits for Kafka or for a worker that does not answer."""
        if self._task is None and time.monotonic() - self._refreshed >= self.ttl_s:
            self._task = asyncio.create_task(self._refresh(), name="console-sources")
        return self.status()

    async def _refresh(self) -> None:
        try:
            await asyncio.gather(self._measure_lag(), self._read_workers())
        finally:
            self._refreshed = time.monotonic()
            self._task = None

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        await self._drop_kafka()
        await self.http.aclose()

    async def _measure_lag(self) -> None:
        try:
            async with asyncio.timeout(5.0):
                self._lag = await self._group_lag()
            self._lag_error = None
        except Exception as exc:
            self._lag, self._lag_error = None, f"lag not available: {type(exc).__name__}"
            await self._drop_kafka()

    async def _group_lag(self) -> dict[str, int]:
        if self._admin is None or self._consumer is None:
            self._admin = AIOKafkaAdminClient(bootstrap_servers=self.bootstrap, **client_options())
            await self._admin.start()
            self._consumer = AIOKafkaConsumer(
                bootstrap_servers=self.bootstrap, enable_auto_commit=False, **client_options()
            )
            await self._consumer.start()
        described = await self._admin.describe_topics(self.topics)
        partitions = [
            TopicPartition(d["topic"], p["partition"])
            for d in described
            if d["error_code"] == 0
            for p in d["partitions"]
        ]
        if not partitions:
            raise LookupError("no topics yet")
        committed = await self._admin.list_consumer_group_offsets(self.group, partitions=partitions)
        ends = await self._consumer.end_offsets(partitions)
        lag: dict[str, int] = {}
        for tp in partitions:
            meta = committed.get(tp)
            done = meta.offset if meta is not None and meta.offset >= 0 else 0
            short = tp.topic.removeprefix(f"{self.group}.")
            lag[short] = lag.get(short, 0) + max(0, ends.get(tp, 0) - done)
        return lag

    async def _drop_kafka(self) -> None:
        admin, consumer = self._admin, self._consumer
        self._admin = self._consumer = None
        if admin is not None:
            with contextlib.suppress(Exception):
                await admin.close()
        if consumer is not None:
            with contextlib.suppress(Exception):
                await consumer.stop()

    async def _read_workers(self) -> None:
        self._workers = list(await asyncio.gather(*(self._read_worker(url) for url in self.worker_urls)))

    async def _read_worker(self, url: str) -> WorkerStuck:
        try:
            response = await self.http.get(f"{url}/stuck")
            response.raise_for_status()
            answer = response.json()
            stuck = answer.get("stuck", {})
            if not isinstance(stuck, dict):
                raise ValueError("unexpected /stuck body")
            raw = answer.get("throttle")
            throttle = None
            if isinstance(raw, dict):
                throttle = {str(k): float(v) for k, v in raw.items() if isinstance(v, int | float)}
            return WorkerStuck(url, {str(k): str(v) for k, v in stuck.items()}, throttle=throttle)
        except (httpx.HTTPError, ValueError) as exc:
            return WorkerStuck(url, error=f"/stuck not readable: {type(exc).__name__}")
