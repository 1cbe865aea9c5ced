"""Crypto-shredding's parts (issue 32): sealing, the key-encryption key, the key ring, and the sealed turn input.

The fold never sees customer text: it keeps sealed texts and their keyed digests, names the decision memo by the
digests, and the worker that asks System One opens the input in memory. These tests hold that, without Kafka."""

from __future__ import annotations

import asyncio
import base64
from pathlib import Path

import pytest

from handlers.privacy.envelope import CannotOpen, DataKey, KeyEncryptionKey
from handlers.privacy.kek import KEK_VAR, RETIRED_VAR, KeyEncryptionKeys, UnknownKek, load_keks, require_keks
from handlers.privacy.keyring import Forgotten, TableKeyRing
from handlers.privacy.sealing import EMAIL_DOMAIN, open_input, seal_conversation, seal_turn
from handlers.worker.ports import MemoryTable
from projections.inputs import build_input, decide_command, memo_key, turn_input
from schemas.config import ConfigError
from schemas.records import ConversationView, TurnResult
from tests.unit.test_fold_driver import incoming, make_config, outgoing

KEK_A = base64.b64encode(bytes(range(32))).decode()
KEK_B = base64.b64encode(bytes(range(1, 33))).decode()


def test_a_sealed_text_opens_only_as_the_field_of_the_conversation_it_was_sealed_for() -> None:
    key = DataKey.new("1:7")
    sealed = key.seal("my card was charged twice", "message:3")
    assert "charged" not in sealed and sealed.startswith("s1.")
    assert key.open(sealed, "message:3") == "my card was charged twice"
    with pytest.raises(CannotOpen):
        key.open(sealed, "message:4")  # another message's text
    with pytest.raises(CannotOpen):
        DataKey("1:8", key.material).open(sealed, "message:3")  # copied into another conversation
    with pytest.raises(CannotOpen):
        DataKey.new("1:7").open(sealed, "message:3")  # another key: what erasure leaves
    assert key.seal("same", "message:3") != key.seal("same", "message:3")  # random nonces


def test_digests_compare_texts_within_a_conversation_and_reveal_nothing_across() -> None:
    key = DataKey.new("1:7")
    assert key.digest("refund please", "text") == key.digest("refund please", "text")
    assert key.digest("refund please", "text") != key.digest("refund, please", "text")
    assert DataKey.new("1:7").digest("refund please", "text") != key.digest("refund please", "text")


def test_a_data_key_is_wrapped_for_its_conversation_under_the_kek() -> None:
    kek = KeyEncryptionKey(bytes(range(32)))
    key = DataKey.new("1:7")
    wrapped = kek.wrap(key)
    assert kek.unwrap(wrapped, "1:7").material == key.material
    with pytest.raises(CannotOpen):
        kek.unwrap(wrapped, "1:8")
    with pytest.raises(CannotOpen):
        KeyEncryptionKey(bytes(range(1, 33))).unwrap(wrapped, "1:7")
    assert kek.kek_id == KeyEncryptionKey(bytes(range(32))).kek_id
    assert "material" not in repr(kek) and str(bytes(range(32))) not in repr(kek)


def test_the_kek_comes_from_the_environment_or_a_file_and_a_bad_one_is_named_never_shown(tmp_path: Path) -> None:
    assert load_keks({}) is None
    assert load_keks({KEK_VAR: KEK_A}) is not None
    secret = tmp_path / "kek"
    secret.write_text(KEK_A + "\n")
    from_file = load_keks({f"{KEK_VAR}_FILE": str(secret)})
    assert from_file is not None and from_file.current.kek_id == KeyEncryptionKey(bytes(range(32))).kek_id
    for env, says in (
        ({KEK_VAR: "not base64 at all!"}, "is not base64"),
        ({KEK_VAR: base64.b64encode(b"short").decode()}, "holds 5 bytes"),
        ({KEK_VAR: KEK_A, f"{KEK_VAR}_FILE": str(secret)}, "set one"),
        ({f"{KEK_VAR}_FILE": str(tmp_path / "missing")}, "cannot be read"),
        ({RETIRED_VAR: KEK_B}, f"without {KEK_VAR}"),
    ):
        with pytest.raises(ConfigError) as raised:
            load_keks(env)
        assert says in str(raised.value)
        for value in env.values():
            if value not in (str(secret),):
                assert value not in str(raised.value)
    with pytest.raises(ConfigError, match=f"{KEK_VAR}: is not set"):
        require_keks({})


def new_ring(table: MemoryTable, keks: KeyEncryptionKeys, events: list[str]) -> TableKeyRing:
    async def durable() -> None:
        events.append("durable")

    return TableKeyRing(table, keks, before_write=lambda: events.append("fence checked"), durable=durable)


def test_a_conversation_gets_one_key_made_durable_before_use_and_a_restart_reads_it_back() -> None:
    table, events = MemoryTable(), []
    keks = require_keks({KEK_VAR: KEK_A})
    ring = new_ring(table, keks, events)
    first = asyncio.run(ring.key_for("1:7", contact_id=42))
    assert events == ["fence checked", "durable"]
    assert asyncio.run(ring.key_for("1:7")) is first and events == ["fence checked", "durable"]
    stored = table.get("1:7")
    assert stored["type"] == "data_key" and stored["contact_id"] == 42 and stored["kek_id"] == keks.current.kek_id
    assert base64.b64encode(first.material).decode() not in str(stored)
    again = new_ring(table, keks, [])  # a restarted worker: the same key from the table
    assert again.known("1:7") == first


def test_an_erased_conversation_has_no_key_and_never_gets_one_again() -> None:
    table, events = MemoryTable(), []
    ring = new_ring(table, require_keks({KEK_VAR: KEK_A}), events)
    asyncio.run(ring.key_for("1:7"))
    ring.erase("1:7", at_ms=5, reason="customer asked")
    assert table.get("1:7") == {"v": 1, "key": "1:7", "type": "erased", "at_ms": 5, "reason": "customer asked"}
    with pytest.raises(Forgotten):
        ring.known("1:7")
    with pytest.raises(Forgotten):
        asyncio.run(ring.key_for("1:7"))


def test_a_key_wrapped_under_a_retired_kek_still_opens_and_one_never_given_is_named() -> None:
    table = MemoryTable()
    old = new_ring(table, require_keks({KEK_VAR: KEK_A}), [])
    key = asyncio.run(old.key_for("1:7"))
    rotated = new_ring(table, require_keks({KEK_VAR: KEK_B, RETIRED_VAR: KEK_A}), [])
    assert rotated.known("1:7") == key
    with pytest.raises(UnknownKek) as raised:
        new_ring(table, require_keks({KEK_VAR: KEK_B}), []).known("1:7")
    assert raised.value.kek_id == old.keks.current.kek_id


def test_the_fold_decides_on_sealed_texts_as_it_did_on_plaintext() -> None:
    """The same messages sealed or not: the same kept ids and count; the worker opens exactly the text the
    plaintext path builds; the memo key is made of digests, so it repeats for the same turn and never carries
    text."""
    key = DataKey.new("1:1")
    messages = (incoming(1, "hello, my order"), outgoing(2), incoming(3, "   "), incoming(4, "arrived broken"))
    plain_view = ConversationView(inbox_id=1, status="pending", email_domain="example.org")
    turn = seal_turn(TurnResult(messages=messages), key)
    current = seal_conversation(plain_view, key)
    assert all(m.text is None for m in turn.messages) and current.email_domain is None
    assert key.open(current.sealed_email_domain or "", EMAIL_DOMAIN) == "example.org"
    plain = build_input(messages, "example.org")
    sealed = turn_input(turn.messages, current)
    assert (sealed.key, sealed.count) == (plain.key, plain.count) == ("1,4", 2)
    assert sealed.text is None and len(sealed.parts) == 2
    decide = decide_command(sealed)
    assert decide.text is None and "order" not in decide.model_dump_json()
    assert open_input(decide, key) == plain.text
    config = make_config()
    assert memo_key(sealed, config, 1) == memo_key(turn_input(turn.messages, current), config, 1)
    assert memo_key(sealed, config, 1).startswith("1,4#") and memo_key(sealed, config, 1) != memo_key(plain, config, 1)
    with pytest.raises(CannotOpen):
        open_input(decide, DataKey.new("1:1"))  # erased: the key that sealed it is gone


def test_rotation_wraps_every_owned_key_again_so_the_retired_kek_can_be_dropped() -> None:
    """docs/privacy.md "Rotating the key-encryption key": with the new KEK current and the old one retired, the
    owner of each partition wraps its keys again; after that the new KEK alone opens them."""
    table = MemoryTable()
    old = new_ring(table, require_keks({KEK_VAR: KEK_A}), [])
    keys = {c: asyncio.run(old.key_for(c)) for c in ("1:1", "1:2", "1:3")}
    events: list[str] = []
    rotating = new_ring(table, require_keks({KEK_VAR: KEK_B, RETIRED_VAR: KEK_A}), events)
    rotating.partition_of = lambda key: 1 if key == "1:3" else 0
    assert asyncio.run(rotating.rewrap_retired(owned={0})) == 2  # 1:3 is another worker's partition
    assert events == ["fence checked", "fence checked", "durable"]
    assert asyncio.run(rotating.rewrap_retired(owned={0})) == 0  # done: nothing left under the retired KEK
    new_only = new_ring(table, require_keks({KEK_VAR: KEK_B}), [])
    assert new_only.known("1:1") == keys["1:1"] and new_only.known("1:2") == keys["1:2"]
    with pytest.raises(UnknownKek):
        new_only.known("1:3")  # left to its owner


def test_a_run_begun_before_the_upgrade_keeps_a_plaintext_input_and_never_mixes_in_a_sealed_domain() -> None:
    """Across the upgrade a run's turn read may be plaintext (read before) while its conversation read is sealed
    (read after), or the other way round: the input takes the texts' kind, and a domain of the other kind is left
    out (the worker could not join plaintext and ciphertext in one question)."""
    key = DataKey.new("1:1")
    legacy = (incoming(1, "hello, my order"),)
    sealed_current = seal_conversation(ConversationView(inbox_id=1, status="pending", email_domain="x.org"), key)
    mixed = turn_input(legacy, sealed_current)
    assert mixed.text == "hello, my order" and mixed.parts == ()
    turn = seal_turn(TurnResult(messages=legacy), key)
    plain_current = ConversationView(inbox_id=1, status="pending", email_domain="x.org")
    other = turn_input(turn.messages, plain_current)
    assert other.text is None and other.domain is None and open_input(decide_command(other), key) == "hello, my order"
