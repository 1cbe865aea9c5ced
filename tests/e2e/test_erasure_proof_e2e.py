"""The proof of issue 32 (item 5): route conversations on a broker of its own, forget some of them by conversation
and one contact's by contact, wait for the erasure deadline, then scan every byte the router and its Kafka keep.

The app runs with a short erasure deadline (ROUTER_ERASURE_DEADLINE_MS: the `max.compaction.lag.ms` of
`<app>.keys`) and the broker's log cleaner looks for work every 200 ms and deletes replaced segment files at once,
so "compacted by the deadline" is seconds here instead of days. After `forget`:

- the old wrapped data key of every forgotten conversation (read from `<app>.keys` before forgetting) disappears
  from the keys topic's segment files within a bounded wait, and then from every file of the broker's data
  directory and of the worker's RocksDB directory. Kafka never compacts the active segment and rolls it (at
  `max.compaction.lag.ms`, KIP-354) only when a record is appended: nothing else is routed meanwhile, and the
  worker writes each fence again once its deadline has passed (`TableKeyRing.roll_fences`), which rolls the
  segment for the cleaner. Without the short deadline (7 days) the wait times out;
- no file of the broker's data directory (all topics, changelogs, `__consumer_offsets`, the KRaft log), the
  worker's RocksDB directory, the console's snapshot, `whatif`'s report or any process log holds any
  conversation's text or contact domain in clear (only ciphertext is ever stored), nor any data key;
- `topics` accepts the keys topic with the configured deadline, `audit --verify` is clean, the console shows a
  forgotten conversation as erased, and `whatif` still runs.

Chatwoot's own files (the sandbox's scenario and log) are Chatwoot's, not the router's, and are left out.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import secrets
import string
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import pytest

from handlers.console.snapshot import snapshot_path
from handlers.privacy.kek import KEK_VAR, require_keks
from handlers.privacy.keyring import fence_roll_every_ms
from streams.kafka.local import LocalKafka, free_port, running_broker
from tests.support.env import TEST_KEK
from tests.support.kafka import read_all
from tests.support.processes import Process
from tests.support.stack import SALES, Stack
from tests.support.waiting import wait_until

DEADLINE_MS = 3_000
"""ROUTER_ERASURE_DEADLINE_MS of the proof: `max.compaction.lag.ms` of its keys topic."""
CLEANER = {"log.cleaner.backoff.ms": "200", "log.segment.delete.delay.ms": "0"}
"""The proof's broker: its cleaner checks for work every 200 ms (15 s by default) and deletes a replaced segment file
at once (60 s by default), so what the cleaner removed is gone from the directory the test scans."""
COMPACTED_WITHIN_S = 60.0
"""How long the proof waits for compaction after forgetting: many deadlines, far from the default's 7 days."""
_FORGOTTEN_LINE = re.compile(r"forgotten (\S+) at (.+ UTC); its old data key is compacted away by (.+ UTC)")


@pytest.fixture(scope="module")
def own_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalKafka]:
    with running_broker(data_dir=tmp_path_factory.mktemp("proof-kafka"), settings=CLEANER) as broker:
        yield broker


def files_under(*roots: Path, leave_out: tuple[str, ...] = ()) -> Iterator[Path]:
    for root in roots:
        for path in root.rglob("*"):
            if path.is_file() and not any(part in path.name for part in leave_out):
                yield path


def random_part(size: int, alphabet: str = string.ascii_lowercase + string.digits) -> str:
    return "".join(secrets.choice(alphabet) for _ in range(size))


def fragments(value: bytes, size: int = 8) -> list[bytes]:
    """`value` cut into pieces of `size` bytes, each found alone. The worker's RocksDB compresses its blocks
    (Snappy): a copy of a value there can be broken wherever a run of 4 or more bytes repeats an earlier one in
    the block, so a search for the whole value may miss it. Its random parts stay whole in all but rare cases,
    and `size` random bytes are never found by chance."""
    return [value[i : i + size] for i in range(0, len(value) - size + 1, size)]


def holding(paths: Iterator[Path], needles: dict[str, list[bytes]]) -> list[str]:
    """`name in path` for each needle a piece of which is in a file (a file deleted while being read is not there
    any more)."""
    found = []
    for path in paths:
        try:
            data = path.read_bytes()
        except FileNotFoundError:
            continue
        found += [f"{name} in {path}" for name, pieces in needles.items() if any(p in data for p in pieces)]
    return found


@dataclass
class Proof:
    """The stack, what each conversation said (to find in clear: there must be none) and what was forgotten."""

    stack: Stack
    in_clear: dict[str, list[bytes]] = field(default_factory=dict)

    def says(self, conversation: int, text: str) -> None:
        tag = random_part(16, string.ascii_letters + string.digits)
        self.in_clear[repr(f"okapi{tag}")] = fragments(tag.encode())
        self.stack.customer_says(1, conversation, f"{text} okapi{tag}")

    def contact(self) -> dict[str, Any]:
        tag = random_part(16)
        self.in_clear[repr(f"mail{tag}.example")] = fragments(tag.encode())
        return {"contact_name": f"Ida Proof{tag[:6]}", "contact_email": f"ida@mail{tag}.example"}

    def routed(self, conversations: list[int]) -> None:
        for conversation in conversations:
            self.stack.wait_conversation(1, conversation, "assigned to sales", lambda c: c["assignee_id"] == SALES, 90)
            self.stack.log.wait_settled(1, conversation, "its turn to end")


def key_records(bootstrap: str, app: str) -> list[dict[str, Any]]:
    return [json.loads(record.value) for record in asyncio.run(read_all(bootstrap, f"{app}.keys"))]


def console(stack: Stack) -> tuple[Process, str]:
    port = free_port()
    process = Process(f"console-{port}", ["console", "--port", str(port)], stack.env, stack.tmp)
    process.start()

    def ready() -> bool:
        assert process.alive(), f"console exited:\n{process.log_tail()}"
        return "ready url=" in process.log_path.read_text(errors="replace")

    wait_until("the console to listen", ready, 60, every_s=0.2)
    return process, f"http://127.0.0.1:{port}"


def _utc(text: str) -> float:
    return datetime.strptime(text, "%Y-%m-%d %H:%M:%S UTC").replace(tzinfo=UTC).timestamp()


@pytest.mark.timeout(240)
def test_forgotten_keys_are_compacted_by_the_deadline_and_no_byte_kept_holds_text_or_a_data_key(
    own_broker: LocalKafka, tmp_path: Path
) -> None:
    app = f"proof-{os.getpid()}-{int(time.time())}"
    # one partition: every data key and fence is on the one keys partition the proof watches
    env = {"ROUTER_ERASURE_DEADLINE_MS": str(DEADLINE_MS), "ROUTER_PARTITIONS": "1"}
    stack = Stack(own_broker.bootstrap, app, tmp_path, env=env)
    proof = Proof(stack)
    keys_dirs = own_broker.data_dir / "kraft-logs"
    viewer: Process | None = None
    try:
        stack.start()
        viewer, console_url = console(stack)
        # two conversations forgotten one by one, a contact with two conversations forgotten by contact, one kept
        singles = [stack.new_conversation(**proof.contact()) for _ in range(2)]
        first = stack.new_conversation(**proof.contact())
        contact_id = stack.conversation(1, first)["contact"]["id"]
        second = stack.new_conversation(contact_id=contact_id)
        kept = stack.new_conversation(**proof.contact())
        everyone = [*singles, first, second, kept]
        for conversation in everyone:
            proof.says(conversation, "I need a quote for your pricing plans")
        proof.routed(everyone)
        forgotten = [f"1:{c}" for c in (*singles, first, second)]

        listed = stack.run_cli("topics")  # the check accepts the keys topic with the configured deadline
        assert listed.returncode == 0, listed.stdout + listed.stderr
        keys_line = next(line for line in listed.stdout.splitlines() if line.startswith(f"{app}.keys "))
        assert f"max.compaction.lag.ms={DEADLINE_MS}" in keys_line, keys_line

        keks = require_keks({KEK_VAR: TEST_KEK})
        before = [r for r in key_records(own_broker.bootstrap, app) if r["type"] == "data_key"]
        wrapped = {  # every wrapped value written for a forgotten conversation, without its `w1.` prefix
            f"an old key of {r['key']} ({n})": fragments(r["wrapped"].encode()[3:], 16)
            for n, r in enumerate(before)
            if r["key"] in forgotten
        }
        assert {r["key"] for r in before} >= {f"1:{c}" for c in everyone} and len(wrapped) >= len(forgotten)

        done = [
            *(stack.run_cli("forget", "--conversation", key, "--reason", "proof") for key in forgotten[:2]),
            stack.run_cli("forget", "--contact", f"1:{contact_id}", "--reason", "proof by contact"),
        ]
        assert all(result.returncode == 0 for result in done), [result.stderr for result in done]
        lines = [m for result in done for m in _FORGOTTEN_LINE.finditer(result.stdout)]
        assert sorted(m[1] for m in lines) == sorted(forgotten), [result.stdout for result in done]
        for line in lines:  # the promise printed is the proof's time plus the configured deadline (to the second)
            promised = (DEADLINE_MS + fence_roll_every_ms(DEADLINE_MS)) / 1000  # the deadline, and the fences' roll
            assert abs(_utc(line[3]) - _utc(line[2]) - promised) <= 1, line[0]
        latest = {r["key"]: r for r in key_records(own_broker.bootstrap, app)}
        assert all(latest[key]["type"] == "erased" for key in forgotten)
        assert latest[f"1:{kept}"]["type"] == "data_key"

        # compaction by the deadline, on a keys partition nothing else writes to: the worker writes each fence
        # again once its deadline has passed, which rolls the segment holding the old key for the cleaner
        def compacted() -> bool:
            return not holding(files_under(*keys_dirs.glob(f"{app}.keys-*")), wrapped)

        wait_until("the forgotten keys compacted away from the keys topic", compacted, COMPACTED_WITHIN_S, 0.2)

        def written_again() -> bool:  # each fence, once its own deadline passed (the first roll may have sufficed)
            latest = {r["key"]: r for r in key_records(own_broker.bootstrap, app)}
            return all(latest[key].get("again_ms") for key in forgotten)

        wait_until("every fence written again past its deadline", written_again, COMPACTED_WITHIN_S, 0.5)

        def erased_on_console() -> bool:
            response = httpx.get(f"{console_url}/api/conversations/{forgotten[2]}", timeout=10)
            return response.status_code == 200 and "text and contact data erased" in response.text

        wait_until("the console to show the forgotten conversation as erased", erased_on_console, 60, 0.5)
        assert httpx.get(f"{console_url}/api/overview", timeout=10).status_code == 200
        assert httpx.get(f"{console_url}/api/conversations/1:{kept}", timeout=30).status_code == 200

        whatif = stack.run_cli("whatif", "--config", str(stack.config_path), "--json", str(tmp_path / "whatif.json"))
        assert whatif.returncode == 0, whatif.stderr
        assert json.loads((tmp_path / "whatif.json").read_text())

        verify_until = time.monotonic() + 90  # the live table may trail the log by a commit interval: ask again
        while (audit := stack.run_cli("audit", "--verify", timeout_s=120)).returncode != 0:
            assert time.monotonic() < verify_until, audit.stdout + audit.stderr
    finally:
        if viewer is not None:
            viewer.stop()
        stack.stop()
    snapshot = snapshot_path(tmp_path / "state" / "console", app)
    assert snapshot.exists() and snapshot.stat().st_size > 0, snapshot  # the console's snapshot is in the scan

    # ... and from every file of the broker, and of the worker's store (whose data_keys table held it too)
    left = holding(files_under(own_broker.data_dir, tmp_path / "state"), wrapped)
    assert not left, "an erased key's old value is still kept: " + "; ".join(left)
    every_key = [r for r in key_records(own_broker.bootstrap, app) if r["type"] == "data_key"] + before
    raw = {
        f"the data key of {r['key']}": fragments(keks.unwrap(r["kek_id"], r["wrapped"], r["key"]).material, 16)
        for r in every_key
    }
    scanned = list(files_under(own_broker.data_dir, tmp_path, leave_out=("sandbox", "scenario")))
    assert len(scanned) > 20, len(scanned)  # the scan saw the broker's segments and the worker's store
    found = holding(iter(scanned), {**proof.in_clear, **raw})
    assert not found, "kept in clear: " + "; ".join(found)
