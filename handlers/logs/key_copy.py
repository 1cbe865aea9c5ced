"""`replay state --to-app`: a partition's data keys go with its records, and what an older log holds in clear is
sealed on the way (issue 32; docs/privacy.md "Logs written before sealing").

Before a partition's records are copied, the latest value of each conversation's key on `<old>.keys` is written to
the same partition of `<new>.keys` (`handlers/privacy/resealing.py` `key_to_copy`: wrapped keys as they are, fences
as they are, a final fence never replaced by a key). Then each `conversations` record goes through `values`:

- most records are copied byte for byte: only one whose bytes show a personal field in clear, a sealed one of a
  conversation whose key changed, or a `Forgotten` is decoded;
- a field in clear is sealed under the conversation's key in the new app, made (`DataKey.new`) and written wrapped
  under the current KEK first when it has none; a field of a forgotten conversation, or read before an erasure, is
  sealed under a throwaway key nobody keeps (it stays erased; the fold still decides as it did);
- every key a batch needs is acknowledged by Kafka before any record of that batch is sent, so a reader of the new
  app (and its worker) finds the key of every sealed record it reads.

A resumed copy reads what `<new>.keys` holds first, so it never makes a second key for a conversation. Copying
keys needs no KEK (they stay wrapped); sealing does: without one the copy stops at the first field in clear, before
sending it (`KekNeeded`, one line naming the variable).
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable

from aiokafka import AIOKafkaProducer, ConsumerRecord

from handlers.logs.reader import Records, plan, read
from handlers.privacy.envelope import CannotOpen, DataKey
from handlers.privacy.kek import KEK_VAR, RETIRED_VAR, KeyEncryptionKeys, UnknownKek
from handlers.privacy.resealing import (
    Erasures,
    KeyRecord,
    contact_of,
    fence_of,
    forgets_whole,
    is_final,
    key_to_copy,
    latest_keys,
    plaintext_fate,
    plaintext_in,
    seal_event,
    sealed_in,
)
from projections.logs.rebuild import changelog_key
from schemas.codec import Undecodable, decode_conversation_event, encode
from schemas.data_keys import ErasedKey, WrappedDataKey
from schemas.records import Forgotten, Record

# JSON keys whose value is a string: inside a JSON string every quote is escaped, so these match keys only
IN_CLEAR = re.compile(rb'"(?:text|email_domain)"\s*:\s*"')
SEALED = re.compile(rb'"sealed_(?:text|email_domain)"\s*:\s*"')
FORGOTTEN = re.compile(rb'"type"\s*:\s*"forgotten"')


class KekNeeded(Exception):
    """The copy has to seal or open a personal field and was given no key-encryption key; `str()` is one line."""


class PartitionKeys:
    """One partition's data keys during a copy from `source_app` into `target_app`."""

    def __init__(
        self,
        bootstrap: str,
        source_app: str,
        target_app: str,
        partition: int,
        producer: AIOKafkaProducer,
        keks: KeyEncryptionKeys | None,
        now_ms: Callable[[], int] = lambda: time.time_ns() // 1_000_000,
    ) -> None:
        self.bootstrap, self.source_app, self.target_app = bootstrap, source_app, target_app
        self.partition = partition
        self.producer = producer
        self.keks = keks
        self.now_ms = now_ms
        self.old: dict[str, KeyRecord] = {}
        self.new: dict[str, KeyRecord] = {}
        self.reseal: set[str] = set()
        self.written = 0
        self.sealed = 0
        self._erasures: Erasures | None = None  # read on the first field in clear (only older logs pay for it)
        self._refreshed: set[str] = set()
        self._opened: dict[tuple[str, str], DataKey] = {}
        self._throwaway: dict[str, DataKey] = {}

    async def start(self) -> None:
        """Read what the new app holds, then copy what it lacks of the old app's keys."""
        self.new = latest_keys(await self._values(f"{self.target_app}.keys"))
        await self._take_old()

    async def values(self, batch: Records) -> list[bytes | None]:
        """The values to copy for `batch` (same order), once every key they need is durable on `<new>.keys`."""
        writes: list[KeyRecord] = []
        out = [await self._value(record, writes) for record in batch]
        await self._write(writes)
        return out

    async def _value(self, record: ConsumerRecord[bytes, bytes], writes: list[KeyRecord]) -> bytes | None:
        raw = record.value
        if raw is None or record.key is None:
            return raw
        if FORGOTTEN.search(raw):
            event = _decoded(raw)
            if isinstance(event, Forgotten) and forgets_whole(event) and not is_final(self.new.get(event.key)):
                self._queue(fence_of(event), writes)  # a `keys` topic that lost the fence gets it back
            return raw
        in_clear = IN_CLEAR.search(raw) is not None
        if not in_clear:
            if SEALED.search(raw) is None:
                return raw
            conversation = record.key.decode(errors="replace")
            if conversation not in self.old and conversation not in self._refreshed:
                self._refreshed.add(conversation)  # its key was written after this copy read the old app's keys
                await self._take_old()
            if conversation not in self.reseal:
                return raw
        event = _decoded(raw)
        if event is None:
            return None if in_clear else raw  # never copied in clear; the fold counts it undecodable as before
        key_of = getattr(event, "key", None)
        if not isinstance(key_of, str):
            return raw
        fenced = isinstance(self.new.get(key_of), ErasedKey)
        if plaintext_in(event):
            key = await self._sealing_key(key_of, record.offset, event, writes)
        elif key_of in self.reseal and sealed_in(event) and not fenced:
            key = self._open(self.new[key_of])
        else:
            return raw
        erased = key is self._throwaway.get(key_of)
        source = self._open(self.old[key_of]) if key_of in self.reseal and not (fenced or erased) else None
        self.sealed += 1
        return encode(seal_event(event, key, source))

    async def _sealing_key(self, conversation: str, offset: int, event: Record, writes: list[KeyRecord]) -> DataKey:
        erasures = await self._erasures_of(writes)
        target = self.new.get(conversation)
        fate = plaintext_fate(conversation, offset, target, erasures)
        if fate == "erase":
            return self._throwaway.setdefault(conversation, DataKey.new(conversation))
        keks = self._keks()
        contact = contact_of(event)
        if fate == "mint":
            key = DataKey.new(conversation)
            wrapped = WrappedDataKey(
                key=conversation,
                kek_id=keks.current.kek_id,
                wrapped=keks.current.wrap(key),
                created_ms=self.now_ms(),
                contact_id=contact,
            )
            self._queue(wrapped, writes)
            self._opened[(conversation, wrapped.wrapped)] = key
            return key
        assert isinstance(target, WrappedDataKey)
        if contact is not None and target.contact_id is None and conversation not in self.old:
            self._queue(target.model_copy(update={"contact_id": contact}), writes)  # a key this copy made
        return self._open(target)

    async def _erasures_of(self, writes: list[KeyRecord]) -> Erasures:
        """The partition's `Forgotten` records, read once: a text read before an erasure is erased too, and a
        conversation forgotten whole never gets a key (its fence is written now if `keys` lost it)."""
        if self._erasures is None:
            erasures = Erasures()
            for offset, raw in await self._forgotten_records():
                event = _decoded(raw)
                if isinstance(event, Forgotten):
                    erasures.add(offset, event)
            for forgotten in erasures.whole.values():
                if not is_final(self.new.get(forgotten.key)):
                    self._queue(fence_of(forgotten), writes)
            self._erasures = erasures
        return self._erasures

    async def _forgotten_records(self) -> list[tuple[int, bytes]]:
        """(offset, value) of what looks like a `Forgotten` record in the old app's partition, to its end now."""
        source = await plan(
            self.bootstrap, f"{self.source_app}.conversations", partitions=[self.partition], look_at_heads=False
        )
        found: list[tuple[int, bytes]] = []

        def take(partition: int, records: Records) -> None:
            found.extend((r.offset, r.value) for r in records if r.value is not None and FORGOTTEN.search(r.value))

        await read(self.bootstrap, source.spans, take)
        return found

    async def _take_old(self) -> None:
        self.old = latest_keys(await self._values(f"{self.source_app}.keys"))
        writes: list[KeyRecord] = []
        for conversation, old in self.old.items():
            plan_ = key_to_copy(old, self.new.get(conversation), self._same_key)
            if plan_.write is not None:
                self._queue(plan_.write, writes)
            if plan_.reseal:
                self.reseal.add(conversation)
            else:
                self.reseal.discard(conversation)
        await self._write(writes)

    def _same_key(self, old: WrappedDataKey, new: WrappedDataKey) -> bool:
        return self._open(old).material == self._open(new).material

    def _open(self, record: KeyRecord) -> DataKey:
        assert isinstance(record, WrappedDataKey)
        cached = self._opened.get((record.key, record.wrapped))
        if cached is None:
            try:
                cached = self._keks().unwrap(record.kek_id, record.wrapped, record.key)
            except UnknownKek as exc:
                raise KekNeeded(f"{exc}: give it as {KEK_VAR} or in {RETIRED_VAR}") from None
            except CannotOpen:
                raise KekNeeded(f"the data key of {record.key} does not open under {KEK_VAR}") from None
            self._opened[(record.key, record.wrapped)] = cached
        return cached

    def _keks(self) -> KeyEncryptionKeys:
        if self.keks is None:
            raise KekNeeded(
                f"{self.source_app}.conversations[{self.partition}] holds customer text or e-mail domains that the "
                f"copy must seal: set {KEK_VAR} (or {KEK_VAR}_FILE) to the key-encryption key of {self.target_app}'s "
                "workers and run it again (nothing was copied in clear)"
            )
        return self.keks

    def _queue(self, record: KeyRecord, writes: list[KeyRecord]) -> None:
        writes.append(record)
        self.new[record.key] = record

    async def _write(self, writes: list[KeyRecord]) -> None:
        topic = f"{self.target_app}.keys"
        pending = [
            await self.producer.send(
                topic, key=changelog_key(r.key), value=r.model_dump_json().encode(), partition=self.partition
            )
            for r in writes
        ]
        for sent in pending:
            await sent
        self.written += len(pending)

    async def _values(self, topic: str) -> list[bytes | None]:
        try:
            spans = (await plan(self.bootstrap, topic, partitions=[self.partition], look_at_heads=False)).spans
        except LookupError:  # an app from before issue 32 has no keys topic
            return []
        found: list[bytes | None] = []

        def take(partition: int, records: Records) -> None:
            found.extend(record.value for record in records)

        await read(self.bootstrap, spans, take)
        return found


def _decoded(raw: bytes) -> Record | None:
    try:
        event: Record = decode_conversation_event(raw)
    except Undecodable:
        return None
    return event
