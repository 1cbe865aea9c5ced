"""The console process's read model: the overview of the whole log in bounded memory, timelines on demand.

The in-memory `ConsoleModel` keeps every conversation's timeline; over a year of history that does not fit and
takes minutes to build. `LiveConsole` instead folds the log into the overview only (`OverviewFold`, each
conversation's state in the on-disk `Snapshot`), so its memory stays flat and a restart starts from the snapshot
instead of offset 0; and it builds a conversation's timeline when a page asks for it, by reading only that
conversation's partition from its first record (the start its state records, as `audit --conversation` does).
The last timelines asked for are kept and follow the log live, fed by the tail like the overview.

Nothing a page asks waits for the log: the console serves before it has read the configuration versions (the
overview is empty until then, `opened`), and a conversation's timeline is read by one task however many pages ask
for it (`timeline`), which the JSON API waits for only briefly (handlers/console/server.py).

A first start (no snapshot) on a long log must fold all of it before the overview's history counts (turns,
outcomes, reasons, replies) are complete. Meanwhile `seed` shows what the workers' live states tell at once: the
conversation count, from the last value per key of `<app>-conversation_state-changelog` (read raw, nothing
decoded), and a conversation's page starts from the first offset its live state records (`live_state`, read
backwards from the changelog's end) instead of its partition's head. Without a live table (no worker ever ran) the
overview counts the conversations, and their endings, that the build has committed to the snapshot so far. The
status line says the console is catching up until the build is done; the build's counts then replace these.
"""

from __future__ import annotations

import asyncio
import functools
import time
from collections import Counter, OrderedDict
from dataclasses import dataclass, field

from handlers.console.build import BuildJob, Built, build_partition
from handlers.console.snapshot import Snapshot, fits
from handlers.kafka.topics import changelog_topic
from handlers.logs.audit import STATE_TABLE, live_state, start_of
from handlers.logs.reader import Progress, Records, Span, plan, read
from handlers.logs.shards import default_jobs, run_sharded
from handlers.privacy.reader_keys import read_reader_keys
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
SO_FAR_EVERY_S = 1.0  # how often the overview counts what a first build has committed so far


@dataclass
class LiveConsole:
    """The overview (`overview`), timelines on demand (`timeline`) and the tail's interface (`open`, `feed`, ...).

    Created without the applied configuration versions, it folds nothing until `open` gives them (the tail reads
    them before the log; a configuration file is used only for a log without any)."""

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
    building: bool = False  # a first build runs: the overview shows what it has folded so far
    jobs: int = field(default_factory=default_jobs)  # processes for a first build (handlers/console/build.py)

    def __post_init__(self) -> None:
        self._fold: OverviewFold | None = None
        self.timelines: OrderedDict[str, tuple[int, ConsoleModel]] = OrderedDict()
        self._reading: dict[str, asyncio.Task[ConversationTimeline | None]] = {}
        self._opened = asyncio.Event()
        self._so_far: tuple[int, Counter[str]] = (0, Counter())
        self._so_far_at = -1e9
        self._committed = time.monotonic()
        if len(self.book):  # the versions are known: fold under them (else the tail reads them first: `open`)
            self.open(self.book)

    def open(self, book: ConfigBook) -> None:
        """Fold under `book` (the applied configuration versions) from now on."""
        self.book = book
        self._fold = OverviewFold(self.snapshot, book=book, config=self.config, retry_base_ms=self.retry_base_ms)
        self._opened.set()

    @property
    def opened(self) -> bool:
        return self._fold is not None

    @property
    def fold(self) -> OverviewFold:
        """The overview's fold (the tail's interface: only once `opened`)."""
        if self._fold is None:
            raise RuntimeError("the console has no configuration to fold under yet")
        return self._fold

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
        self.building = True
        try:
            built: dict[int, Built] = await asyncio.to_thread(run_sharded, task, sizes, self.jobs, progress)
        finally:
            self.building = False
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
        if self._fold is None:
            return  # nothing folded yet
        due = time.monotonic() - self._committed >= COMMIT_EVERY_S or self.snapshot.pending >= COMMIT_EVERY
        if force or (due and self.snapshot.pending):
            versions = {p: v for p in self.positions if (v := self.fold.scan.version(p)) is not None}
            self.snapshot.commit(self.fold.counts, dict(self.positions), versions)
            self._committed = time.monotonic()

    # --- the pages' interface ---

    @property
    def counts(self) -> OverviewCounts:
        """The overview's counts; during a first build, the conversations and endings it has folded so far (the
        conversations of the live table instead, when there is one: `seed`). The history's counts (turns,
        outcomes, reasons, replies) come with the build's end, never invented before."""
        if self._fold is None:
            return OverviewCounts()
        if not self.building:
            return self._fold.counts
        if time.monotonic() - self._so_far_at >= SO_FAR_EVERY_S:
            self._so_far, self._so_far_at = self.snapshot.folded_so_far(), time.monotonic()
        folded, endings = self._so_far
        conversations = self._fold.counts.conversations if self.seeded else folded
        return OverviewCounts(conversations=conversations, ending_counts=endings)

    @property
    def records(self) -> int:
        return self.counts.records

    @property
    def undecodable(self) -> int:
        return self.counts.undecodable

    def overview(self, now_ms: int, *, hours: int = 24, recent: int = 20) -> Overview:
        return self.counts.overview(now_ms, hours=hours, recent=recent)

    async def timeline(self, key: str) -> ConversationTimeline | None:
        """The conversation's timeline, read from its partition when it is not kept already. One read per
        conversation at a time: a page that stops waiting (the API's answer while it reads) leaves it running, and
        the next ask finds the timeline kept."""
        kept = self.timelines.get(key)
        if kept is not None:
            self.timelines.move_to_end(key)
            return kept[1].timeline(key)
        task = self._reading.get(key)
        if task is None:
            task = asyncio.create_task(self._read_timeline(key), name=f"console-timeline-{key}")
            self._reading[key] = task
            task.add_done_callback(functools.partial(self._read, key))
        return await asyncio.shield(task)

    def _read(self, key: str, task: asyncio.Task[ConversationTimeline | None]) -> None:
        """A timeline's read ended: forget the task (a failed read is tried again by the next ask)."""
        self._reading.pop(key, None)
        if not task.cancelled():
            task.exception()  # retrieved here: nobody may be waiting for it any more

    async def _read_timeline(self, key: str) -> ConversationTimeline | None:
        await self._opened.wait()  # the configuration versions first: nothing can be folded without them
        summary = self.fold.store.get(key)
        if summary is None and self.caught_up:
            return None  # no record of it in the log (while the tail catches up, the log itself is read)
        planned = await plan(self.bootstrap, self.topic, look_at_heads=False)
        partition = partition_for(key, len(planned.spans))
        span = planned.span(partition)
        # its data key, from the partition of the same number of `<app>.keys`: opens its inputs with the KEK
        keys = await read_reader_keys(self.bootstrap, self.app_id, only={key}, partitions=[partition])
        model = ConsoleModel(
            self.config, retry_base_ms=self.retry_base_ms, book=self.book, only_key=key, opener=keys.open_decide
        )
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
