"""ROUTER_TEXT_RETENTION_DAYS (issue 32): a conversation's text is erased a set time after its key last sealed
one, between turns only; its decisions stay, it is still routed, and what the customer writes next is sealed under
a new key. And the automatic erasure of a conversation Chatwoot no longer has survives a crash before it was
durable. The worker service runs in-process on memory tables (tests/unit/test_worker_service.py's bus)."""

from __future__ import annotations

import asyncio
import base64
import json

import pytest

from handlers.privacy.kek import KEK_VAR, require_keks
from handlers.privacy.keyring import Forgotten, TableKeyRing
from handlers.privacy.reader_keys import ReaderKeys
from handlers.privacy.retention import TEXT_RETENTION, TextRetention, scan_every_s, text_request, touch_every_ms
from handlers.worker.ports import MemorySink, MemoryTable
from handlers.worker.service import WorkerService, WorkerTables
from projections.fold import fold
from schemas.config import ConfigError, read_env
from schemas.data_keys import KEY_RECORD, ErasedKey, WrappedDataKey
from schemas.records import ForgetRequested
from schemas.records import Forgotten as ForgottenRecord
from schemas.state import ConversationState, Job
from streams.admin.forget_cmd import proof_in
from tests.unit.test_fold_driver import T0, FakeChatwoot, incoming, make_config
from tests.unit.test_worker_service import KEY, Bus, deliver, new_service, new_tables, run_until_quiet, state, webhook

KEK = base64.b64encode(bytes(range(32))).decode()
DAY = 86_400_000


class Clock:
    def __init__(self, now: int) -> None:
        self.now = now

    def __call__(self) -> int:
        return self.now


def ring(table: MemoryTable, clock: Clock, retention: int | None = DAY) -> TableKeyRing:
    return TableKeyRing(table, require_keks({KEK_VAR: KEK}), now_ms=clock, touch_every_ms=touch_every_ms(retention))


def stored(table: MemoryTable, key: str = KEY) -> WrappedDataKey | ErasedKey:
    return KEY_RECORD.validate_python(table.get(key))


def test_the_key_says_when_it_last_sealed_a_text_at_most_an_hour_stale_and_only_with_a_retention() -> None:
    table, clock = MemoryTable(), Clock(T0)
    keys = ring(table, clock)
    asyncio.run(keys.key_for(KEY))
    assert stored(table) == stored(table).model_copy(update={"used_ms": None})  # created: counted from then
    writes = table.writes
    clock.now += 3_599_000
    asyncio.run(keys.key_for(KEY))
    assert table.writes == writes  # not yet stale enough to write again
    clock.now += 1_000
    asyncio.run(keys.key_for(KEY))
    record = stored(table)
    assert isinstance(record, WrappedDataKey) and record.used_ms == clock.now and record.last_used_ms == clock.now
    untouched, other = MemoryTable(), Clock(T0)
    without = ring(untouched, other, retention=None)
    asyncio.run(without.key_for(KEY))
    other.now += 30 * DAY
    asyncio.run(without.key_for(KEY))
    assert "used_ms" not in (untouched.get(KEY) or {})  # no retention, no writes: the keys topic keeps its bytes


def test_a_text_fence_destroys_the_key_and_the_next_text_gets_a_new_one_unlike_forget() -> None:
    table, clock = MemoryTable(), Clock(T0)
    keys = ring(table, clock)
    first = asyncio.run(keys.key_for(KEY))
    keys.erase(KEY, T0 + 1, TEXT_RETENTION, scope="text", request_id="r1")
    assert table.get(KEY) == {
        "v": 1, "key": KEY, "type": "erased", "at_ms": T0 + 1, "reason": TEXT_RETENTION, "scope": "text",
        "request_id": "r1",
    }  # fmt: skip
    assert keys.known(KEY) is None  # no key now, and no Forgotten: the conversation lives on
    second = asyncio.run(keys.key_for(KEY))
    assert second.material != first.material and isinstance(stored(table), WrappedDataKey)
    keys.erase(KEY, T0 + 2, "customer asked")
    with pytest.raises(Forgotten):
        asyncio.run(keys.key_for(KEY))


def test_the_scan_asks_once_for_each_idle_conversation_whose_text_outlived_the_retention() -> None:
    table, clock = MemoryTable(), Clock(T0)
    keys = ring(table, clock)
    keys.partition_of = lambda key: int(key.split(":")[1]) % 2
    for conversation in ("1:2", "1:4", "1:6", "1:3"):
        asyncio.run(keys.key_for(conversation))
    clock.now += DAY - 1
    asyncio.run(keys.key_for("1:6"))  # used again later: its day counts from now
    clock.now += 1
    busy = ConversationState(job=Job(not_before=0, created_at=0))
    states = {"1:4": busy}
    retention = TextRetention(keys, DAY)
    asked = asyncio.run(retention.requests({0}, states.get, clock.now))
    assert [r.key for r in asked] == ["1:2"]  # 1:4 is mid-turn, 1:6 was used since, 1:3 is another partition's
    assert asked[0].scope == "text" and asked[0].reason == TEXT_RETENTION
    assert asyncio.run(retention.requests({0}, states.get, clock.now)) == []  # asked already
    assert retention.due("1:2", None, clock.now) and not retention.due("1:4", busy, clock.now)


def test_the_retention_is_read_in_days_and_a_bad_value_names_the_variable() -> None:
    assert read_env({"ROUTER_TEXT_RETENTION_DAYS": "30"}).text_retention_days == 30.0
    assert read_env({}).text_retention_days is None
    with pytest.raises(ConfigError, match=r"ROUTER_TEXT_RETENTION_DAYS.*days"):
        read_env({"ROUTER_TEXT_RETENTION_DAYS": "0"})
    assert scan_every_s(30 * DAY) == 600.0 and scan_every_s(20_000) == 1.0


def test_a_text_erasure_leaves_the_conversation_routable_in_the_fold() -> None:
    proof = ForgottenRecord(
        at_ms=T0, account_id=1, conversation_id=7, reason=TEXT_RETENTION, request_id="r", scope="text"
    )
    assert "scope" not in ForgottenRecord.model_validate({**proof.model_dump(), "scope": "conversation"}).model_dump()
    result = fold(ConversationState(), proof, 5, make_config())
    assert result.state.forgotten_ms is None and result.state.offset == 5


def retention_service(
    tables: WorkerTables, chatwoot: FakeChatwoot, clock: Clock, keys_table: MemoryTable
) -> WorkerService:
    service = new_service(tables, chatwoot)
    service.now_ms = clock
    keys = ring(keys_table, clock)
    service.keyring = keys
    service.retention = TextRetention(keys, DAY)
    return service


def keyring_of(service: WorkerService) -> TableKeyRing:
    assert service.keyring is not None
    return service.keyring


def proofs(bus: Bus) -> list[ForgottenRecord]:
    found = []
    for record in bus.records("conversations"):
        if b'"forgotten"' in (record.value or b""):
            found.append(ForgottenRecord.model_validate_json(record.value or b""))
    return found


async def test_a_routed_conversation_loses_its_text_after_the_retention_and_is_routed_again_after() -> None:
    chatwoot = FakeChatwoot(messages=[incoming(1, "I was charged twice")])
    tables, bus, keys_table, clock = new_tables(), Bus(), MemoryTable(), Clock(T0)
    service = retention_service(tables, chatwoot, clock, keys_table)
    await keyring_of(service).key_for(KEY)  # what the executor's read does (it seals the turn)
    webhook(bus)
    await run_until_quiet(service, bus)
    assert chatwoot.ops()[-1] == "assign"
    assert await service.request_text_expiry({0}) == 0  # not yet
    clock.now += DAY
    assert await service.request_text_expiry({0}) == 1
    assert isinstance(service.sink, MemorySink)
    bus.collect(service.sink)
    await run_until_quiet(service, bus)
    fence = stored(keys_table)
    assert isinstance(fence, ErasedKey) and fence.scope == "text" and fence.at_ms == clock.now
    [proof] = proofs(bus)
    assert proof.scope == "text" and proof.key == KEY and proof.request_id == fence.request_id
    assert state(tables).forgotten_ms is None and state(tables).run is None

    request = next(r for r in bus.records("conversations") if b"forget_requested" in (r.value or b""))
    restarted = retention_service(tables, chatwoot, clock, keys_table)
    await deliver(restarted, bus, request)  # delivered again (a crash before its offset was committed)
    assert len(proofs(bus)) == 2 and stored(keys_table) == fence  # the proof again, the fence as it was

    await keyring_of(restarted).key_for(KEY)  # the customer writes again: a new key
    assert isinstance(stored(keys_table), WrappedDataKey)
    again = retention_service(tables, chatwoot, clock, keys_table)
    await deliver(again, bus, request)  # a stale request does nothing to the new key
    assert isinstance(stored(keys_table), WrappedDataKey) and len(proofs(bus)) == 2


async def test_a_request_folded_after_the_conversation_started_a_turn_erases_nothing() -> None:
    chatwoot = FakeChatwoot(messages=[incoming(1, "I was charged twice")])
    tables, bus, keys_table, clock = new_tables(), Bus(), MemoryTable(), Clock(T0)
    service = retention_service(tables, chatwoot, clock, keys_table)
    await keyring_of(service).key_for(KEY)
    clock.now += DAY
    request = text_request(KEY, T0, clock.now)
    webhook(bus)  # the customer wrote before the scan's request was folded
    await deliver(service, bus, bus.records("conversations")[0])
    assert state(tables).run is not None or state(tables).job is not None
    await deliver(service, bus, bus.append("conversations", KEY, request.model_dump_json().encode()))
    assert isinstance(stored(keys_table), WrappedDataKey) and proofs(bus) == []


async def test_a_conversation_chatwoot_deleted_is_erased_even_when_a_crash_came_before_the_erasure() -> None:
    chatwoot = FakeChatwoot(messages=[incoming(1, "I was charged twice")], missing=True)
    tables, bus, keys_table, clock = new_tables(), Bus(), MemoryTable(), Clock(T0)
    service = retention_service(tables, chatwoot, clock, keys_table)
    await keyring_of(service).key_for(KEY)
    webhook(bus)
    await run_until_quiet(service, bus)
    assert isinstance(stored(keys_table), ErasedKey) and [p.reason for p in proofs(bus)] == ["conversation_missing"]

    # the same history on a worker that died after folding the answer but before its erasure was durable
    tables2, bus2, keys2 = new_tables(), Bus(), MemoryTable()
    crashed = retention_service(tables2, FakeChatwoot(messages=[incoming(1, "x")], missing=True), clock, keys2)
    await keyring_of(crashed).key_for(KEY)
    crashed.keyring = None  # no erasure this time: the fold's state is written, the fence is not
    webhook(bus2)
    await run_until_quiet(crashed, bus2)
    assert isinstance(stored(keys2), WrappedDataKey) and proofs(bus2) == []
    answer = next(r for r in bus2.records("conversations") if b'"missing"' in (r.value or b""))
    restarted = retention_service(tables2, FakeChatwoot(missing=True), clock, keys2)
    await deliver(restarted, bus2, answer)  # delivered again: folded already, and the key still lives
    assert isinstance(stored(keys2), ErasedKey) and [p.reason for p in proofs(bus2)] == ["conversation_missing"]


def test_fences_past_the_erasure_deadline_are_written_again_once_by_their_owner() -> None:
    """docs/privacy.md "The erasure deadline": Kafka rolls a keys partition's segment only when a record is
    appended, so the owner writes each fence again once its deadline has passed, and only once."""
    table, clock = MemoryTable(), Clock(T0)
    keys = ring(table, clock)
    keys.partition_of = lambda key: int(key.split(":")[1]) % 2
    for conversation in ("1:2", "1:3", "1:4"):
        asyncio.run(keys.key_for(conversation))
        keys.erase(conversation, T0, "customer asked")
    asyncio.run(keys.key_for("1:6"))  # a live key is never written by the roll
    deadline = 60_000
    clock.now = T0 + deadline - 1
    assert asyncio.run(keys.roll_fences({0}, deadline)) == set()  # not yet
    clock.now += 1
    assert asyncio.run(keys.roll_fences({0}, deadline)) == {0}
    for conversation in ("1:2", "1:4"):
        fence = stored(table, conversation)
        assert isinstance(fence, ErasedKey) and fence.again_ms == clock.now and fence.reason == "customer asked"
    assert stored(table, "1:3") == ErasedKey(key="1:3", at_ms=T0, reason="customer asked")  # another owner's
    assert isinstance(stored(table, "1:6"), WrappedDataKey)
    writes = table.writes
    clock.now += deadline
    assert asyncio.run(keys.roll_fences({0}, deadline)) == set() and table.writes == writes  # once


def test_a_key_made_over_a_text_fence_before_its_deadline_is_written_again_in_its_place() -> None:
    """The customer writes again before the text erasure's deadline: the fence is replaced by a new key, and the
    owner writes that key again once past the deadline (so the erased key's old value leaves a quiet partition),
    once, and it still opens what was sealed under it."""
    table, clock = MemoryTable(), Clock(T0)
    keys = ring(table, clock)
    asyncio.run(keys.key_for(KEY, contact_id=7))
    keys.erase(KEY, T0, "text_retention", scope="text")
    clock.now = T0 + 1_000
    key = asyncio.run(keys.key_for(KEY, contact_id=7))
    made = stored(table)
    assert isinstance(made, WrappedDataKey) and made.fence_ms == T0
    deadline = 60_000
    clock.now = T0 + deadline - 1
    assert asyncio.run(keys.roll_fences({0}, deadline)) == set()  # not yet
    clock.now += 1
    assert asyncio.run(keys.roll_fences({0}, deadline)) == {0}
    assert stored(table) == made.model_copy(update={"fence_ms": None})
    writes = table.writes
    clock.now += deadline
    assert asyncio.run(keys.roll_fences({0}, deadline)) == set() and table.writes == writes  # once
    keys.forget_cached()
    assert keys.known(KEY) == key

    # a fence already written again needs nothing of the key made over it
    keys.erase(KEY, clock.now, "text_retention", scope="text")
    clock.now += deadline
    assert asyncio.run(keys.roll_fences({0}, deadline)) == {0}
    asyncio.run(keys.key_for(KEY))
    again = stored(table)
    assert isinstance(again, WrappedDataKey) and again.fence_ms is None


def forget_request(request_id: str) -> bytes:
    return (
        ForgetRequested(at_ms=T0, account_id=1, conversation_id=2, reason="customer asked", request_id=request_id)
        .model_dump_json()
        .encode()
    )


async def test_a_command_issued_before_an_erasure_and_consumed_after_it_is_never_executed() -> None:
    """Found by `bench/chaos.py --forget-rate`: the fold awaits the command until the worker folds its own
    `Forgotten`, so admission alone would still let it run against Chatwoot."""
    chatwoot = FakeChatwoot(messages=[incoming(1, "I was charged twice")])
    tables, bus, keys_table, clock = new_tables(), Bus(), MemoryTable(), Clock(T0)
    service = retention_service(tables, chatwoot, clock, keys_table)
    webhook(bus)
    await deliver(service, bus, bus.records("conversations")[0])  # folded: its first read is issued
    [command] = bus.records("effects")
    await deliver(service, bus, bus.append("conversations", KEY, forget_request("r1")))
    await deliver(service, bus, command)  # consumed after the erasure, before `Forgotten` is folded
    assert chatwoot.ops() == [] and [p.request_id for p in proofs(bus)] == ["r1"]


async def test_forgetting_a_forgotten_conversation_again_is_confirmed_with_the_fence_as_it_was() -> None:
    tables, bus, keys_table, clock = new_tables(), Bus(), MemoryTable(), Clock(T0)
    service = retention_service(tables, FakeChatwoot(), clock, keys_table)
    await keyring_of(service).key_for(KEY)
    bus.append("conversations", KEY, forget_request("r1"))
    await run_until_quiet(service, bus)
    fence = stored(keys_table)
    clock.now += 1000
    bus.append("conversations", KEY, forget_request("r2"))
    await run_until_quiet(service, bus)
    assert [p.request_id for p in proofs(bus)] == ["r1", "r2"]  # `forget` waits for its own request's proof
    assert stored(keys_table) == fence and proofs(bus)[1].at_ms == fence.at_ms == T0


def test_forget_passes_over_records_that_only_mention_forgotten() -> None:
    outcome = b'{"type":"effect_outcome","error":{"kind":"missing","reason":"forgotten"}}'
    assert proof_in(outcome) is None and proof_in(None) is None
    proof = ForgottenRecord(at_ms=T0, account_id=1, conversation_id=2, reason="x", request_id="r")
    assert proof_in(proof.model_dump_json().encode()) == proof


def test_a_text_erasure_keeps_the_contact_so_forget_by_contact_still_finds_the_conversation() -> None:
    table, clock = MemoryTable(), Clock(T0)
    keys = ring(table, clock)
    asyncio.run(keys.key_for("1:2", contact_id=42))
    asyncio.run(keys.key_for("1:3", contact_id=42))
    keys.erase("1:2", T0, TEXT_RETENTION, scope="text", request_id="r")
    keys.erase("1:3", T0, "customer asked")
    fence = stored(table, "1:2")
    assert isinstance(fence, ErasedKey) and fence.contact_id == 42
    reader = ReaderKeys(None)
    for conversation in ("1:2", "1:3"):
        reader.add(json.dumps(table.get(conversation)).encode())
    assert reader.contacts == {"1:2": 42}  # a conversation forgotten whole is not found again
