"""`replay state --to-app` carries the data keys and seals an older log on the way (issue 32 item 4), without Kafka.

What the new app's `keys` gets for a conversation (`key_to_copy`), the fate of a field in clear (`plaintext_fate`),
the sealing of a decoded record (`seal_event`), and one partition's copy (`PartitionKeys`) over in-memory topics:
the recorded demo histories (written before sealing) come out with no text or domain in clear, one key per
conversation written before the records that need it, and a fold of the sealed copy that does what the fold of the
original did."""

from __future__ import annotations

import asyncio
import base64
import json
from collections import defaultdict
from collections.abc import Sequence
from typing import Any

import pytest
from aiokafka import ConsumerRecord

from handlers.logs.key_copy import KekNeeded, PartitionKeys
from handlers.privacy.envelope import CannotOpen, DataKey
from handlers.privacy.kek import KEK_VAR, KeyEncryptionKeys, require_keks
from handlers.privacy.resealing import (
    Erasures,
    KeyCopy,
    contact_of,
    key_to_copy,
    latest_keys,
    plaintext_fate,
    plaintext_in,
    seal_event,
    sealed_in,
)
from handlers.privacy.sealing import EMAIL_DOMAIN, message_field, open_input
from projections.fold import fold
from schemas.codec import decode_conversation_event, encode
from schemas.data_keys import KEY_RECORD, ErasedKey, WrappedDataKey
from schemas.records import (
    ChainedOutcomes,
    ConversationResult,
    ConversationView,
    Decide,
    EffectOutcome,
    Forgotten,
    TurnResult,
)
from schemas.state import ConversationState
from tests.golden.histories import ROOT as GOLDEN
from tests.golden.histories import settings_of
from tests.unit.test_fold_driver import incoming

KEKS = require_keks({KEK_VAR: base64.b64encode(bytes(range(32))).decode()})
DEMO = GOLDEN / "demo"


def wrapped(conversation: str, key: DataKey | None = None, keks: KeyEncryptionKeys = KEKS) -> WrappedDataKey:
    key = key or DataKey.new(conversation)
    return WrappedDataKey(
        key=conversation, kek_id=keks.current.kek_id, wrapped=keks.current.wrap(key), created_ms=1, contact_id=None
    )


def fence(conversation: str, **fields: Any) -> ErasedKey:
    return ErasedKey(key=conversation, at_ms=2, reason="asked", **fields)


def never(a: WrappedDataKey, b: WrappedDataKey) -> bool:
    raise AssertionError("the keys' bytes alone decide this")


# --- what the new app's keys get ------------------------------------------------------------------------------


def test_the_latest_record_of_each_conversation_wins_and_what_does_not_decode_is_skipped() -> None:
    first, second = wrapped("1:1"), fence("1:1")
    values = [first.model_dump_json().encode(), b"not json", None, second.model_dump_json().encode()]
    values.append(wrapped("1:2").model_dump_json().encode())
    latest = latest_keys(values)
    assert latest["1:1"] == second and set(latest) == {"1:1", "1:2"}


def test_fences_are_copied_as_they_are_and_never_replaced_by_a_key() -> None:
    key, gone = wrapped("1:1"), fence("1:1")
    assert key_to_copy(gone, None, never) == KeyCopy(write=gone)
    assert key_to_copy(gone, key, never) == KeyCopy(write=gone)  # forgotten since the last copy: the key goes
    assert key_to_copy(gone, gone, never) == KeyCopy()
    assert key_to_copy(key, gone, never) == KeyCopy()  # a final fence stays whatever the old app holds


def test_wrapped_keys_are_copied_as_they_are_once() -> None:
    key = wrapped("1:1")
    assert key_to_copy(key, None, never) == KeyCopy(write=key)
    assert key_to_copy(key, key, never) == KeyCopy()


def test_the_same_data_key_wrapped_again_is_copied_and_another_one_is_resealed_under_the_new_apps() -> None:
    material = DataKey.new("1:1")
    before, after = wrapped("1:1", material), wrapped("1:1", material)  # a KEK rotation wraps it again
    assert key_to_copy(after, before, lambda a, b: True) == KeyCopy(write=after)
    minted = wrapped("1:1")  # the copy made one for a text in clear; the old app made its own since
    assert key_to_copy(wrapped("1:1"), minted, lambda a, b: False) == KeyCopy(reseal=True)


@pytest.mark.skipif("scope" not in ErasedKey.model_fields, reason="erasure scopes are not in this tree")
def test_a_key_made_after_a_text_erasure_is_copied_over_its_fence() -> None:
    text_fence = fence("1:1", scope="text")
    later = wrapped("1:1")
    assert key_to_copy(later, text_fence, never) == KeyCopy(write=later)
    assert key_to_copy(text_fence, wrapped("1:1"), never) == KeyCopy(write=text_fence)


def test_a_text_in_clear_is_erased_sealed_or_gets_a_key_first() -> None:
    erasures = Erasures()
    erasures.add(50, Forgotten(account_id=1, conversation_id=2, reason="asked", at_ms=3))
    assert plaintext_fate("1:1", 10, None, erasures) == "mint"
    assert plaintext_fate("1:1", 10, wrapped("1:1"), erasures) == "seal"
    assert plaintext_fate("1:1", 10, fence("1:1"), erasures) == "erase"
    assert plaintext_fate("1:2", 10, wrapped("1:2"), erasures) == "erase"  # its Forgotten is further on
    assert plaintext_fate("1:2", 60, None, erasures) == "erase"  # forgotten whole: never a key


# --- sealing a decoded record ---------------------------------------------------------------------------------


def legacy_outcomes() -> tuple[EffectOutcome, EffectOutcome]:
    turn = EffectOutcome(
        key="1:1",
        account_id=1,
        command_id="1:1:1:3",
        op="read_turn",
        at_ms=1,
        result=TurnResult(messages=(incoming(5, "my invoice is wrong", sender_id=77), incoming(6, "   "))),
    )
    read = EffectOutcome(
        key="1:1",
        account_id=1,
        command_id="1:1:1:1",
        op="get_conversation",
        at_ms=1,
        result=ConversationResult(conversation=ConversationView(inbox_id=1, status="open", email_domain="acme.test")),
    )
    return turn, read


def test_a_record_in_clear_is_sealed_as_the_worker_seals_it() -> None:
    turn, read = legacy_outcomes()
    key = DataKey.new("1:1")
    assert plaintext_in(turn) and plaintext_in(read) and not sealed_in(turn) and contact_of(turn) == 77
    chained = ChainedOutcomes.of([read, turn])
    sealed = seal_event(chained, key)
    assert isinstance(sealed, ChainedOutcomes) and not plaintext_in(sealed) and sealed_in(sealed)
    raw = encode(sealed)
    assert b"invoice" not in raw and b"acme.test" not in raw
    conversation, messages = sealed.outcomes[0].result, sealed.outcomes[1].result
    assert isinstance(conversation, ConversationResult) and isinstance(messages, TurnResult)
    assert key.open(conversation.conversation.sealed_email_domain or "", EMAIL_DOMAIN) == "acme.test"
    first, blank = messages.messages
    assert key.open(first.sealed_text or "", message_field(5)) == "my invoice is wrong"
    assert (first.usable, blank.usable) == (True, False)


def test_a_field_sealed_under_the_old_apps_key_is_sealed_again_under_the_new_apps() -> None:
    turn, _ = legacy_outcomes()
    old, new = DataKey.new("1:1"), DataKey.new("1:1")
    under_old = seal_event(turn, old)
    again = seal_event(under_old, new, source=old)
    assert isinstance(again, EffectOutcome) and isinstance(again.result, TurnResult)
    assert new.open(again.result.messages[0].sealed_text or "", message_field(5)) == "my invoice is wrong"
    with pytest.raises(CannotOpen):
        old.open(again.result.messages[0].sealed_text or "", message_field(5))
    erased = seal_event(under_old, new, source=DataKey.new("1:1"))  # sealed under a key destroyed since
    assert erased == under_old


# --- one partition's copy over in-memory topics -----------------------------------------------------------------


class FakeProducer:
    def __init__(self, topics: dict[str, list[bytes | None]]) -> None:
        self.topics = topics

    async def send(self, topic: str, *, key: bytes, value: bytes, partition: int) -> asyncio.Future[None]:
        if topic.endswith(".keys"):  # keyed as Faust keys the `data_keys` changelog, or a worker never finds it
            assert key == json.dumps(json.loads(value)["key"]).encode(), key
        self.topics[topic].append(value)
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        done.set_result(None)
        return done


class MemoryKeys(PartitionKeys):
    """`PartitionKeys` reading topics from memory (`old.keys`, `new.keys`, `old.conversations`)."""

    def __init__(self, topics: dict[str, list[bytes | None]], keks: KeyEncryptionKeys | None = KEKS) -> None:
        super().__init__("unused:9", "old", "new", 0, FakeProducer(topics), keks)
        self.topics = topics

    async def _values(self, topic: str) -> list[bytes | None]:
        return list(self.topics[topic])

    async def _forgotten_records(self) -> list[tuple[int, bytes]]:
        log = self.topics["old.conversations"]
        return [(offset, raw) for offset, raw in enumerate(log) if raw is not None and b'"forgotten"' in raw]


def records(values: Sequence[bytes | None], keys: Sequence[str]) -> list[ConsumerRecord[bytes, bytes]]:
    return [
        ConsumerRecord("old.conversations", 0, offset, 0, 0, key.encode(), value, None, 0, 0, [])
        for offset, (key, value) in enumerate(zip(keys, values, strict=True))
    ]


def demo_log() -> tuple[list[str], list[bytes | None]]:
    """Every recorded demo history (written before sealing), one conversation after the other: (keys, values)."""
    keys: list[str] = []
    values: list[bytes | None] = []
    for path in sorted(DEMO.glob("*.events.jsonl")):
        account, conversation = path.name.removesuffix(".events.jsonl").split("-")
        for line in path.read_text().splitlines():
            keys.append(f"{account}:{conversation}")
            values.append(json.dumps(json.loads(line)["record"], separators=(",", ":")).encode())
    return keys, values


def in_clear(values: list[bytes | None]) -> set[str]:
    """The texts and e-mail domains the values hold in clear."""
    found: set[str] = set()
    for raw in values:
        event = decode_conversation_event(raw)
        outcomes = event.outcomes if isinstance(event, ChainedOutcomes) else [event]
        for outcome in outcomes:
            result = getattr(outcome, "result", None)
            if isinstance(result, TurnResult):
                found.update(m.text for m in result.messages if m.text)
            if isinstance(result, ConversationResult) and result.conversation.email_domain:
                found.add(result.conversation.email_domain)
    return found


def folded(keys: list[str], values: list[bytes | None]) -> dict[str, list[Any]]:
    """Per conversation: (offset, command ids and ops, the Decide params, turn outcomes) of each event."""
    config, retry_base_ms = settings_of(DEMO)
    states: dict[str, ConversationState] = defaultdict(ConversationState)
    rows: dict[str, list[Any]] = defaultdict(list)
    for offset, (key, raw) in enumerate(zip(keys, values, strict=True)):
        result = fold(states[key], decode_conversation_event(raw), offset, config, retry_base_ms=retry_base_ms)
        states[key] = result.state
        commands = [(c.command_id, c.op) for c in result.commands]
        decides = [c.params for c in result.commands if isinstance(c.params, Decide)]
        outcomes = [o.model_dump(mode="json") for o in result.outcomes]
        rows[key].append((offset, commands, decides, outcomes))
    return rows


def copy(
    keys: Sequence[str], values: Sequence[bytes | None], topics: dict[str, list[bytes | None]]
) -> list[bytes | None]:
    copier = MemoryKeys(topics)

    async def run() -> list[bytes | None]:
        await copier.start()
        return await copier.values(records(values, keys))

    return asyncio.run(run())


def test_an_older_log_is_sealed_on_the_way_and_folds_as_it_did() -> None:
    keys, values = demo_log()
    assert in_clear(values)  # the demo was recorded before sealing
    topics: dict[str, list[bytes | None]] = defaultdict(list)
    topics["old.conversations"] = values
    copied = copy(keys, values, topics)
    assert in_clear(copied) == set()
    for text in in_clear(values):
        assert not any(text.encode() in (raw or b"") for raw in copied)
    latest = latest_keys(topics["new.keys"])
    assert set(latest) >= {k for k, v in zip(keys, values, strict=True) if in_clear([v])}
    made = {
        (r.key, r.wrapped)
        for r in (KEY_RECORD.validate_json(v or b"") for v in topics["new.keys"])
        if isinstance(r, WrappedDataKey)
    }
    assert len(made) == len(latest)  # one key per conversation, made once (written again with its contact id)
    assert all(isinstance(r, WrappedDataKey) and r.contact_id is not None for r in latest.values())
    opened = {k: KEKS.unwrap(r.kek_id, r.wrapped, k) for k, r in latest.items() if isinstance(r, WrappedDataKey)}

    before, after = folded(keys, values), folded(keys, copied)
    assert before.keys() == after.keys()
    for conversation, rows in before.items():
        for (offset, commands, decides, outcomes), (_, commands2, decides2, outcomes2) in zip(
            rows, after[conversation], strict=True
        ):
            assert (commands2, outcomes2) == (commands, outcomes), (conversation, offset)
            for plain, sealed in zip(decides, decides2, strict=True):  # the same question, sealed
                assert sealed.text is None and open_input(sealed, opened[conversation]) == plain.text


def test_a_resumed_copy_never_makes_a_second_key() -> None:
    keys, values = demo_log()
    topics: dict[str, list[bytes | None]] = defaultdict(list)
    topics["old.conversations"] = values
    half = len(values) // 2
    copy(keys[:half], values[:half], topics)
    made = latest_keys(topics["new.keys"])
    written = len(topics["new.keys"])
    copy(keys[half:], values[half:], topics)
    again = latest_keys(topics["new.keys"])
    assert all(getattr(again[k], "wrapped", None) == getattr(r, "wrapped", None) for k, r in made.items())
    assert set(again) == {k for k, v in zip(keys, values, strict=True) if in_clear([v])}
    assert written <= len(topics["new.keys"])


def test_without_a_kek_the_copy_stops_at_the_first_field_in_clear() -> None:
    keys, values = demo_log()
    topics: dict[str, list[bytes | None]] = defaultdict(list)
    copier = MemoryKeys(topics, keks=None)
    with pytest.raises(KekNeeded) as raised:
        asyncio.run(copier.values(records(values, keys)))
    assert KEK_VAR in str(raised.value) and "\n" not in str(raised.value)
    assert topics["new.keys"] == []


def test_old_keys_and_fences_are_copied_and_a_forgotten_conversations_text_is_never_readable() -> None:
    keys, values = demo_log()
    forgotten, kept = "1:1", "1:2"
    kept_key = wrapped(kept)
    topics: dict[str, list[bytes | None]] = defaultdict(list)
    topics["old.conversations"] = values
    topics["old.keys"] = [wrapped(forgotten).model_dump_json().encode(), kept_key.model_dump_json().encode()]
    topics["old.keys"].append(fence(forgotten).model_dump_json().encode())  # compaction has not run yet
    copied = copy(keys, values, topics)
    written = [KEY_RECORD.validate_json(raw or b"") for raw in topics["new.keys"]]
    assert [r for r in written if r.key == forgotten] == [fence(forgotten)]  # the fence only, never a key
    assert [r for r in written if r.key == kept] == [kept_key]  # as it was, not a new one
    ours = [raw for k, raw in zip(keys, copied, strict=True) if k == forgotten]
    assert in_clear(ours) == set() and any(sealed_in(decode_conversation_event(raw)) for raw in ours)
    kept_texts = [raw for k, raw in zip(keys, copied, strict=True) if k == kept]
    key = KEKS.unwrap(kept_key.kek_id, kept_key.wrapped, kept)
    events = [decode_conversation_event(raw) for raw in kept_texts]
    turns = [e.result for e in events if isinstance(e, EffectOutcome) and isinstance(e.result, TurnResult)]
    assert turns and all(
        key.open(m.sealed_text, message_field(m.id)) for t in turns for m in t.messages if m.sealed_text
    )


def test_a_forgotten_record_whose_fence_was_lost_gets_its_fence_and_never_a_key() -> None:
    keys, values = demo_log()
    gone = Forgotten(account_id=1, conversation_id=3, reason="asked", at_ms=5)
    keys, values = [*keys, "1:3"], [*values, encode(gone)]
    topics: dict[str, list[bytes | None]] = defaultdict(list)
    topics["old.conversations"] = values
    copied = copy(keys, values, topics)
    assert [KEY_RECORD.validate_json(r or b"") for r in topics["new.keys"] if b'"1:3"' in (r or b"")] == [
        ErasedKey(key="1:3", at_ms=5, reason="asked")
    ]
    assert in_clear([raw for k, raw in zip(keys, copied, strict=True) if k == "1:3"][:-1]) == set()


def test_a_key_the_old_app_made_after_the_copy_made_one_is_resealed_under_the_copys() -> None:
    turn, _ = legacy_outcomes()
    old_key = DataKey.new("1:1")
    topics: dict[str, list[bytes | None]] = defaultdict(list)
    first = [encode(turn)]
    topics["old.conversations"] = list(first)
    copy(["1:1"], first, topics)  # the copy makes 1:1's key
    minted = latest_keys(topics["new.keys"])["1:1"]
    topics["old.keys"] = [wrapped("1:1", old_key).model_dump_json().encode()]  # the old app made its own since
    later = [encode(seal_event(turn, old_key))]
    copied = copy(["1:1"], later, topics)
    assert latest_keys(topics["new.keys"])["1:1"] == minted  # the copy's key stays
    assert isinstance(minted, WrappedDataKey)
    ours = KEKS.unwrap(minted.kek_id, minted.wrapped, "1:1")
    event = decode_conversation_event(copied[0])
    assert isinstance(event, EffectOutcome) and isinstance(event.result, TurnResult)
    assert ours.open(event.result.messages[0].sealed_text or "", message_field(5)) == "my invoice is wrong"


def test_a_key_the_old_app_makes_during_the_copy_is_found_and_its_fields_resealed() -> None:
    turn, _ = legacy_outcomes()
    old_key = DataKey.new("1:1")
    topics: dict[str, list[bytes | None]] = defaultdict(list)
    log = [encode(turn), encode(seal_event(turn, old_key))]
    topics["old.conversations"] = list(log)
    copier = MemoryKeys(topics)

    async def run() -> list[bytes | None]:
        await copier.start()  # the old app has no key for 1:1 yet
        first = await copier.values(records(log[:1], ["1:1"]))
        topics["old.keys"].append(wrapped("1:1", old_key).model_dump_json().encode())  # its worker makes one now
        return first + await copier.values(records(log[1:], ["1:1"]))

    copied = asyncio.run(run())
    minted = latest_keys(topics["new.keys"])["1:1"]
    assert isinstance(minted, WrappedDataKey)
    ours = KEKS.unwrap(minted.kek_id, minted.wrapped, "1:1")
    for raw in copied:
        event = decode_conversation_event(raw)
        assert isinstance(event, EffectOutcome) and isinstance(event.result, TurnResult)
        assert ours.open(event.result.messages[0].sealed_text or "", message_field(5)) == "my invoice is wrong"
