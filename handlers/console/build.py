"""The console's first start on a long log: its snapshot built one partition per process (DESIGN §11, §8).

Without a snapshot the console must fold the whole log once before its overview is complete. Partitions fold
independently, so on a log of more than `SMALL_READ` records that first fold runs one partition per process
(handlers/logs/shards.py), each writing its conversations' summaries into the same SQLite file and returning its
partition's counts, where it stopped and the version in force there; the console merges them, commits the
snapshot and tails on from there. The web server keeps answering meanwhile (a conversation's page is read from
the log), and the status line counts the records folded.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from handlers.console.snapshot import Snapshot
from handlers.logs.reader import Progress, Records, plan, read
from projections.console.overview import OverviewCounts, OverviewFold
from schemas.config import RouterConfig
from schemas.configs import ConfigBook

SMALL_READ = 50_000  # records: below this the tail folds the log itself, in the console's own process
COMMIT_EVERY = 2_000  # changed conversations written at a time (they stay in memory until then)


@dataclass(frozen=True)
class BuildJob:
    """What every partition's build needs (picklable: it goes to the pool's processes)."""

    bootstrap: str
    topic: str
    path: Path
    book: ConfigBook
    config: RouterConfig | None
    retry_base_ms: int


@dataclass(frozen=True)
class Built:
    """One partition folded: its counts, the next offset to read and the version in force there."""

    counts: OverviewCounts
    position: int
    version: str | None


async def build_partition(job: BuildJob, partition: int, progress: Progress | None = None) -> Built:
    snapshot = Snapshot(job.path, job.topic)
    try:
        fold = OverviewFold(snapshot, book=job.book, config=job.config, retry_base_ms=job.retry_base_ms)
        span = (await plan(job.bootstrap, job.topic, partitions=[partition], look_at_heads=False)).span(partition)

        def feed(p: int, records: Records) -> None:
            for record in records:
                fold.feed(record.value, record.offset, p)
            if snapshot.pending >= COMMIT_EVERY:
                snapshot.commit_states()

        await read(job.bootstrap, [span], feed, progress=progress)
        snapshot.commit_states()
        return Built(fold.counts, span.end, fold.scan.version(partition))
    finally:
        snapshot.close()
