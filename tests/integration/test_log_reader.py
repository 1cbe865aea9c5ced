"""The one reader of the event log on a real broker (DESIGN §8 "Readers at scale", issue 26 item 2).

A log whose head was deleted (`deleteRecords`, as retention does) says so in every reader: `replay state` refuses
(exit 2, the partitions and how many records are gone) unless `--accept-partial-history`; `audit`, `audit
--verify` and `whatif` print that the history is partial and from when. A conversation is read from its first
record in its own partition once the table records where that is; a time window is found by timestamp.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import time
from collections import Counter
from pathlib import Path

import pytest
from aiokafka import AIOKafkaProducer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.admin.records_to_delete import RecordsToDelete

from handlers.console.live import LiveConsole
from handlers.console.snapshot import Snapshot
from handlers.console.sources import LogTail
from handlers.kafka.config_store import apply
from handlers.kafka.topics import ensure_app_topics
from handlers.logs.audit import VerifyJob, read_conversation, verify_partition
from handlers.logs.reader import plan, read
from handlers.logs.state_rebuild import rebuild
from handlers.logs.whatif import CLOCK_SKEW_MS, WhatifJob, whatif_partition, window_keys
from projections.console.model import ConsoleModel
from projections.logs.audit import LogReplay, render_text
from projections.whatif.tally import Selection
from schemas.configs import ConfigBook, ConfigDocument, FoldSettings
from schemas.keys import partition_for
from tests.golden.histories import histories, settings_of
from tests.support.env import TEST_KEK, outside_env
from tests.support.processes import run_cli

ROOT = Path(__file__).resolve().parents[2]
DEMO = ROOT / "tests" / "golden" / "demo"
PARTITIONS = 2


def demo_records() -> list[tuple[int, list[str]]]:
    logs = []
    for history in histories():
        if history.directory.name == "demo" and history.name.startswith("1-"):
            rows = [json.loads(line)["record"] for line in history.events_path.read_text().splitlines()]
            logs.append((int(history.name.split("-")[1]), [json.dumps(r) for r in rows]))
    return logs


def renamed(record: str, old: int, new: int) -> str:
    return (
        record.replace(f'"key": "1:{old}"', f'"key": "1:{new}"')
        .replace(f'"command_id": "1:{old}:', f'"command_id": "1:{new}:')
        .replace(f'"conversation_id": {old},', f'"conversation_id": {new},')
    )


async def fill(
    bootstrap: str, app_id: str, copies: int, *, timestamp_ms: int | None = None, first_id: int = 500
) -> list[str]:
    """`copies` renamed demo conversations, each written whole in its partition; returns their keys."""
    logs = demo_records()
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all")
    await producer.start()
    keys = []
    try:
        for n in range(copies):
            old, records = logs[n % len(logs)]
            new = first_id + n
            key = f"1:{new}"
            keys.append(key)
            for record in records:
                await producer.send(
                    f"{app_id}.conversations",
                    key=key.encode(),
                    value=renamed(record, old, new).encode(),
                    partition=partition_for(key, PARTITIONS),
                    timestamp_ms=timestamp_ms,
                )
        await producer.flush()
    finally:
        await producer.stop()
    return keys


def env_of(bootstrap: str, app_id: str, tmp: Path) -> dict[str, str]:
    _, retry_base_ms = settings_of(DEMO)
    path = tmp / "config.json"
    path.write_text((DEMO / "config.json").read_text())
    return {
        **outside_env(),
        "KAFKA_BOOTSTRAP_SERVERS": bootstrap,
        "ROUTER_APP_ID": app_id,
        "ROUTER_CONFIG": str(path),
        "ROUTER_RETRY_BASE_MS": str(retry_base_ms),
        "ROUTER_PARTITIONS": str(PARTITIONS),
        "ROUTER_KEY_ENCRYPTION_KEY": TEST_KEK,  # the demo's histories hold text in clear: a copy seals it
    }


def cli(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return run_cli(env, *args, timeout_s=180)


async def applied_log(bootstrap: str, app_id: str, copies: int) -> tuple[ConfigDocument, list[str]]:
    config, retry_base_ms = settings_of(DEMO)
    document = ConfigDocument.of(config, FoldSettings(retry_base_ms=retry_base_ms))
    await ensure_app_topics(bootstrap, app_id, PARTITIONS)
    await apply(bootstrap, app_id, document)
    return document, await fill(bootstrap, app_id, copies)


async def delete_head(bootstrap: str, topic: str, partition: int, before: int) -> None:
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        await admin.delete_records({TopicPartition(topic, partition): RecordsToDelete(before_offset=before)})
    finally:
        await admin.close()


def test_a_log_that_lost_its_head_says_so_in_every_reader(kafka_bootstrap: str, app_id: str, tmp_path: Path) -> None:
    _, keys = asyncio.run(applied_log(kafka_bootstrap, app_id, 6))
    topic = f"{app_id}.conversations"
    whole = asyncio.run(plan(kafka_bootstrap, topic))
    assert not whole.history.is_partial and whole.history.describe().endswith("every partition starts at offset 0)")
    first_in_0 = next(k for k in keys if partition_for(k, PARTITIONS) == 0)
    asyncio.run(delete_head(kafka_bootstrap, topic, 0, 10))

    partial = asyncio.run(plan(kafka_bootstrap, topic)).history
    assert partial.is_partial and [(h.partition, h.missing) for h in partial.partial] == [(0, 10)]
    assert partial.complete_from_ms is not None and abs(partial.complete_from_ms - time.time() * 1000) < 600_000
    assert "10 records deleted from the head of partition(s) 0 (10 missing, kept from " in partial.describe()

    env = env_of(kafka_bootstrap, app_id, tmp_path)
    refused = cli(env, "replay", "state", "--to-app", f"{app_id}-new")
    assert refused.returncode == 2, refused.stderr
    assert "the history is partial" in refused.stderr and "partition(s) 0 (10 missing" in refused.stderr
    assert "--accept-partial-history" in refused.stderr

    accepted = cli(env, "replay", "state", "--to-app", f"{app_id}-new", "--accept-partial-history")
    assert accepted.returncode == 0, accepted.stderr
    assert "rebuilt from a partial history" in accepted.stdout and "records copied" in accepted.stdout

    for args in (("audit", "--verify"), ("whatif", "--config", env["ROUTER_CONFIG"])):
        result = cli(env, *args)
        assert "note: " in result.stderr and "the history is partial" in result.stderr, (args, result.stderr)
        assert "kept from" in result.stderr
    timeline = cli(env, "audit", "--conversation", first_in_0)
    assert timeline.returncode == 0 and "the history is partial" in timeline.stderr
    untouched = next(k for k in keys if partition_for(k, PARTITIONS) == 1)
    assert "partial" not in cli(env, "audit", "--conversation", untouched).stderr  # its partition is whole


def test_a_copy_of_a_partial_history_knows_it_is_partial(kafka_bootstrap: str, app_id: str, tmp_path: Path) -> None:
    """`replay state --to-app` from a log that lost its head: the new app's log starts at offset 0, yet every
    reader of the new app still says how many records are gone, and the copied records keep their times."""
    asyncio.run(applied_log(kafka_bootstrap, app_id, 6))
    source = f"{app_id}.conversations"
    asyncio.run(delete_head(kafka_bootstrap, source, 0, 10))
    env = env_of(kafka_bootstrap, app_id, tmp_path)
    new_app = f"{app_id}-copy"
    copied = cli(env, "replay", "state", "--to-app", new_app, "--accept-partial-history")
    assert copied.returncode == 0, copied.stderr

    target = f"{new_app}.conversations"
    history = asyncio.run(plan(kafka_bootstrap, target)).history
    assert [(h.partition, h.log_start, h.inherited) for h in history.partial] == [(0, 0, 10)]
    assert "10 missing, 10 of them before the copy" in history.describe()
    source_head = asyncio.run(plan(kafka_bootstrap, source)).history.heads[0]
    assert history.heads[0].first_ms == source_head.first_ms  # the first kept record's own time, not the copy's

    (tmp_path / "new").mkdir()
    new_env = env_of(kafka_bootstrap, new_app, tmp_path / "new")
    again = cli(new_env, "replay", "state")
    assert again.returncode == 2 and "partition(s) 0 (10 missing" in again.stderr, again.stderr
    verified = cli(new_env, "audit", "--verify")
    assert "note: " in verified.stderr and "the history is partial" in verified.stderr, verified.stderr

    copy_of_copy = cli(new_env, "replay", "state", "--to-app", f"{app_id}-copy2", "--accept-partial-history")
    assert copy_of_copy.returncode == 0, copy_of_copy.stderr
    twice = asyncio.run(plan(kafka_bootstrap, f"{app_id}-copy2.conversations")).history
    assert [(h.partition, h.missing) for h in twice.partial] == [(0, 10)]  # counted once, not once per copy


def test_one_conversation_is_read_from_its_first_record(kafka_bootstrap: str, app_id: str, tmp_path: Path) -> None:
    document, keys = asyncio.run(applied_log(kafka_bootstrap, app_id, 8))
    env = env_of(kafka_bootstrap, app_id, tmp_path)
    rebuilt = cli(env, "replay", "state", "--jobs", "1")
    assert rebuilt.returncode == 0, rebuilt.stderr
    key = keys[-1]
    partition = partition_for(key, PARTITIONS)

    seen: list[tuple[int, bytes | None]] = []
    read_back = asyncio.run(read_conversation(kafka_bootstrap, app_id, key, [lambda v, o, p, k: seen.append((o, k))]))
    assert read_back.start is not None and not read_back.partial
    offsets = {o for o, k in seen if k == key.encode()}
    assert read_back.start.offset == min(offsets) > 0  # later conversations start further in
    assert read_back.start.version == document.version

    everything = LogReplay(book=ConfigBook([document]))

    def feed(p: int, records: object) -> None:
        for record in records:  # type: ignore[attr-defined]
            if record.key == key.encode() or record.key == b"config":
                everything.feed(record.value, record.offset, p)

    asyncio.run(read(kafka_bootstrap, asyncio.run(plan(kafka_bootstrap, f"{app_id}.conversations")).spans, feed))
    timeline = cli(env, "audit", "--conversation", key)
    assert timeline.returncode == 0, timeline.stderr
    assert timeline.stdout == render_text(everything.trail(key))  # the same timeline as from the log start
    assert partition in (0, 1)
    verified = cli(env, "audit", "--verify", "--conversation", key)
    assert "1 conversations replayed, 0 undecodable records, 0 differences" in verified.stdout, verified.stderr
    assert " 0 differences" in cli(env, "audit", "--verify", "--jobs", "2").stdout


def test_a_time_window_is_found_by_timestamp(kafka_bootstrap: str, app_id: str, tmp_path: Path) -> None:
    asyncio.run(ensure_app_topics(kafka_bootstrap, app_id, PARTITIONS))
    now_ms = int(time.time() * 1000)
    old = asyncio.run(fill(kafka_bootstrap, app_id, 4, timestamp_ms=now_ms - 3 * 86_400_000, first_id=600))
    asyncio.run(applied_log(kafka_bootstrap, app_id, 0))  # a marker in each partition, stamped now
    new = asyncio.run(fill(kafka_bootstrap, app_id, 3, timestamp_ms=now_ms, first_id=700))
    topic = f"{app_id}.conversations"
    windowed = asyncio.run(plan(kafka_bootstrap, topic, from_ms=now_ms - 86_400_000))
    everything = asyncio.run(plan(kafka_bootstrap, topic))
    new_records = 0

    def count(p: int, records: object) -> None:
        nonlocal new_records
        new_records += sum(1 for r in records if r.key in {k.encode() for k in new})  # type: ignore[attr-defined]

    asyncio.run(read(kafka_bootstrap, windowed.spans, count))
    assert windowed.records == new_records + PARTITIONS < everything.records  # the markers and the new records
    assert old and all(s.start > 0 for s in windowed.spans if s.size)


async def _caught_up(tail: LogTail) -> None:
    for _ in range(600):
        if tail.status.caught_up:
            return
        await asyncio.sleep(0.05)
    raise AssertionError(f"the console's tail did not catch up: {tail.status}")


async def test_the_console_restarts_from_its_snapshot_and_reads_a_timeline_on_demand(
    kafka_bootstrap: str, app_id: str, tmp_path: Path
) -> None:
    document, keys = await applied_log(kafka_bootstrap, app_id, 6)
    book = ConfigBook([document])
    full = ConsoleModel(book=book)
    spans = (await plan(kafka_bootstrap, f"{app_id}.conversations")).spans

    def everything(p: int, records: object) -> None:
        for record in records:  # type: ignore[attr-defined]
            full.feed(record.value, record.offset, p, record.key)

    await read(kafka_bootstrap, spans, everything)
    path = tmp_path / "console.sqlite"
    first = LiveConsole(kafka_bootstrap, app_id, book, Snapshot(path, f"{app_id}.conversations"))
    tail = LogTail(kafka_bootstrap, app_id, first)
    tail.start()
    await _caught_up(tail)
    await tail.stop()  # commits the snapshot
    first.snapshot.close()
    assert not first.restored and first.overview(0) == full.overview(0)

    again = LiveConsole(kafka_bootstrap, app_id, book, Snapshot(path, f"{app_id}.conversations"))
    tail = LogTail(kafka_bootstrap, app_id, again)
    tail.start()
    try:
        await _caught_up(tail)
        assert again.restored and tail.status.records == full.records  # nothing read again
        assert again.overview(0) == full.overview(0)
        key = keys[-1]
        timeline = await again.timeline(key)
        assert timeline is not None and timeline == full.timeline(key)
        assert await again.timeline("1:999999") is None  # not on the log: nothing read
    finally:
        await tail.stop()
        again.snapshot.close()


async def test_a_long_partition_is_folded_in_passes_over_shares_of_its_keys(
    kafka_bootstrap: str, app_id: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Memory stays flat however long a partition is: each pass folds a share of its keys; the answers are the
    same as in one pass."""
    import handlers.logs.reader

    document, _ = await applied_log(kafka_bootstrap, app_id, 10)
    book = ConfigBook([document])
    candidate = document.config
    one = [await verify_partition(VerifyJob(kafka_bootstrap, app_id, book), p) for p in range(PARTITIONS)]
    job = WhatifJob(kafka_bootstrap, f"{app_id}.conversations", book, candidate, Selection())
    whatif_one = [await whatif_partition(job, p) for p in range(PARTITIONS)]
    monkeypatch.setattr(handlers.logs.reader, "PASS_RECORDS", 40)
    assert len(handlers.logs.reader.key_shares(100)) == 3
    summary = await rebuild(kafka_bootstrap, app_id, jobs=1, show_progress=False)
    assert summary.conversations == 10 and summary.undecodable == 0
    many = [await verify_partition(VerifyJob(kafka_bootstrap, app_id, book), p) for p in range(PARTITIONS)]
    assert sum(v.conversations for v in many) == sum(v.conversations for v in one) == 10
    assert sum(v.differences for v in many) == 0  # the rebuilt table, folded in passes, is what a fold gives
    assert sum(v.differences for v in one) == 10  # before the rebuild: no live table
    whatif_many = [await whatif_partition(job, p) for p in range(PARTITIONS)]
    for single, passes in zip(whatif_one, whatif_many, strict=True):
        assert single.counts == passes.counts and single.cells == passes.cells
        assert single.undecided == passes.undecided


async def test_a_first_start_on_a_long_log_builds_the_snapshot_one_partition_per_process(
    kafka_bootstrap: str, app_id: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import handlers.console.sources

    document, keys = await applied_log(kafka_bootstrap, app_id, 8)
    book = ConfigBook([document])
    full = ConsoleModel(book=book)

    def everything(p: int, records: object) -> None:
        for record in records:  # type: ignore[attr-defined]
            full.feed(record.value, record.offset, p, record.key)

    await read(kafka_bootstrap, (await plan(kafka_bootstrap, f"{app_id}.conversations")).spans, everything)
    monkeypatch.setattr(handlers.console.sources, "SMALL_READ", 0)
    path = tmp_path / "console.sqlite"
    console = LiveConsole(kafka_bootstrap, app_id, book, Snapshot(path, f"{app_id}.conversations"), jobs=2)
    tail = LogTail(kafka_bootstrap, app_id, console)
    tail.start()
    try:
        await _caught_up(tail)
        assert not console.restored and console.overview(0) == full.overview(0)
        assert tail.status.records == full.records
        assert await console.timeline(keys[0]) == full.timeline(keys[0])
    finally:
        await tail.stop()
        console.snapshot.close()
    loaded = Snapshot(path, f"{app_id}.conversations").load()
    assert loaded is not None and loaded.counts.overview(0) == full.overview(0)


async def test_a_first_start_counts_the_live_tables_conversations_while_it_builds(
    kafka_bootstrap: str, app_id: str, tmp_path: Path
) -> None:
    """Before the first build has folded the history, the overview has the workers' conversations (the last value
    per key of the state changelog) and a page reads its conversation from the first offset the live state
    records; the history's counts are not invented meanwhile."""
    document, keys = await applied_log(kafka_bootstrap, app_id, 8)
    book = ConfigBook([document])
    full = ConsoleModel(book=book)

    def everything(p: int, records: object) -> None:
        for record in records:  # type: ignore[attr-defined]
            full.feed(record.value, record.offset, p, record.key)

    await read(kafka_bootstrap, (await plan(kafka_bootstrap, f"{app_id}.conversations")).spans, everything)
    console = LiveConsole(kafka_bootstrap, app_id, book, Snapshot(tmp_path / "c.sqlite", f"{app_id}.conversations"))
    try:
        assert await console.seed() == 0 and not console.seeded  # no worker ran: no live table, the build counts
        await rebuild(kafka_bootstrap, app_id, jobs=1, show_progress=False)  # the live table, as workers keep it
        assert await console.seed() == 8 and console.seeded
        overview = console.overview(0)
        assert overview.conversations == 8 and overview.records == 0 and not overview.results
        for key in (keys[0], keys[-1]):
            assert await console.timeline(key) == full.timeline(key)
    finally:
        console.snapshot.close()


async def test_whatif_since_reads_only_the_conversations_of_the_window(kafka_bootstrap: str, app_id: str) -> None:
    """The window is found by the records' timestamps; only its conversations are folded (from their start), and
    their turns are those a full read finds for them."""
    first_ms = min(json.loads(r)["at_ms"] for _, records in demo_records() for r in records)  # the demo's day
    await ensure_app_topics(kafka_bootstrap, app_id, PARTITIONS)
    await fill(kafka_bootstrap, app_id, 4, timestamp_ms=first_ms - 3 * 86_400_000, first_id=800)
    document, _ = await applied_log(kafka_bootstrap, app_id, 0)
    new = await fill(kafka_bootstrap, app_id, 3, timestamp_ms=first_ms, first_id=900)
    book, topic = ConfigBook([document]), f"{app_id}.conversations"
    since = first_ms - 86_400_000  # every recorded turn starts after it; only the new records are stamped after it

    keys_of_window: set[bytes] = set()
    for p in range(PARTITIONS):
        keys_of_window |= await window_keys(kafka_bootstrap, topic, p, since - CLOCK_SKEW_MS)
    assert keys_of_window - {b"config"} == {k.encode() for k in new}

    windowed = WhatifJob(kafka_bootstrap, topic, book, document.config, Selection(from_ms=since), window=True)
    compared = [await whatif_partition(windowed, p) for p in range(PARTITIONS)]
    expected: Counter[str] = Counter()
    for key in new:
        one = WhatifJob(kafka_bootstrap, topic, book, document.config, Selection(key=key))
        for p in range(PARTITIONS):
            expected.update((await whatif_partition(one, p)).counts)
    everything = [
        await whatif_partition(WhatifJob(kafka_bootstrap, topic, book, document.config, Selection()), p)
        for p in range(PARTITIONS)
    ]
    got: Counter[str] = Counter()
    for tally in compared:
        got.update(tally.counts)
    assert got == expected and sum(got.values()) > 0
    assert sum(sum(t.counts.values()) for t in everything) > sum(got.values())  # the old conversations were left out
