"""Readers at scale (issue 25, DESIGN §8): every reader of the event log on a big topic, beside a raw consumer.

For each `--records` size it builds an app whose `conversations` topic has 12 partitions filled with the recorded
demo histories (`tests/golden/demo`) under new conversation ids, `--interleave` conversations in flight at a time,
every record in the partition the project's partitioner gives its key (`schemas/keys.py`), after `config apply`
of the demo's configuration. Then, in one run and in this order:

- raw: an aiokafka consumer reads the whole topic (the baseline of every ratio);
- `replay state --to-app NEW` (copy + fold + write; NEW is what the next commands read);
- `audit --verify` (all of NEW, against the table the rebuild wrote: 0 differences expected);
- `audit --conversation A:C` and `audit --verify --conversation A:C`, for the oldest and the newest conversation;
- `whatif --config SAME` (all turns, the configuration in force as the candidate: nothing may change);
- the console, started twice: seconds until its overview counts every conversation and the newest conversation's
  page answers 200 (the first start builds what it keeps, the second starts from it), and until its overview has
  counted every record (a first start shows the workers' live states first: the history counts come later);
- `console-start` (only when asked for, with `--only`): the console's first start on the built app, whose workers
  never ran (no live table): seconds from the process's start to its first answered API request
  (`GET /api/overview`, polled every 20 ms) and what it said, to the first answer of the newest conversation's
  `GET /api/conversations/A:C` (200, or 202 "reading"), until the overview counts every conversation, until it
  has caught up, and until the newest conversation's timeline is shown.

With `--sealed` (issue 32 item 6) the same histories are written as a worker of today writes them: each
conversation gets a data key (`DataKey.new`), wrapped under the key-encryption key and sent to `<app>.keys`, in the
partition of the conversation's records, before its first sealed record; every record holding a personal field in
clear (a turn read's message texts, a conversation read's e-mail domain) is written sealed under it
(`handlers/privacy/resealing.py` `seal_event`: sealed text, keyed digest, `usable`). No `effects` are written, so
there are no `Decide` commands to seal: a rebuild folds them from the sealed reads, with sealed parts. The KEK is
`ROUTER_KEY_ENCRYPTION_KEY` of the environment, else the one in `--kek-file`, else a new one (kept in `--kek-file`,
or in the bench's work directory, so a later `--app-id` run opens the same app). Every command runs with that KEK
in its environment, sealed app or not. A sealed app's rebuild (`replay state --to-app NEW`) gets `<app>.keys` copied
to `<NEW>.keys` after it, outside its timing, when the measured tree's copy did not carry them (trees before the
key copy); then `audit --conversation --html` of the oldest conversation that asked System One must show its
customer's text, neither withheld nor erased (`sealed check`; the bench stops otherwise).

Each command runs as its own process (`python -m streams.cli`, in `--code-dir`, so an exported older tree is
measured the same way). Reported per command: seconds, the peak of the process tree's summed RSS and PSS (children
included: `--jobs` processes), records/s (records of the topic / seconds) and the ratio to the raw consumer's
records/s; for two or more sizes, the growth of each figure from the smallest to the largest.

    .venv/bin/python bench/scale_bench.py --bootstrap 127.0.0.1:29731 --records 1000000 [--records 3000000]
        [--code-dir /tmp/before] [--only replay,verify] [--jobs N] [--app-id EXISTING] [--sealed] [--kek-file F]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import html
import json
import os
import re
import resource
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections import OrderedDict
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from handlers.kafka.topic_io import topic_partitions  # noqa: E402
from handlers.kafka.topics import ensure_app_topics  # noqa: E402
from handlers.logs.reader import log_consumer  # noqa: E402
from handlers.privacy.envelope import DataKey, KeyEncryptionKey  # noqa: E402
from handlers.privacy.kek import KEK_VAR, load_keks, new_kek_value  # noqa: E402
from handlers.privacy.resealing import contact_of, seal_event  # noqa: E402
from schemas.chatwoot import MessageType  # noqa: E402
from schemas.codec import decode_conversation_event, encode  # noqa: E402
from schemas.data_keys import WrappedDataKey  # noqa: E402
from schemas.keys import partition_for  # noqa: E402
from streams.kafka.local import free_port  # noqa: E402
from tests.golden.histories import demo_logs, interleaved, settings_of  # noqa: E402
from tests.support.processes import run_cli  # noqa: E402

PARTITIONS = 12
DEMO = ROOT / "tests" / "golden" / "demo"
COMMANDS = ("raw", "replay", "verify", "audit", "audit-verify", "whatif", "console")
EXTRA = ("console-start",)  # measured only when named in --only
CONSOLE_LIMIT_S = 900  # a console first start that has not caught up by then is reported as a timeout


# --- building the topic ---------------------------------------------------------------------------------------


@dataclass
class Built:
    app_id: str
    records: int
    conversations: int
    oldest: str
    newest: str
    sealed: bool = False


def cli(code_dir: Path, env: dict[str, str], *args: str, timeout: float = 3600) -> subprocess.CompletedProcess[str]:
    return run_cli(env, *args, timeout_s=timeout, cwd=code_dir)


def router_env(bootstrap: str, app_id: str, config_path: Path, retry_base_ms: int, kek: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("ROUTER_")}
    env.update(
        KAFKA_BOOTSTRAP_SERVERS=bootstrap,
        ROUTER_APP_ID=app_id,
        ROUTER_CONFIG=str(config_path),
        ROUTER_RETRY_BASE_MS=str(retry_base_ms),
        ROUTER_PARTITIONS=str(PARTITIONS),
        PYTHONUNBUFFERED="1",
    )
    env[KEK_VAR] = kek  # every command gets it (a tree before sealing ignores it)
    return env


def bench_kek(kek_file: Path | None, workdir: Path) -> str:
    """The KEK the bench seals under and gives every command: the environment's, else `kek_file`'s, else a new one
    kept in `kek_file` (or the work directory) for a later `--app-id` run of the same app."""
    given = os.environ.get(KEK_VAR)
    if given:
        return given
    if kek_file is not None and kek_file.exists():
        return kek_file.read_text().strip()
    value = new_kek_value()
    path = kek_file or workdir / "kek"
    path.touch(mode=0o600)
    path.write_text(value + "\n")
    print(f"a new key-encryption key, kept in {path} (give it back with --kek-file {path})", flush=True)
    return value


IN_CLEAR = re.compile(r'"(?:text|email_domain)":"')  # a personal field in clear in a compact record


class Sealer:
    """What a worker of today writes of a conversation's records: the personal fields sealed under the conversation's
    data key, made (and queued for `<app>.keys`) the first time one of its records needs it."""

    def __init__(self, kek: str, interleave: int) -> None:
        keks = load_keks({KEK_VAR: kek})
        assert keks is not None
        self.kek: KeyEncryptionKey = keks.current
        self.keys: OrderedDict[str, DataKey] = OrderedDict()  # the conversations in flight (a copy never comes back)
        self.keep = max(1_000, 4 * interleave)
        self.sealed = 0
        # the contact each demo history names (the worker keeps it beside the key, from its conversation read)
        self.contacts: dict[int, int | None] = {}
        for old, records in demo_logs():
            found = (contact_of(decode_conversation_event(r.encode())) for r in records if IN_CLEAR.search(r))
            self.contacts[old] = next((c for c in found if c is not None), None)

    def seal(self, key: str, record: str) -> tuple[bytes, WrappedDataKey | None]:
        """The record's bytes as the worker writes them, and the conversation's wrapped key when it is new."""
        if IN_CLEAR.search(record) is None:
            return record.encode(), None
        event = decode_conversation_event(record.encode())
        data_key, new = self.keys.get(key), None
        if data_key is None:
            data_key = self.keys[key] = DataKey.new(key)
            if len(self.keys) > self.keep:
                self.keys.popitem(last=False)
            new = WrappedDataKey(
                key=key,
                kek_id=self.kek.kek_id,
                wrapped=self.kek.wrap(data_key),
                created_ms=time.time_ns() // 1_000_000,
                contact_id=contact_of(event) or self._contact(key),
            )
        self.sealed += 1
        return encode(seal_event(event, data_key)), new

    def _contact(self, key: str) -> int | None:
        """The contact of the demo history conversation `key` is a copy of (a conversation read, usually the first
        record sealed, does not name it; the worker has it from the same read): `interleaved` makes copy n of
        `demo_logs()[n % len]` conversation FIRST_ID + n."""
        originals = list(self.contacts)
        return self.contacts[originals[(int(key.split(":")[1]) - FIRST_ID) % len(originals)]]


FIRST_ID = 100_001  # tests/golden/histories.py interleaved()'s first conversation id


async def fill(bootstrap: str, app_id: str, wanted: int, interleave: int, sealer: Sealer | None = None) -> Built:
    """Write at least `wanted` records of renamed demo histories, `interleave` conversations in flight; with
    `sealer`, sealed as a worker of today writes them, each conversation's data key on `<app>.keys` first."""
    topic = f"{app_id}.conversations"
    producer = AIOKafkaProducer(
        bootstrap_servers=bootstrap, acks=1, linger_ms=20, max_batch_size=512 * 1024, compression_type=None
    )
    await producer.start()
    written, keys = 0, dict[str, None]()  # the conversations in the order they started
    try:
        for key, record in interleaved(wanted, interleave, FIRST_ID):
            partition = partition_for(key, PARTITIONS)
            if sealer is None:
                value = record.encode()
            else:
                value, wrapped = sealer.seal(key, record)
                if wrapped is not None:  # sent before the record sealed under it, in the conversation's partition
                    await producer.send(
                        f"{app_id}.keys",
                        key=key.encode(),
                        value=wrapped.model_dump_json().encode(),
                        partition=partition,
                    )
            await producer.send(topic, key=key.encode(), value=value, partition=partition)
            written += 1
            keys.setdefault(key)
        await producer.flush()
    finally:
        await producer.stop()
    started = list(keys)
    first, last = (started[0], started[-1]) if started else ("", "")
    return Built(app_id, written, len(started), first, last, sealed=sealer is not None)


def build(
    bootstrap: str, records: int, interleave: int, workdir: Path, kek: str, sealed: bool
) -> tuple[Built, dict[str, str]]:
    app_id = f"scale-{records // 1000}k{'-sealed' if sealed else ''}-{uuid.uuid4().hex[:6]}"
    _, retry_base_ms = settings_of(DEMO)
    config_path = workdir / "demo-config.json"
    config_path.write_text((DEMO / "config.json").read_text())
    env = router_env(bootstrap, app_id, config_path, retry_base_ms, kek)
    asyncio.run(ensure_app_topics(bootstrap, app_id, PARTITIONS))
    applied = cli(ROOT, env, "config", "apply", str(config_path))
    assert applied.returncode == 0, applied.stderr
    started = time.monotonic()
    sealer = Sealer(kek, interleave) if sealed else None
    built = asyncio.run(fill(bootstrap, app_id, records, interleave, sealer))
    print(
        f"built {app_id}: {built.records:,} records, {built.conversations:,} conversations"
        f"{f' ({sealer.sealed:,} records sealed)' if sealer else ''} in {time.monotonic() - started:.0f} s "
        f"(oldest {built.oldest}, newest {built.newest})",
        flush=True,
    )
    return built, env


async def count_records(bootstrap: str, topic: str) -> int:
    """Records on `topic` now (0 when it does not exist)."""
    try:
        tps = await topic_partitions(bootstrap, topic)
    except LookupError:
        return 0
    async with log_consumer(bootstrap) as consumer:
        ends = await consumer.end_offsets(tps)
        starts = await consumer.beginning_offsets(tps)
    return sum(ends[tp] - starts[tp] for tp in tps)


async def copy_keys(bootstrap: str, source_app: str, target_app: str) -> int:
    """`<source>.keys` copied into the same partitions of `<target>.keys` (made if missing): what a rebuild by a
    tree that does not copy data keys leaves out. The records copied."""
    await ensure_app_topics(bootstrap, target_app, PARTITIONS)
    tps = await topic_partitions(bootstrap, f"{source_app}.keys")
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False)
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks=1, linger_ms=20)
    await consumer.start()
    await producer.start()
    copied = 0
    try:
        consumer.assign(tps)
        await consumer.seek_to_beginning(*tps)
        ends = await consumer.end_offsets(tps)
        remaining = {tp for tp, end in ends.items() if end > 0}
        while remaining:
            for tp, records in (await consumer.getmany(*remaining, timeout_ms=500)).items():
                for r in records:
                    await producer.send(f"{target_app}.keys", key=r.key, value=r.value, partition=tp.partition)
                    copied += 1
                if records and records[-1].offset >= ends[tp] - 1:
                    remaining.discard(tp)
        await producer.flush()
    finally:
        await producer.stop()
        await consumer.stop()
    return copied


def existing(bootstrap: str, app_id: str, workdir: Path, kek: str) -> tuple[Built, dict[str, str]]:
    """An app built by an earlier run (`--app-id`): its size, its oldest and newest conversations, and whether it
    is sealed (its `keys` topic holds data keys)."""
    _, retry_base_ms = settings_of(DEMO)
    config_path = workdir / "demo-config.json"
    config_path.write_text((DEMO / "config.json").read_text())
    env = router_env(bootstrap, app_id, config_path, retry_base_ms, kek)

    async def probe() -> Built:
        tps = await topic_partitions(bootstrap, f"{app_id}.conversations")
        async with log_consumer(bootstrap) as consumer:
            ends = await consumer.end_offsets(tps)
        ids: list[int] = []
        async with log_consumer(bootstrap) as consumer:
            for tp in tps:
                for offset in (0, ends[tp] - 1):
                    if ends[tp] == 0:
                        continue
                    consumer.assign([tp])
                    consumer.seek(tp, offset)
                    batch = (await consumer.getmany(tp, timeout_ms=3000, max_records=5)).get(tp, [])
                    ids += [int(r.key.split(b":")[1]) for r in batch if r.key and r.key.startswith(b"1:")]
        sealed = await count_records(bootstrap, f"{app_id}.keys") > 0
        return Built(
            app_id, sum(ends.values()), max(ids) - min(ids) + 1, f"1:{min(ids)}", f"1:{max(ids)}", sealed=sealed
        )

    return asyncio.run(probe()), env


# --- measuring --------------------------------------------------------------------------------------------------


def _tree(pid: int) -> list[int]:
    pids, todo = [], [pid]
    while todo:
        current = todo.pop()
        pids.append(current)
        try:
            for task in os.listdir(f"/proc/{current}/task"):
                with open(f"/proc/{current}/task/{task}/children") as f:
                    todo += [int(c) for c in f.read().split()]
        except OSError:
            continue
    return pids


def _kb(path: str, field_name: str) -> int:
    try:
        with open(path) as f:
            for line in f:
                if line.startswith(field_name):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


@dataclass
class Peak:
    """The peak summed RSS and PSS of a process tree, sampled every `every_s`."""

    pid: int
    every_s: float = 0.2
    rss_kb: int = 0
    pss_kb: int = 0
    processes: int = 1
    _stop: threading.Event = field(default_factory=threading.Event)

    def __enter__(self) -> Peak:
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        while not self._stop.is_set():
            pids = _tree(self.pid)
            self.processes = max(self.processes, len(pids))
            self.rss_kb = max(self.rss_kb, sum(_kb(f"/proc/{p}/status", "VmRSS:") for p in pids))
            self.pss_kb = max(self.pss_kb, sum(_kb(f"/proc/{p}/smaps_rollup", "Pss:") for p in pids))
            self._stop.wait(self.every_s)


@dataclass
class Result:
    command: str
    seconds: float
    rss_mb: float
    pss_mb: float
    records_per_s: float
    ratio: float
    processes: int = 1
    note: str = ""
    cpu_s: float = 0.0  # CPU seconds of the command's whole process tree (user + system)

    @property
    def per_cpu_second(self) -> float:
        """Records per CPU second: the per-core figure, whatever else ran on the machine meanwhile."""
        return self.records_per_s * self.seconds / self.cpu_s if self.cpu_s else 0.0


def run_command(
    name: str, code_dir: Path, env: dict[str, str], args: list[str], records: int, raw_rate: float
) -> Result:
    started, cpu = time.monotonic(), children_cpu()
    process = subprocess.Popen(
        [sys.executable, "-m", "streams.cli", *args],
        cwd=code_dir,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    with Peak(process.pid) as peak:
        out, err = process.communicate(timeout=7200)
    seconds = time.monotonic() - started
    last = (out.strip().splitlines() or [""])[-1]
    note = last[:160] if process.returncode in (0, 1) else f"exit {process.returncode}: {err.strip()[-300:]}"
    if process.returncode != 0 and not last:  # failed without a word on stdout (a traceback): its last line
        note = f"FAILED, exit {process.returncode}: {(err.strip().splitlines() or [''])[-1][:200]}"
    rate = records / seconds
    mb = (peak.rss_kb / 1024, peak.pss_kb / 1024)
    return Result(name, seconds, *mb, rate, rate / raw_rate, peak.processes, note, children_cpu() - cpu)


def children_cpu() -> float:
    """CPU seconds of every child process waited for so far (a command's pool workers are waited by it, so they
    count in its figure)."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


async def raw_consumer(bootstrap: str, topic: str) -> tuple[float, int]:
    """Seconds and records for a plain aiokafka consumer of every partition at once (its default settings)."""
    from aiokafka import AIOKafkaConsumer

    tps = await topic_partitions(bootstrap, topic)
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False)
    await consumer.start()
    try:
        consumer.assign(tps)
        await consumer.seek_to_beginning(*tps)
        ends = await consumer.end_offsets(tps)
        started, count = time.perf_counter(), 0
        remaining: set[TopicPartition] = {tp for tp, end in ends.items() if end > 0}
        while remaining:
            for tp, records in (await consumer.getmany(*remaining, timeout_ms=500)).items():
                count += len(records)
                if records and records[-1].offset >= ends[tp] - 1:
                    remaining.discard(tp)
        return time.perf_counter() - started, count
    finally:
        await consumer.stop()


@contextlib.contextmanager
def console(code_dir: Path, env: dict[str, str], snapshot_dir: Path) -> Iterator[tuple[str, Peak]]:
    """`chatwoot-router console` of `code_dir` with its snapshot under `snapshot_dir`: its URL and the peak memory
    of its process tree while it runs; stopped on leaving."""
    port = free_port()
    process = subprocess.Popen(
        [sys.executable, "-m", "streams.cli", "console", "--port", str(port)],
        cwd=code_dir,
        env={**env, "ROUTER_DATA_DIR": str(snapshot_dir)},  # the snapshot goes to $ROUTER_DATA_DIR/console
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    with Peak(process.pid) as peak:
        try:
            yield f"http://127.0.0.1:{port}", peak
        finally:
            tree = _tree(process.pid)
            process.terminate()
            try:
                process.wait(timeout=60)
            except subprocess.TimeoutExpired:  # a console whose build hangs does not stop on SIGTERM: its tree
                for pid in reversed(tree):
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(pid, 9)
                process.wait(timeout=60)


def console_first_page(
    code_dir: Path, env: dict[str, str], built: Built, raw_rate: float, snapshot_dir: Path, label: str
) -> Result:
    """Seconds from the console's start until its overview counts every conversation and the newest conversation's
    page answers 200."""
    started, cpu = time.monotonic(), children_cpu()
    overview_s = newest_s = complete_s = None
    said = ""
    with console(code_dir, env, snapshot_dir) as (url, peak), httpx.Client(timeout=30) as http:
        while time.monotonic() - started < CONSOLE_LIMIT_S and None in (overview_s, newest_s, complete_s):
            try:
                if overview_s is None or complete_s is None:
                    answer = http.get(f"{url}/api/overview").json()
                    said = answer["fragments"]["live"]
                    if overview_s is None and answer["data"]["conversations"] >= built.conversations:
                        overview_s = time.monotonic() - started
                    if complete_s is None and answer["fragments"]["live"].startswith("live"):
                        complete_s = time.monotonic() - started  # caught up: every record counted
                if newest_s is None and http.get(f"{url}/conversations/{built.newest}").status_code == 200:
                    newest_s = time.monotonic() - started
            except (httpx.HTTPError, ValueError, KeyError):
                pass
            time.sleep(0.1)
    seconds = max(overview_s or float("nan"), newest_s or float("nan"))
    rate = built.records / seconds
    note = (
        f"overview {overview_s:.1f} s, newest conversation {newest_s:.1f} s, every record counted {complete_s:.1f} s"
        if overview_s and newest_s and complete_s
        else f"TIMEOUT after {CONSOLE_LIMIT_S} s, last said: {said[:120]}"
    )
    mb = (peak.rss_kb / 1024, peak.pss_kb / 1024)
    return Result(label, seconds, *mb, rate, rate / raw_rate, peak.processes, note, children_cpu() - cpu)


def console_start(code_dir: Path, env: dict[str, str], built: Built, snapshot_dir: Path) -> Result:
    """Seconds from the console's process start to its first answered API request, with no snapshot and (on the
    built app) no workers' live table; then to the newest conversation's first answer, the overview counting every
    conversation, the console caught up, and the newest conversation's timeline shown. `seconds` is the first."""
    started, cpu = time.monotonic(), children_cpu()
    marks: dict[str, float] = {}
    said = ""

    def at(name: str) -> None:
        marks.setdefault(name, time.monotonic() - started)

    with console(code_dir, env, snapshot_dir) as (url, peak), httpx.Client(timeout=60) as http:
        while "first answer" not in marks and time.monotonic() - started < 600:
            try:
                answer = http.get(f"{url}/api/overview")
            except httpx.TransportError:
                time.sleep(0.02)
                continue
            at("first answer")
            body = answer.json()
            catching = body.get("catching_up", "not said")
            said = f"HTTP {answer.status_code}, catching_up {catching}, {body['data']['records']:,} records"
        begun = time.monotonic()
        page = http.get(f"{url}/api/conversations/{built.newest}")
        at("newest conversation answered")
        said += f"; newest conversation: HTTP {page.status_code} after {time.monotonic() - begun:.2f} s"
        while time.monotonic() - started < 3600 and len(marks) < 5:
            try:
                body = http.get(f"{url}/api/overview").json()
                if body["data"]["conversations"] >= built.conversations:
                    at("every conversation counted")
                if body["fragments"]["live"].startswith("live"):
                    at("caught up")
                if http.get(f"{url}/api/conversations/{built.newest}").status_code == 200:
                    at("newest timeline shown")
            except (httpx.HTTPError, ValueError, KeyError):
                pass
            time.sleep(0.1)
    seconds = marks.get("first answer", float("nan"))
    note = ", ".join(f"{name} {value:.2f} s" for name, value in marks.items()) + f" ({said})"
    mb = (peak.rss_kb / 1024, peak.pss_kb / 1024)
    rate = built.records / marks.get("caught up", float("nan"))
    return Result("console start (no workers)", seconds, *mb, rate, 0.0, peak.processes, note, children_cpu() - cpu)


def measure(
    bootstrap: str, built: Built, env: dict[str, str], args: argparse.Namespace, workdir: Path, rebuilt: str | None
) -> list[Result]:
    code_dir = Path(args.code_dir).resolve()
    wanted = set(args.only.split(",")) if args.only else set(COMMANDS)
    jobs = ["--jobs", str(args.jobs)] if args.jobs else []
    seconds, count = asyncio.run(raw_consumer(bootstrap, f"{built.app_id}.conversations"))
    raw_rate = count / seconds
    results = [Result("raw consumer", seconds, 0.0, 0.0, raw_rate, 1.0, note=f"{count:,} records")]
    print(f"raw consumer: {count:,} records in {seconds:.2f} s ({raw_rate:,.0f} records/s)", flush=True)
    new_app = f"{built.app_id}-r{uuid.uuid4().hex[:4]}"
    new_env = {**env, "ROUTER_APP_ID": new_app}
    total = built.records

    def step(name: str, environment: dict[str, str], *command: str) -> None:
        result = run_command(name, code_dir, environment, list(command), total, raw_rate)
        results.append(result)
        print(show(result), flush=True)

    if rebuilt is not None:  # an app an earlier run rebuilt (`--rebuilt`): its table is read, nothing rebuilt
        new_app, new_env = rebuilt, {**env, "ROUTER_APP_ID": rebuilt}
    elif wanted & {"replay", "verify", "audit", "audit-verify"}:  # these read what the rebuild wrote
        step("replay state --to-app", env, "replay", "state", "--to-app", new_app, *jobs)
    else:  # what-if and the console need no table: the built app itself
        new_app, new_env = built.app_id, env
    if built.sealed and new_app != built.app_id:
        carried = asyncio.run(count_records(bootstrap, f"{new_app}.keys"))
        if carried == 0:  # a tree whose rebuild does not copy the data keys: copied here, outside any timing
            copied = asyncio.run(copy_keys(bootstrap, built.app_id, new_app))
            print(f"{new_app}.keys: {copied:,} data keys copied from {built.app_id}.keys (untimed)", flush=True)
        else:
            print(f"{new_app}.keys: {carried:,} records (written by the rebuild)", flush=True)
        print(sealed_check(code_dir, new_env, built, workdir), flush=True)
    if "verify" in wanted:
        step("audit --verify", new_env, "audit", "--verify", *jobs)
    if "audit" in wanted:
        for which, key in (("oldest", built.oldest), ("newest", built.newest)):
            step(f"audit --conversation ({which})", new_env, "audit", "--conversation", key)
    if "audit-verify" in wanted:
        for which, key in (("oldest", built.oldest), ("newest", built.newest)):
            step(f"audit --verify --conversation ({which})", new_env, "audit", "--verify", "--conversation", key)
    if "whatif" in wanted:
        step("whatif --config SAME", new_env, "whatif", "--config", env["ROUTER_CONFIG"], *jobs)
    if "console" in wanted:
        snapshot = workdir / f"console-{new_app}"
        for label in ("console (first start)", "console (second start)"):
            result = console_first_page(code_dir, new_env, built, raw_rate, snapshot, label)
            results.append(result)
            print(show(result), flush=True)
    if "console-start" in wanted:  # the built app: no worker ever ran on it, so there is no live table
        result = console_start(code_dir, env, built, workdir / f"console-start-{uuid.uuid4().hex[:4]}")
        results.append(result)
        print(show(result), flush=True)
    return results


def demo_original(key: str) -> list[str]:
    """The compact records of the demo history conversation `key` is a copy of (`interleaved`: copy n of
    `demo_logs()[n % len]` is conversation FIRST_ID + n)."""
    logs = demo_logs()
    return logs[(int(key.split(":")[1]) - FIRST_ID) % len(logs)][1]


def sealed_check(code_dir: Path, env: dict[str, str], built: Built, workdir: Path) -> str:
    """That a reader opens the sealed fields with the bench's KEK: `audit --conversation --html` of the oldest
    conversation that asked System One must show the input it read (its customer's text, as the demo recorded it),
    neither withheld nor erased. Raises when it does not."""
    first = int(built.oldest.split(":")[1])
    key = next(
        f"1:{n}" for n in range(first, first + 100) if any('"op":"decide"' in r for r in demo_original(f"1:{n}"))
    )
    texts = {
        m.text
        for r in demo_original(key)
        if IN_CLEAR.search(r)
        for m in _messages_of(decode_conversation_event(r.encode()))
        if m.text and m.message_type == MessageType.INCOMING
    }
    page = workdir / f"check-{key.replace(':', '-')}.html"
    done = cli(code_dir, env, "audit", "--conversation", key, "--html", str(page), timeout=600)
    found = re.findall(r'<pre class="input">(.*?)</pre>', page.read_text() if page.exists() else "", re.S)
    shown = [html.unescape(s) for s in found]
    opened = [s for s in shown if any(t in s for t in texts)]
    hidden = [s for s in shown if s.startswith("(withheld") or s.startswith("(erased")]
    verdict = f"sealed check: audit --conversation {key} --html: {len(shown)} input(s) shown, {len(opened)} with the "
    verdict += f"customer's text in clear, {len(hidden)} withheld or erased (exit {done.returncode})"
    if not opened or hidden or done.returncode != 0:
        raise SystemExit(f"{verdict}: the readers do not open the sealed fields\n{done.stderr[-500:]}")
    sample = opened[0].splitlines()[-1]
    return f"{verdict}; e.g. {sample[:60]!r}"


def _messages_of(event: object) -> list[Any]:
    """The message views of a decoded turn read (a chained one's too)."""
    outcomes = getattr(event, "outcomes", None) or [event]
    found: list[Any] = []
    for outcome in outcomes:
        found.extend(getattr(getattr(outcome, "result", None), "messages", ()) or ())
    return found


def show(r: Result) -> str:
    per_cpu = f"{r.per_cpu_second:>9,.0f} rec/CPU-s" if r.cpu_s else " " * 19
    return (
        f"{r.command:<44} {r.seconds:8.2f} s  RSS {r.rss_mb:5.0f} MB  PSS {r.pss_mb:5.0f} MB  "
        f"{r.records_per_s:>10,.0f} rec/s  {r.ratio:5.2f}x raw  {per_cpu}  ({r.processes} proc)  {r.note}"
    )


def growth(small: list[Result], large: list[Result], sizes: tuple[int, int]) -> None:
    print(f"\ngrowth from {sizes[0]:,} to {sizes[1]:,} records ({sizes[1] / sizes[0]:.1f}x the records):")
    by_name = {r.command: r for r in small}
    for r in large:
        s = by_name.get(r.command)
        if s is None or not s.seconds:
            continue
        rss = f"{r.rss_mb / s.rss_mb:.2f}x" if s.rss_mb else "-"
        print(f"  {r.command:<44} seconds {r.seconds / s.seconds:5.2f}x   RSS {rss}")


def _row(r: Result) -> dict[str, Any]:
    return {**r.__dict__, "per_cpu_second": r.per_cpu_second}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--bootstrap", required=True, help="a running broker (start one with `chatwoot-router kafka`)")
    parser.add_argument("--records", type=int, action="append", help="topic size; repeat for a growth figure")
    parser.add_argument("--interleave", type=int, default=50, help="conversations in flight while filling")
    parser.add_argument("--code-dir", default=str(ROOT), help="the tree whose commands are measured")
    parser.add_argument("--only", help=f"a comma-separated subset of {','.join(COMMANDS + EXTRA)}")
    parser.add_argument("--jobs", type=int, help="passed as --jobs N to the commands that take it")
    parser.add_argument("--app-id", action="append", help="measure an app built earlier instead (one per size)")
    parser.add_argument("--rebuilt", action="append", help="with --app-id: its app rebuilt earlier (skips the rebuild)")
    parser.add_argument("--json", type=Path, help="also write the results as JSON")
    parser.add_argument("--sealed", action="store_true", help="build the topic sealed, as a worker of today writes it")
    parser.add_argument("--kek-file", type=Path, help=f"the bench's KEK when {KEK_VAR} is not set (made if missing)")
    args = parser.parse_args()
    workdir = Path(tempfile.mkdtemp(prefix="scale-bench-"))
    kek = bench_kek(args.kek_file, workdir)
    runs: list[tuple[int, list[Result]]] = []
    targets: list[Any] = args.app_id or args.records or [100_000]
    for index, target in enumerate(targets):
        built, env = (
            existing(args.bootstrap, target, workdir, kek)
            if args.app_id
            else build(args.bootstrap, target, args.interleave, workdir, kek, args.sealed)
        )
        kind = "sealed" if built.sealed else "plaintext"
        print(f"\n== {built.records:,} records ({built.app_id}, {kind}), code from {args.code_dir}", flush=True)
        rebuilt = args.rebuilt[index] if args.rebuilt else None
        runs.append((built.records, measure(args.bootstrap, built, env, args, workdir, rebuilt)))
    if len(runs) >= 2:
        growth(runs[0][1], runs[-1][1], (runs[0][0], runs[-1][0]))
    if args.json:
        args.json.write_text(
            json.dumps([{"records": n, "results": [_row(r) for r in rs]} for n, rs in runs], indent=2) + "\n"
        )


if __name__ == "__main__":
    main()
