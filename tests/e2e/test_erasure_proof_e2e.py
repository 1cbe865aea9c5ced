"""The proof of issue 32 (item 5, in part): after routing real conversations on a broker of its own and forgetting
one, no byte the router or its Kafka keep holds any conversation's text or contact domain in clear, nor any data
key: every file of the broker's data directory (all topics, changelogs, `__consumer_offsets`, the KRaft log), the
worker's RocksDB directory and the router's process logs is scanned. Chatwoot's own files (the sandbox's scenario
and log) are Chatwoot's, not the router's, and are left out.

Not proved here: that compaction removes the erased key's old wrapped value within the erasure deadline (that takes
a broker whose `<app>.keys` is compacted within seconds; docs/privacy.md "Not done yet")."""

from __future__ import annotations

import asyncio
import json
import os
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from handlers.privacy.kek import KEK_VAR, require_keks
from streams.kafka.local import LocalKafka, running_broker
from tests.support.env import TEST_KEK
from tests.support.kafka import read_all
from tests.support.stack import SALES, Stack


@pytest.fixture(scope="module")
def own_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalKafka]:
    with running_broker(data_dir=tmp_path_factory.mktemp("proof-kafka")) as broker:
        yield broker


def files_under(*roots: Path, leave_out: tuple[str, ...] = ()) -> Iterator[Path]:
    for root in roots:
        for path in root.rglob("*"):
            if path.is_file() and not any(part in path.name for part in leave_out):
                yield path


def test_no_byte_kept_holds_a_conversations_text_or_domain_or_a_data_key(
    own_broker: LocalKafka, tmp_path: Path
) -> None:
    stack = Stack(own_broker.bootstrap, f"proof-{os.getpid()}-{int(time.time())}", tmp_path)
    secrets: list[str] = []
    conversations: list[int] = []
    try:
        stack.start()
        for _ in range(3):
            tag = uuid.uuid4().hex[:8]
            marker, domain = f"okapi{tag}", f"mail{tag}.example"
            secrets += [marker, domain]
            conversation = stack.new_conversation(contact_name=f"Ida Proof{tag}", contact_email=f"ida.{tag}@{domain}")
            stack.customer_says(1, conversation, f"I need a quote for your pricing plans {marker}")
            conversations.append(conversation)
        for conversation in conversations:
            stack.wait_conversation(1, conversation, "assigned to sales", lambda c: c["assignee_id"] == SALES, 90)
            stack.log.wait_settled(1, conversation, "its turn to end")
        forgotten = stack.run_cli("forget", "--conversation", f"1:{conversations[0]}", "--reason", "proof")
        assert forgotten.returncode == 0, forgotten.stderr
        app = stack.env["ROUTER_APP_ID"]
        keks = require_keks({KEK_VAR: TEST_KEK})
        data_keys = []
        for record in asyncio.run(read_all(own_broker.bootstrap, f"{app}.keys")):
            value = json.loads(record.value)
            if value["type"] == "data_key":
                data_keys.append(keks.unwrap(value["kek_id"], value["wrapped"], value["key"]).material)
        assert len(data_keys) >= len(conversations)  # the forgotten one's key is still in the log until compaction
    finally:
        stack.stop()
    time.sleep(1)  # the broker's page cache is what a read of its files sees; nothing to wait for but the stop
    scanned = 0
    found = []
    for path in files_under(own_broker.data_dir, tmp_path, leave_out=("sandbox", "scenario")):
        data = path.read_bytes()
        scanned += 1
        found += [f"{secret!r} in {path}" for secret in secrets if secret.encode() in data]
        found += [f"a data key in {path}" for key in data_keys if key in data]
    assert scanned > 20, scanned  # the scan saw the broker's segments and the worker's store, not an empty tree
    assert not found, "kept in clear: " + "; ".join(found)
