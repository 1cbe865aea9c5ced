"""The reads behind `audit`: one conversation's records, and a partition's replayed and live states (DESIGN §8).

- `read_conversation`: only the conversation's own partition (the project's partitioner), from its first record
  on when the live table says where that is (`ConversationState.first_offset`), else from the log start; the
  other conversations' records are skipped by key before anything decodes them.
- `verify_partition`: one partition folded into states in a scratch dictionary and compared with the live table
  of the same partition (its changelog, last value per key); `audit --verify` runs it for every partition,
  `--jobs` at a time (handlers/logs/shards.py), so only one partition's states are in memory per process.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Callable, Collection
from dataclasses import dataclass
from typing import Any

from handlers.kafka.topic_io import topic_partitions
from handlers.kafka.topics import changelog_topic
from handlers.logs.reader import Plan, Progress, Records, Share, key_shares, last_of, plan, read
from projections.logs.rebuild import TableBuilder
from projections.logs.scan import History, LogScan
from projections.logs.verify import Verified, diff_states
from schemas.config import RouterConfig
from schemas.configs import ConfigBook
from schemas.keys import partition_for
from schemas.records import MARKER_KEY
from schemas.state import ConversationState

STATE_TABLE = "conversation_state"
MARKER = MARKER_KEY.encode()

Feed = Callable[[bytes | None, int, int, bytes | None], object]  # (value, offset, partition, key)


def table_key(raw: bytes | None) -> str:
    """Faust writes table keys to the changelog as JSON strings; accept raw keys too."""
    text = (raw or b"").decode()
    if text.startswith('"'):
        with contextlib.suppress(ValueError):
            decoded = json.loads(text)
            if isinstance(decoded, str):
                return decoded
    return text


async def live_states(
    bootstrap: str, app_id: str, partition: int, keys: Collection[str] | None = None, share: Share | None = None
) -> dict[str, ConversationState]:
    """The live table's values in one partition, read back from its changelog (last value per key wins); only
    `keys`' when given, or only the keys in `share` (the others are skipped undecoded). Empty when the changelog
    does not exist."""
    topic = changelog_topic(app_id, STATE_TABLE)
    raw: dict[str, bytes | None] = {}
    wanted = {json.dumps(k).encode() for k in keys} | {k.encode() for k in keys} if keys is not None else None

    def keep(p: int, records: Records) -> None:
        for record in records:
            key = table_key(record.key)
            if share is None or share(key.encode()):
                raw[key] = record.value

    try:
        spans = (await plan(bootstrap, topic, partitions=[partition], look_at_heads=False)).spans
    except LookupError:
        return {}
    await read(bootstrap, spans, keep, keys=wanted)
    return {k: ConversationState.model_validate_json(v) for k, v in raw.items() if v is not None}


async def conversation_partition(bootstrap: str, topic: str, key: str) -> int:
    """The partition every writer put `key`'s records in (LookupError when the topic does not exist)."""
    return partition_for(key, len(await topic_partitions(bootstrap, topic)))


@dataclass(frozen=True)
class Start:
    """Where a conversation's records begin in its partition, and the configuration version in force there."""

    offset: int
    version: str | None


def start_of(state: ConversationState | None) -> Start | None:
    """The conversation's start as its state recorded it (None: not recorded, read from the log start)."""
    if state is None or state.first_offset < 0:
        return None
    return Start(state.first_offset, state.first_version)


async def live_state(bootstrap: str, app_id: str, partition: int, key: str) -> ConversationState | None:
    """One conversation's live value, read backwards from the end of its changelog partition (`last_of`: no scan
    of the partition's other conversations when it changed recently)."""
    topic = changelog_topic(app_id, STATE_TABLE)
    record = await last_of(bootstrap, topic, partition, {json.dumps(key).encode(), key.encode()})
    if record is None or record.value is None:
        return None
    return ConversationState.model_validate_json(record.value)


async def starts(bootstrap: str, app_id: str, partition: int, keys: Collection[str]) -> dict[str, Start]:
    """The recorded start of each of `keys` that the live table knows."""
    found = {}
    if len(keys) == 1:
        (key,) = keys
        state = await live_state(bootstrap, app_id, partition, key)
        start = start_of(state)
        return {key: start} if start is not None else {}
    for key, state in (await live_states(bootstrap, app_id, partition, keys)).items():
        start = start_of(state)
        if start is not None:
            found[key] = start
    return found


@dataclass(frozen=True)
class ConversationRead:
    """What was read of one conversation: its partition's history, and whether its own history is whole."""

    history: History
    start: Start | None

    @property
    def partial(self) -> bool:
        """Whether records of this conversation may be gone: its partition lost its head and the conversation
        began before what is kept (or where it began is not recorded). In a copy of a partial history (a head
        with records lost before the copy) any conversation may have begun in what the source had lost."""
        heads = [h for h in self.history.partial]
        if not heads:
            return False
        head = heads[0]
        return head.inherited > 0 or self.start is None or self.start.offset < head.log_start


async def read_conversation(
    bootstrap: str, app_id: str, key: str, feeds: Collection[Feed], scans: Collection[LogScan[Any]] = ()
) -> ConversationRead:
    """Feed `key`'s records (and its partition's markers) to every feed, in offset order, from the conversation's
    first record when the live table records it (each of `scans` then resumes under the version in force there),
    else from the log start."""
    topic = f"{app_id}.conversations"
    partition = await conversation_partition(bootstrap, topic, key)
    start = (await starts(bootstrap, app_id, partition, [key])).get(key)
    planned = await plan(bootstrap, topic, partitions=[partition])
    if start is not None and start.offset > planned.spans[0].start:
        planned = planned.starting({partition: start.offset})
        for scan in scans:
            scan.resume(partition, start.version)

    def apply(p: int, records: Records) -> None:
        for record in records:
            for feed in feeds:
                feed(record.value, record.offset, p, record.key)

    await read(bootstrap, planned.spans, apply, keys={key.encode(), MARKER})
    return ConversationRead(planned.history, start)


@dataclass(frozen=True)
class VerifyJob:
    """What every partition's verify needs (picklable: it goes to the pool's processes)."""

    bootstrap: str
    app_id: str
    book: ConfigBook
    legacy: tuple[RouterConfig, int] | None = None
    only_key: str | None = None


async def verify_partition(job: VerifyJob, partition: int, progress: Progress | None = None) -> Verified:
    """Fold one partition (or only `job.only_key`'s records of it, from its recorded start) into scratch states and
    compare them with the live table's; a long partition in several passes, each over a share of its keys
    (`log_reader.key_shares`), so memory holds about the same number of states however long the history is."""
    planned = await plan(job.bootstrap, f"{job.app_id}.conversations", partitions=[partition])
    if job.only_key is not None:
        return await _verify_one(job, partition, planned, progress)
    verified = Verified()
    for share in key_shares(planned.records):
        builder = TableBuilder(job.book, legacy=job.legacy)

        def fold(p: int, records: Records, share: Share | None = share, builder: TableBuilder = builder) -> None:
            for record in records:
                if share is None or share(record.key):
                    builder.feed_conversation(record.value, p, record.offset)

        await read(job.bootstrap, planned.spans, fold, progress=progress)
        live = await live_states(job.bootstrap, job.app_id, partition, share=share)
        part = Verified(conversations=len(builder.states), undecodable=builder.undecodable)
        part.add(diff_states(builder.states, live))
        verified.merge(part)
        del builder, live, fold  # this pass's states go before the next pass folds its own
    return verified


async def _verify_one(job: VerifyJob, partition: int, planned: Plan, progress: Progress | None) -> Verified:
    assert job.only_key is not None
    builder = TableBuilder(job.book, legacy=job.legacy)
    found = await live_state(job.bootstrap, job.app_id, partition, job.only_key)
    live = {job.only_key: found} if found is not None else {}
    start = start_of(found)
    if start is not None and start.offset > planned.spans[0].start:
        planned = planned.starting({partition: start.offset})
        builder.conversations.resume(partition, start.version)

    def fold(p: int, records: Records) -> None:
        for record in records:
            builder.feed_conversation(record.value, p, record.offset)

    await read(job.bootstrap, planned.spans, fold, keys={job.only_key.encode(), MARKER}, progress=progress)
    verified = Verified(conversations=len(builder.states), undecodable=builder.undecodable)
    verified.add(diff_states(builder.states, live))
    return verified


async def verify_plan(bootstrap: str, app_id: str) -> Plan:
    """The event log's plan: what a verify of everything reads, and its history."""
    return await plan(bootstrap, f"{app_id}.conversations")
