"""Each conversation's data key (issue 32): made the first time a personal field of it is sealed, kept wrapped by
the key-encryption key in the worker's `data_keys` table, whose changelog is the compacted `<app>.keys`.

Only the worker that owns a conversation's partition makes or reads its key (the executor runs there), so a key
is made once: a new key is written in the conversation's partition and acknowledged by Kafka (the commit barrier)
before anything sealed under it leaves the worker; a worker that dies before that leaves no ciphertext behind,
and the next owner makes the key again. After `forget`, the table holds the erasure fence instead, and no key is
ever made for that conversation again.

With ROUTER_TEXT_RETENTION_DAYS the ring also keeps when each key last sealed a text (`used_ms`, written again at
most every `touch_every_ms`), and `expire_text` destroys a key whose text outlived the retention: the fence then
has scope `text`, and the conversation's next text is sealed under a new key.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections import OrderedDict
from collections.abc import AsyncIterator, Awaitable, Callable, Collection, Iterator
from typing import Any, Protocol

from handlers.privacy.envelope import KEY_BYTES, DataKey, KeyEncryptionKey
from handlers.privacy.kek import KeyEncryptionKeys
from handlers.worker.ports import MemoryTable, PartitionScope, Table, any_partition
from schemas.data_keys import KEY_RECORD, ErasedKey, EraseScope, WrappedDataKey

CACHED_KEYS = 4096
YIELD_EVERY = 1000
"""A scan of the keys (rotation, retention) lets the worker's other work run after this many."""


def fence_roll_every_ms(deadline_ms: int) -> int:
    """How often a worker looks for fences past their erasure deadline to write again (`roll_fences`): a twentieth
    of the deadline, between a second and ten minutes; an erased key is gone this much after the deadline at most."""
    return min(600_000, max(1_000, deadline_ms // 20))


class Forgotten(Exception):
    """The conversation was forgotten: nothing of it may be sealed, opened or routed any more."""


class KeyRing(Protocol):
    async def key_for(self, conversation: str, contact_id: int | None = None) -> DataKey:
        """The conversation's data key, made (and durable) first if it has none; `Forgotten` after erasure."""
        ...

    def known(self, conversation: str) -> DataKey | None:
        """The conversation's data key if it has one; `Forgotten` after erasure."""
        ...


class TableKeyRing:
    """Data keys in a table keyed by conversation key (the worker's `data_keys`; a `MemoryTable` in tests)."""

    def __init__(
        self,
        table: Table,
        keks: KeyEncryptionKeys,
        *,
        partition_of: Callable[[str], int] = lambda key: 0,
        scope: PartitionScope = any_partition,
        before_write: Callable[[], None] | None = None,
        durable: Callable[[], Awaitable[None]] | None = None,
        now_ms: Callable[[], int] = lambda: time.time_ns() // 1_000_000,
        touch_every_ms: int | None = None,
    ) -> None:
        self.table = table
        self.touch_every_ms = touch_every_ms
        self.keks = keks
        self.partition_of = partition_of
        self.scope = scope
        self.before_write = before_write
        self.durable = durable
        self.now_ms = now_ms
        # conversation -> (its data key, when the table last said it was used)
        self._cache: OrderedDict[str, tuple[DataKey, int]] = OrderedDict()

    def record(self, conversation: str) -> WrappedDataKey | ErasedKey | None:
        raw = self.table.get(conversation)
        return None if raw is None else KEY_RECORD.validate_python(raw)

    def is_forgotten(self, conversation: str) -> bool:
        """The conversation was forgotten whole: its key is the final fence (read raw: this is asked per command)."""
        raw = self.table.get(conversation)
        return isinstance(raw, dict) and raw.get("type") == "erased" and raw.get("scope", "conversation") != "text"

    def known(self, conversation: str) -> DataKey | None:
        """The conversation's data key; None when it has none (or its text expired); `Forgotten` after erasure."""
        cached = self._cached(conversation)
        return cached[0] if cached is not None else None

    def _cached(self, conversation: str) -> tuple[DataKey, int] | None:
        cached = self._cache.get(conversation)
        if cached is not None:
            self._cache.move_to_end(conversation)
            return cached
        record = self.record(conversation)
        if record is None:
            return None
        if isinstance(record, ErasedKey):
            if record.scope == "text":
                return None  # its text expired: the next one is sealed under a new key
            raise Forgotten(conversation)
        key = self.keks.unwrap(record.kek_id, record.wrapped, conversation)
        return self._remember(key, record.last_used_ms)

    async def key_for(self, conversation: str, contact_id: int | None = None) -> DataKey:
        """The key to seal the conversation's texts under now, made (and durable) first if it has none."""
        cached = self._cached(conversation)
        if cached is not None:
            key, used_ms = cached
            if self.touch_every_ms is not None and self.now_ms() - used_ms >= self.touch_every_ms:
                self._touch(conversation)  # the retention counts from here (lost in a crash: counted from before)
            return key
        key = DataKey.new(conversation)
        current: KeyEncryptionKey = self.keks.current
        now = self.now_ms()
        replaced = self.record(conversation)  # a text fence, or nothing (`_cached` raised on any other fence)
        record = WrappedDataKey(
            key=conversation,
            kek_id=current.kek_id,
            wrapped=current.wrap(key),
            created_ms=now,
            contact_id=contact_id,
            fence_ms=replaced.at_ms if isinstance(replaced, ErasedKey) and replaced.again_ms is None else None,
        )
        self._write(conversation, record)  # a worker that may have lost the partition writes no key (the fence)
        if self.durable is not None:
            await self.durable()  # acknowledged before anything sealed under it can leave the worker
        self._remember(key, now)
        return key

    def _touch(self, conversation: str) -> None:
        record = self.record(conversation)
        if not isinstance(record, WrappedDataKey):
            return
        now = self.now_ms()
        self._write(conversation, record.model_copy(update={"used_ms": now}))
        cached = self._cache.get(conversation)
        if cached is not None:
            self._cache[conversation] = (cached[0], now)

    def _write(self, conversation: str, record: WrappedDataKey | ErasedKey) -> None:
        if self.before_write is not None:
            self.before_write()
        with self.scope(self.partition_of(conversation)):
            self.table.set(conversation, record.model_dump(mode="json"))

    def erase(
        self,
        conversation: str,
        at_ms: int,
        reason: str,
        *,
        scope: EraseScope = "conversation",
        request_id: str | None = None,
    ) -> None:
        """Replace the conversation's key with the erasure fence (the caller waits at the barrier); a fence of
        scope `text` keeps the contact id of the key it replaces (`forget --contact` finds the conversation)."""
        self._cache.pop(conversation, None)
        before = self.record(conversation) if scope == "text" else None
        contact_id = before.contact_id if before is not None else None
        fence = ErasedKey(
            key=conversation, at_ms=at_ms, reason=reason, scope=scope, request_id=request_id, contact_id=contact_id
        )
        self._write(conversation, fence)

    def text_outlived(self, conversation: str, cutoff_ms: int) -> bool:
        """The conversation has a data key last used at or before `cutoff_ms` (ROUTER_TEXT_RETENTION_DAYS)."""
        record = self.record(conversation)
        return isinstance(record, WrappedDataKey) and record.last_used_ms <= cutoff_ms

    def used_times(self, owned: Collection[int]) -> Iterator[tuple[str, int]]:
        """Each data key of the `owned` partitions, with when it last sealed a text (the retention's scan)."""
        for conversation, raw in self.table.items():
            record = KEY_RECORD.validate_python(raw)
            if isinstance(record, WrappedDataKey) and self.partition_of(conversation) in owned:
                yield conversation, record.last_used_ms

    async def _owned(self, owned: Collection[int], wanted: Callable[[dict[str, Any]], bool]) -> AsyncIterator[str]:
        """The conversations of the `owned` partitions whose stored record (raw) is `wanted`: the table read lazily,
        letting the worker's other work run every `YIELD_EVERY` keys. A caller reads each one again right before
        it writes it (`record`), so a write that came in between is never overwritten."""
        for seen, (conversation, raw) in enumerate(self.table.items(), 1):
            if seen % YIELD_EVERY == 0:
                await asyncio.sleep(0)
            if isinstance(raw, dict) and wanted(raw) and self.partition_of(conversation) in owned:
                yield conversation

    async def rewrap_retired(self, owned: Collection[int], limit: int = 1000) -> int:
        """Wrap again under the current KEK up to `limit` data keys of the `owned` partitions that a retired KEK
        wrapped (the rotation: docs/privacy.md); returns how many. Only this partition's owner writes its keys."""
        current = self.keks.current
        done = 0
        async for conversation in self._owned(owned, lambda raw: raw.get("kek_id") not in (None, current.kek_id)):
            if done >= limit:
                break
            record = self.record(conversation)
            if not isinstance(record, WrappedDataKey) or record.kek_id == current.kek_id:
                continue
            key = self.keks.unwrap(record.kek_id, record.wrapped, conversation)
            self._write(
                conversation, record.model_copy(update={"kek_id": current.kek_id, "wrapped": current.wrap(key)})
            )
            done += 1
        if done and self.durable is not None:
            await self.durable()
        return done

    async def roll_fences(self, owned: Collection[int], deadline_ms: int, limit: int = 1000) -> set[int]:
        """Write again, once, each fence of the `owned` partitions whose erasure deadline has passed: Kafka rolls the
        active segment of `<app>.keys` (at `max.compaction.lag.ms`) only when a record is appended, so on a partition
        nothing else writes to, the segment holding the erased key's old value would never be compacted. A key
        made over a text fence before that fence was written again stands for it (`fence_ms`). Returns the
        partitions written (the caller compacts its own store of them too)."""
        now = self.now_ms()

        def due(raw: dict[str, Any]) -> bool:
            if raw.get("type") == "erased":
                return raw.get("again_ms") is None and raw["at_ms"] + deadline_ms <= now
            return raw.get("fence_ms") is not None and raw["fence_ms"] + deadline_ms <= now

        rolled: set[int] = set()
        done = 0
        async for conversation in self._owned(owned, due):
            if done >= limit:
                break
            record = self.record(conversation)
            if isinstance(record, ErasedKey) and record.again_ms is None:
                self._write(conversation, record.model_copy(update={"again_ms": now}))
            elif isinstance(record, WrappedDataKey) and record.fence_ms is not None:
                self._write(conversation, record.model_copy(update={"fence_ms": None}))
            else:
                continue
            rolled.add(self.partition_of(conversation))
            done += 1
        if rolled and self.durable is not None:
            await self.durable()
        return rolled

    def forget_cached(self) -> None:
        """At a rebalance: keys of partitions that moved are read again from the table when next needed."""
        self._cache.clear()

    def _remember(self, key: DataKey, used_ms: int) -> tuple[DataKey, int]:
        self._cache[key.conversation] = entry = (key, used_ms)
        while len(self._cache) > CACHED_KEYS:
            self._cache.popitem(last=False)
        return entry


def memory_keyring(keks: KeyEncryptionKeys | None = None) -> TableKeyRing:
    """Data keys in memory under a fresh KEK: for an executor outside a worker (tests, benchmarks)."""
    return TableKeyRing(MemoryTable(), keks or KeyEncryptionKeys(KeyEncryptionKey(os.urandom(KEY_BYTES))))
