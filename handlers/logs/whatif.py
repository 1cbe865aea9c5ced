"""The effectful part of `whatif`: reading the event log, and (`--ask`) System One with an answer cache.

Nothing here talks to Chatwoot. The log is read partition by partition without a consumer group
(handlers/logs/reader.py), so a what-if never disturbs the workers, and each partition's turns are compared as they
end (projections/whatif/tally.py): memory holds one partition's states and the report's counts, never the topic.
System One gets only the candidate's new questions, at most `concurrency` at a time; each answer is kept in
`<cache>/<digest>.json`, the digest being the SHA-256 of the request body (the redacted input, the questions and
the model), so a second run asks nothing. The cache holds System One's answers only (choices and probabilities),
never the input text.
"""

from __future__ import annotations

import asyncio
import functools
import json
import os
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from handlers.clients.systemone import SystemOneClient
from handlers.logs.audit import starts
from handlers.logs.reader import Plan, Progress, Records, Share, key_shares, plan, read
from handlers.logs.shards import jobs_for, run_sharded
from handlers.privacy.reader_keys import read_reader_keys
from projections.jev import JevError
from projections.whatif.record import TurnRecorder
from projections.whatif.replay import Question
from projections.whatif.tally import Selection, TurnTally
from schemas.config import RouterConfig
from schemas.configs import ConfigBook
from schemas.keys import partition_for
from schemas.records import MARKER_KEY

DEFAULT_CACHE_DIR = Path(".whatif-cache")
DEFAULT_CONCURRENCY = 4
MARKER = MARKER_KEY.encode()
CLOCK_SKEW_MS = 10 * 60_000  # a record's Kafka timestamp may trail its event time (other hosts' clocks): margin


@dataclass(frozen=True)
class WhatifJob:
    """What every partition's what-if needs (picklable: it goes to the pool's processes)."""

    bootstrap: str
    topic: str
    book: ConfigBook
    candidate: RouterConfig
    selection: Selection
    answers: dict[str, object] = field(default_factory=dict)
    window: bool = False  # --since/--from: read only the window's conversations (see `whatif_partition`)


async def whatif_partition(job: WhatifJob, partition: int, progress: Progress | None = None) -> TurnTally:
    """Re-decide the selected turns of one partition as they end; the tally keeps the report's counts and rows.

    A long partition is folded in several passes, each over a share of its keys (`log_reader.key_shares`), so
    memory holds about the same number of states however long the history is. With a time window (`--since`,
    `--from`) the partition is first read from the window's start (found by timestamp, `offsets_for_times`, less
    `CLOCK_SKEW_MS`) for the keys it holds, records not decoded; then only those conversations are folded, since a
    turn's replay needs its conversation's whole state before it (reply ledger, memos): from the earliest first
    record among them when the live table records every one's (`ConversationState.first_offset`), else from the
    partition's start. Other conversations' records are not folded; only their agents lists are read (the what-if
    answers a candidate's agents list with the last one recorded for the account in the part of the partition
    read).
    """
    tally = TurnTally(job.candidate, job.answers, job.selection)
    # sealed inputs (issue 32) open with this process's KEK; this partition's keys are in the same partition number
    app_id = job.topic.removesuffix(".conversations")
    tally.opener = (await read_reader_keys(job.bootstrap, app_id, partitions=[partition])).plain_input
    keys: set[bytes] | None = None
    if job.selection.key is not None:
        keys = {job.selection.key.encode(), MARKER}
    elif job.window and job.selection.from_ms is not None:
        keys = await window_keys(job.bootstrap, job.topic, partition, job.selection.from_ms - CLOCK_SKEW_MS)
        if keys == {MARKER}:
            return tally
    planned = await plan(job.bootstrap, job.topic, partitions=[partition])
    version: str | None = None
    if keys is not None:  # one conversation, or the window's: fold from their first record when recorded
        wanted = [k.decode() for k in keys if k != MARKER]
        known = await starts(job.bootstrap, job.topic.removesuffix(".conversations"), partition, wanted)
        if known and len(known) == len(wanted):
            first = min(known.values(), key=lambda s: s.offset)
            if first.offset > planned.spans[0].start:
                planned = planned.starting({partition: first.offset})
                version = first.version
    shares: list[Share | None] = [None] if keys is not None else key_shares(planned.records)
    for share in shares:
        recorder = TurnRecorder(job.book, on_turn=tally)
        if version is not None:
            recorder.scan.resume(partition, version)

        def fold(p: int, records: Records, share: Share | None = share, recorder: TurnRecorder = recorder) -> None:
            for record in records:
                if (share is None or share(record.key)) and (keys is None or record.key in keys):
                    recorder.feed(record.value, record.offset, p)
                else:
                    recorder.observe(record.value)

        await read(job.bootstrap, planned.spans, fold, progress=progress)
        tally.undecided += recorder.undecided
        del recorder, fold  # this pass's states go before the next pass folds its own
    return tally


async def window_keys(bootstrap: str, topic: str, partition: int, from_ms: int) -> set[bytes]:
    """The keys of the records of `partition` from the first one stamped at or after `from_ms` (and the markers')."""
    keys = {MARKER}

    def keep(p: int, records: Records) -> None:
        keys.update(r.key for r in records if r.key is not None)

    await read(
        bootstrap,
        (await plan(bootstrap, topic, partitions=[partition], from_ms=from_ms, look_at_heads=False)).spans,
        keep,
    )
    return keys


class AnswerCache:
    """System One's answers by question digest, one JSON file each, written atomically."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory

    def _path(self, digest: str) -> Path:
        if not digest.isalnum():
            raise ValueError("a question digest is hexadecimal")
        return self.directory / f"{digest}.json"

    def get(self, digest: str) -> object | None:
        path = self._path(digest)
        try:
            stored = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return None
        return stored.get("answer") if isinstance(stored, dict) else None

    def put(self, digest: str, answer: object) -> None:
        self.directory.mkdir(parents=True, exist_ok=True)
        path = self._path(digest)
        scratch = path.with_suffix(f".{os.getpid()}.tmp")
        scratch.write_text(json.dumps({"answer": answer}, ensure_ascii=False), encoding="utf-8")
        scratch.replace(path)


@dataclass
class Asked:
    """What `ask` got: answers by digest, and how many came from System One, from the cache, or failed."""

    answers: dict[str, object] = field(default_factory=dict)
    asked: int = 0
    cached: int = 0
    failed: dict[str, str] = field(default_factory=dict)


async def ask(
    questions: Iterable[Question],
    client: SystemOneClient,
    cache: AnswerCache,
    *,
    concurrency: int = DEFAULT_CONCURRENCY,
) -> Asked:
    """Put each question not in the cache to System One, `concurrency` at a time; cache what it answers."""
    result = Asked()
    gate = asyncio.Semaphore(concurrency)

    async def one(question: Question) -> None:
        cached = cache.get(question.digest)
        if cached is not None:
            result.answers[question.digest] = cached
            result.cached += 1
            return
        async with gate:
            try:
                answer = await client.post(question.body)
            except JevError as exc:  # the message names the HTTP status or the failure class, never a body
                result.failed[question.digest] = str(exc)
                return
        result.asked += 1
        cache.put(question.digest, answer)
        result.answers[question.digest] = answer

    await asyncio.gather(*(one(q) for q in {q.digest: q for q in questions if q.askable}.values()))
    return result


async def plan_for(job: WhatifJob) -> Plan:
    """The partitions a what-if reads: every one, or only the selected conversation's."""
    planned = await plan(job.bootstrap, job.topic)
    if job.selection.key is not None:
        planned = planned.only([partition_for(job.selection.key, len(planned.spans))])
    return planned


def work_of(job: WhatifJob, planned: Plan) -> dict[int, int]:
    """Records each planned partition's fold reads, for progress: a partition is folded once per share of its keys
    (`key_shares`), or once for one conversation."""
    one_pass = job.selection.key is not None
    return {s.partition: s.size * (1 if one_pass else len(key_shares(s.size))) for s in planned.spans}


def replay(job: WhatifJob, planned: Plan, jobs: int | None, progress: Progress | None = None) -> TurnTally:
    """Every planned partition's tally (`jobs` processes, default the cores; one for one conversation), merged in
    partition order: what `whatif` and the console's what-if page report."""
    sizes = {span.partition: span.size for span in planned.spans}
    processes = 1 if job.selection.key is not None else jobs_for(planned.records, jobs)
    parts = run_sharded(functools.partial(whatif_partition, job), sizes, processes, progress)
    tally = TurnTally(job.candidate, job.answers, job.selection)
    for partition in sorted(parts):
        tally.merge(parts[partition])
    return tally
