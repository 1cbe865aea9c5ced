"""The console's snapshot: what it folded of the log, kept on local disk so a restart is instant (DESIGN §11).

Folding a year of history takes minutes, and the overview needs all of it. The console therefore keeps, in one
SQLite file, each conversation's summary (its fold state and ending: `projections/console/overview.py`), the
overview's counts, and per partition the next offset to read and the configuration version in force there. On
start it loads the counts and positions and reads only what was written since; without a snapshot, or with one
that does not fit the topic any more (fewer partitions, a position past the end: the topic was recreated), it
starts over from the log start and builds a new one.

States are written in batches (`commit`, one transaction with the counts and positions, so they always agree);
reads go through a bounded cache of decoded summaries, so memory stays flat however many conversations exist.
The file holds the same redacted data as the log, never more.
"""

from __future__ import annotations

import json
import sqlite3
from collections import Counter, OrderedDict
from dataclasses import dataclass
from pathlib import Path

from handlers.logs.shards import FORK_LOCK
from projections.console.overview import ConversationSummary, Ending, OverviewCounts
from schemas.state import ConversationState

FORMAT = 1  # bumped when what is stored changes: an older snapshot is rebuilt
CACHED = 3_000  # decoded summaries kept in memory: the conversations in flight, not all of them


@dataclass(frozen=True)
class Loaded:
    """A snapshot's counts, where each partition was read up to, and each partition's version there."""

    counts: OverviewCounts
    positions: dict[int, int]
    versions: dict[int, str]


class Snapshot:
    """A `SummaryStore` backed by a SQLite file, with the counts and positions committed alongside."""

    def __init__(self, path: Path, topic: str) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        self.topic = topic
        with FORK_LOCK:  # every use of SQLite here: a build's processes are never forked in the middle of one
            self.db = sqlite3.connect(path, timeout=60)  # a first build writes from several processes at once
            self.db.execute("PRAGMA journal_mode=WAL")
            self.db.execute("PRAGMA synchronous=NORMAL")
            self.db.execute(
                "CREATE TABLE IF NOT EXISTS summaries (key TEXT PRIMARY KEY, partition INTEGER, state TEXT, "
                "ending TEXT, loud INTEGER)"
            )
            self.db.execute("CREATE TABLE IF NOT EXISTS meta (name TEXT PRIMARY KEY, value TEXT)")
            self.db.commit()
        self._cache: OrderedDict[str, ConversationSummary] = OrderedDict()
        self._dirty: dict[str, tuple[int, ConversationSummary]] = {}

    def close(self) -> None:
        with FORK_LOCK:
            self.db.close()

    # --- SummaryStore ---

    def get(self, key: str) -> ConversationSummary | None:
        dirty = self._dirty.get(key)
        if dirty is not None:
            return dirty[1]
        cached = self._cache.get(key)
        if cached is not None:
            self._cache.move_to_end(key)
            return cached
        with FORK_LOCK:
            row = self.db.execute("SELECT state, ending, loud FROM summaries WHERE key = ?", (key,)).fetchone()
        if row is None:
            return None
        summary = ConversationSummary(ConversationState.model_validate_json(row[0]), Ending(row[1], bool(row[2])))
        self._remember(key, summary)
        return summary

    def put(self, key: str, partition: int, summary: ConversationSummary) -> None:
        self._dirty[key] = (partition, summary)
        self._remember(key, summary)

    def _remember(self, key: str, summary: ConversationSummary) -> None:
        self._cache[key] = summary
        self._cache.move_to_end(key)
        while len(self._cache) > CACHED:
            self._cache.popitem(last=False)

    @property
    def pending(self) -> int:
        return len(self._dirty)

    # --- the snapshot as a whole ---

    def commit_states(self) -> None:
        """Write the changed summaries only (a build process of one partition; the parent commits the rest)."""
        with FORK_LOCK, self.db:
            self.db.executemany("INSERT OR REPLACE INTO summaries VALUES (?, ?, ?, ?, ?)", self._rows())
        self._dirty.clear()

    def _rows(self) -> list[tuple[str, int, str, str | None, int]]:
        return [
            (key, partition, s.state.model_dump_json(), s.ending.result, int(s.ending.loud))
            for key, (partition, s) in self._dirty.items()
        ]

    def commit(self, counts: OverviewCounts, positions: dict[int, int], versions: dict[int, str]) -> None:
        """Write the changed summaries, the counts and the positions in one transaction."""
        rows = self._rows()
        meta = {
            "format": FORMAT,
            "topic": self.topic,
            "counts": counts.to_json(),
            "positions": {str(p): o for p, o in positions.items()},
            "versions": {str(p): v for p, v in versions.items()},
        }
        with FORK_LOCK, self.db:
            self.db.executemany("INSERT OR REPLACE INTO summaries VALUES (?, ?, ?, ?, ?)", rows)
            self.db.executemany(
                "INSERT OR REPLACE INTO meta VALUES (?, ?)", [(name, json.dumps(v)) for name, v in meta.items()]
            )
        self._dirty.clear()

    def load(self) -> Loaded | None:
        """The snapshot's counts and positions; None when there is none (or it is of another format or topic)."""
        with FORK_LOCK:
            rows = self.db.execute("SELECT name, value FROM meta").fetchall()
        meta = {name: json.loads(value) for name, value in rows}
        if meta.get("format") != FORMAT or meta.get("topic") != self.topic or "counts" not in meta:
            return None
        return Loaded(
            OverviewCounts.from_json(meta["counts"]),
            {int(p): o for p, o in meta["positions"].items()},
            {int(p): v for p, v in meta["versions"].items()},
        )

    def folded_so_far(self) -> tuple[int, Counter[str]]:
        """The conversations whose summaries are committed, and their endings by result (what a first build has
        folded so far: its processes commit as they go)."""
        with FORK_LOCK:
            rows = self.db.execute("SELECT ending, COUNT(*) FROM summaries GROUP BY ending").fetchall()
        return sum(n for _, n in rows), Counter({ending: n for ending, n in rows if ending is not None})

    def reset(self) -> None:
        """Forget everything (the snapshot does not fit the topic): the console folds the log again."""
        with FORK_LOCK, self.db:
            self.db.execute("DELETE FROM summaries")
            self.db.execute("DELETE FROM meta")
        self._cache.clear()
        self._dirty.clear()


def fits(loaded: Loaded, starts: dict[int, int], ends: dict[int, int]) -> bool:
    """Whether a snapshot can be continued on the topic as it is now: the same partitions, no position past the
    end (a recreated topic). A position below the log start is fine: those records are gone, and the history is
    then partial (which the console shows)."""
    if set(loaded.positions) - set(ends):
        return False
    return all(position <= ends[p] for p, position in loaded.positions.items())


def snapshot_path(directory: Path, app_id: str) -> Path:
    return directory / f"{app_id}.console.sqlite"
