"""The console process's read model: the overview of the whole log in bounded memory, timelines on demand.

The in-memory `ConsoleModel` keeps every conversation's timeline; over a year of history that does not fit and
takes minutes to build. `LiveConsole` instead folds the log into the overview only (`OverviewFold`, each
conversation's state in the on-disk `Snapshot`), so its memory stays flat and a restart starts from the snapshot
instead of offset 0; and it builds a conversation's timeline when a page asks for it, by reading only that
conversation's partition from its first record (the start its state records, as `audit --conversation` does).
The last timelines asked for are kept and follow the log live, fed by the tail like the overview.

A first start (no snapshot) on a long log must fold all of it before the overview's history counts (turns,
outcomes, reasons, replies) are complete. Meanwhile `seed` shows what the workers' live states tell at once: the
conversation count, from the last value per key of `<app>-conversation_state-changelog` (read raw, nothing
decoded), and a conversation's page starts from the first offset its live state records (`live_state`, read
backwards from the changelog's end) instead of its partition's head. The status line says the log is still being
replayed until the build is done; the build's counts then replace the seed's.
"""

from __future__ import annotations

import asyncio
import functools
import time
from collections import OrderedDict
from dataclasses import dataclass, field

from handlers.console.build import BuildJob, Built, build_partition
from handlers.console.snapshot import Snapshot, fits
from handlers.kafka.topics import changelog_topic
from handlers.logs.audit import STATE_TABLE, live_state, start_of
from handlers.logs.reader import Progress, Records, Span, plan, read
from handlers.logs.shards import default_jobs, run_sharded
from projections.console.model import ConsoleModel, ConversationTimeline
from projections.console.overview import Overview, OverviewCounts, OverviewFold
from schemas.config import RouterConfig
from schemas.configs import ConfigBook, ConfigDocument
from schemas.keys import partition_for
from schemas.records import MARKER_KEY, parse_marker

MARKER = MARKER_KEY.encode()
TIMELINES = 32  # conversations whose timelines are kept (and followed live)
COMMIT_EVERY_S = 2.0
COMMIT_EVERY = 5_000  # changed conversations (held in memory until committed)


@dataclass
class LiveConsole:
    """The overview (`overview`), timelines on demand (`timeline`) and the tail's interface (`feed`, ...)."""

    bootstrap: str
    app_id: str
    book: ConfigBook
    snapshot: Snapshot
    config: RouterConfig | None = None
    retry_base_ms: int = 5000
    positions: dict[int, int] = field(default_factory=dict)  # partition -> next offset (the tail updates it)
    partitions: int = 0
    version: int = 0
    restored: bool = False
    caught_up: bool = False  # the tail has read every partition to its end (set by the tail)
    seeded: bool = False  # the overview's conversations come from the workers' live states (a build is running)
    jobs: int = field(default_factory=default_jobs)  # processes for a first build (handlers/console/build.py)

    def __post_init__(self) -> None:
        self.fold = OverviewFold(self.snapshot, book=self.book, config=self.config, retry_base_ms=self.retry_base_ms)
        self.timelines: OrderedDict[str, tuple[int, ConsoleModel]] = OrderedDict()
        self._committed = time.monotonic()

    @property
    def topic(self) -> str:
        return f"{self.app_id}.conversations"

    # --- the tail's interface ---

    def restore(self, starts: dict[int, int], ends: dict[int, int]) -> None:
        """Continue from the snapshot when it fits the topic as it is now; else start over (and say so in the log)."""
        self.partitions = len(ends)
        loaded = self.snapshot.load()
        if loaded is not None and fits(loaded, starts, ends):
            self.fold.counts = loaded.counts
            for partition, version in loaded.versions.items():
                self.fold.scan.resume(partition, version)
            self.positions.update(loaded.positions)
            self.restored = True
        elif loaded is not None:
            self.snapshot.reset()

    async def seed(self) -> int:
        """Count the conversations the workers' live table holds (its changelog's last value per key, tombstones
        dropped; one partition's keys at a time), so the overview has them while the first build runs. Returns the
        count; 0 when there is no changelog (no worker ran yet: the build alone counts)."""
        topic = changelog_topic(self.app_id, STATE_TABLE)
        try:
            planned = await plan(self.bootstrap, topic, look_at_heads=False)
        except LookupError:
            return 0
        live = 0
        for span in planned.spans:
            last: dict[bytes | None, bool] = {}  # key -> its last value is a state (not a tombstone)
            await read(self.bootstrap, [span], functools.partial(_keep_last, last))
            live += sum(last.values())
        if live:
            self.fold.counts = OverviewCounts(conversations=live)
            self.seeded = True
        return live

    async def build(self, sizes: dict[int, int], progress: Progress | None = None) -> None:
        """Fold the whole log into the snapshot one partition per process (a first start on a long log), then
        continue from where each partition's build stopped."""
        self.snapshot.reset()  # what an interrupted build left is not counted: start clean
        job = BuildJob(self.bootstrap, self.topic, self.snapshot.path, self.book, self.config, self.retry_base_ms)
        task = functools.partial(build_partition, job)
        built: dict[int, Built] = await asyncio.to_thread(run_sharded, task, sizes, self.jobs, progress)
        counts = OverviewCounts()
        for partition in sorted(built):
            counts.merge(built[partition].counts)
            self.positions[partition] = built[partition].position
            self.fold.scan.resume(partition, built[partition].version)
        self.fold.counts = counts
        self.seeded = False
        self.checkpoint(force=True)

    def needs_version(self, value: bytes | None) -> str | None:
        marker = parse_marker(value)
        return marker.version if marker is not None and marker.version not in self.book else None

    def add_documents(self, documents: list[ConfigDocument]) -> None:
        self.fold.scan.add_documents(documents)

    def feed(self, value: bytes | None, offset: int, partition: int = 0, key: bytes | None = None) -> None:
        self.version += 1
        self.fold.feed(value, offset, partition)
        for cached_key, (at, model) in self.timelines.items():
            if at == partition and (key == MARKER or key == cached_key.encode()):
                model.feed(value, offset, partition, key)

    def checkpoint(self, *, force: bool = False) -> None:
        """Commit the snapshot every `COMMIT_EVERY_S` (or `COMMIT_EVERY` changed conversations), or now."""
        due = time.monotonic() - self._committed >= COMMIT_EVERY_S or self.snapshot.pending >= COMMIT_EVERY
        if force or (due and self.snapshot.pending):
            versions = {p: v for p in self.positions if (v := self.fold.scan.version(p)) is not None}
            self.snapshot.commit(self.fold.counts, dict(self.positions), versions)
            self._committed = time.monotonic()

    # --- the pages' interface ---

    @property
    def records(self) -> int:
        return self.fold.counts.records

    @property
    def undecodable(self) -> int:
        return self.fold.counts.undecodable

    def overview(self, now_ms: int, *, hours: int = 24, recent: int = 20) -> Overview:
        return self.fold.counts.overview(now_ms, hours=hours, recent=recent)

    async def timeline(self, key: str) -> ConversationTimeline | None:
        """The conversation's timeline, read from its partition when it is not kept already."""
        kept = self.timelines.get(key)
        if kept is not None:
            self.timelines.move_to_end(key)
            return kept[1].timeline(key)
        summary = self.fold.store.get(key)
        if summary is None and self.caught_up:
            return None  # no record of it in the log (while the tail catches up, the log itself is read)
        planned = await plan(self.bootstrap, self.topic, look_at_heads=False)
        partition = partition_for(key, len(planned.spans))
        span = planned.span(partition)
        model = ConsoleModel(self.config, retry_base_ms=self.retry_base_ms, book=self.book, only_key=key)
        start = start_of(summary.state) if summary is not None else None
        if summary is None and not self.caught_up:  # a first build is running: the live table knows the start
            start = start_of(await live_state(self.bootstrap, self.app_id, partition, key))
        if start is not None and start.offset > span.start:
            span = Span(span.topic, partition, start.offset, span.end)
            model.scan.resume(partition, start.version)

        def apply(p: int, records: Records) -> None:
            for record in records:
                model.feed(record.value, record.offset, p, record.key)

        wanted = {key.encode(), MARKER}
        await read(self.bootstrap, [span], apply, keys=wanted)
        end = span.end
        while self.positions.get(partition, 0) > end:  # the tail read on meanwhile: catch up with it
            target = self.positions[partition]
            await read(self.bootstrap, [Span(span.topic, partition, end, target)], apply, keys=wanted)
            end = target
        self.timelines[key] = (partition, model)  # no await since the check: the tail feeds it from here on
        while len(self.timelines) > TIMELINES:
            self.timelines.popitem(last=False)
        return model.timeline(key)


def _keep_last(last: dict[bytes | None, bool], partition: int, records: Records) -> None:
    for record in records:
        last[record.key] = record.value is not None
