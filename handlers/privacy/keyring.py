"""Each conversation's data key (issue 32): made the first time a personal field of it is sealed, kept wrapped by
the key-encryption key in the worker's `data_keys` table, whose changelog is the compacted `<app>.keys`.

Only the worker that owns a conversation's partition makes or reads its key (the executor runs there), so a key
is made once: a new key is written in the conversation's partition and acknowledged by Kafka (the commit barrier)
before anything sealed under it leaves the worker; a worker that dies before that leaves no ciphertext behind,
and the next owner makes the key again. After `forget`, the table holds the erasure fence instead, and no key is
ever made for that conversation again.
"""

from __future__ import annotations

import os
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Collection
from typing import Protocol

from handlers.privacy.envelope import KEY_BYTES, DataKey, KeyEncryptionKey
from handlers.privacy.kek import KeyEncryptionKeys
from handlers.worker.ports import MemoryTable, PartitionScope, Table, any_partition
from schemas.data_keys import KEY_RECORD, ErasedKey, WrappedDataKey

CACHED_KEYS = 4096


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
    ) -> None:
        self.table = table
        self.keks = keks
        self.partition_of = partition_of
        self.scope = scope
        self.before_write = before_write
        self.durable = durable
        self.now_ms = now_ms
        self._cache: OrderedDict[str, DataKey] = OrderedDict()

    def known(self, conversation: str) -> DataKey | None:
        cached = self._cache.get(conversation)
        if cached is not None:
            self._cache.move_to_end(conversation)
            return cached
        raw = self.table.get(conversation)
        if raw is None:
            return None
        record = KEY_RECORD.validate_python(raw)
        if isinstance(record, ErasedKey):
            raise Forgotten(conversation)
        key = self.keks.unwrap(record.kek_id, record.wrapped, conversation)
        self._remember(key)
        return key

    async def key_for(self, conversation: str, contact_id: int | None = None) -> DataKey:
        key = self.known(conversation)
        if key is not None:
            return key
        key = DataKey.new(conversation)
        current: KeyEncryptionKey = self.keks.current
        record = WrappedDataKey(
            key=conversation,
            kek_id=current.kek_id,
            wrapped=current.wrap(key),
            created_ms=self.now_ms(),
            contact_id=contact_id,
        )
        if self.before_write is not None:
            self.before_write()  # a worker that may have lost the partition writes no key (the fence)
        with self.scope(self.partition_of(conversation)):
            self.table.set(conversation, record.model_dump(mode="json"))
        if self.durable is not None:
            await self.durable()  # acknowledged before anything sealed under it can leave the worker
        self._remember(key)
        return key

    def erase(self, conversation: str, at_ms: int, reason: str) -> None:
        """Replace the conversation's key with the erasure fence (the caller waits at the barrier)."""
        self._cache.pop(conversation, None)
        fence = ErasedKey(key=conversation, at_ms=at_ms, reason=reason)
        if self.before_write is not None:
            self.before_write()
        with self.scope(self.partition_of(conversation)):
            self.table.set(conversation, fence.model_dump(mode="json"))

    async def rewrap_retired(self, owned: Collection[int], limit: int = 1000) -> int:
        """Wrap again under the current KEK up to `limit` data keys of the `owned` partitions that a retired KEK
        wrapped (the rotation: docs/privacy.md); returns how many. Only this partition's owner writes its keys."""
        current = self.keks.current
        done = 0
        for conversation, raw in list(self.table.items()):
            if done >= limit:
                break
            record = KEY_RECORD.validate_python(raw)
            if not isinstance(record, WrappedDataKey) or record.kek_id == current.kek_id:
                continue
            partition = self.partition_of(conversation)
            if partition not in owned:
                continue
            key = self.keks.unwrap(record.kek_id, record.wrapped, conversation)
            again = record.model_copy(update={"kek_id": current.kek_id, "wrapped": current.wrap(key)})
            if self.before_write is not None:
                self.before_write()
            with self.scope(partition):
                self.table.set(conversation, again.model_dump(mode="json"))
            done += 1
        if done and self.durable is not None:
            await self.durable()
        return done

    def forget_cached(self) -> None:
        """At a rebalance: keys of partitions that moved are read again from the table when next needed."""
        self._cache.clear()

    def _remember(self, key: DataKey) -> None:
        self._cache[key.conversation] = key
        while len(self._cache) > CACHED_KEYS:
            self._cache.popitem(last=False)


def memory_keyring(keks: KeyEncryptionKeys | None = None) -> TableKeyRing:
    """Data keys in memory under a fresh KEK: for an executor outside a worker (tests, benchmarks)."""
    return TableKeyRing(MemoryTable(), keks or KeyEncryptionKeys(KeyEncryptionKey(os.urandom(KEY_BYTES))))
