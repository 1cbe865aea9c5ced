"""What a reader (audit, the console, the demo's report, what-if) can open of the sealed fields (issue 32): with
the operator's key-encryption key it reads the conversations' data keys from `<app>.keys` and opens their
inputs in memory; without it, or for a forgotten conversation, every sealed field is shown as withheld or erased,
and everything else the reader shows stays as it was."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Collection, Iterable

from aiokafka import AIOKafkaConsumer, TopicPartition
from pydantic import ValidationError

from handlers.kafka import topic_io
from handlers.kafka.security import client_options
from handlers.privacy.envelope import CannotOpen, DataKey
from handlers.privacy.kek import KeyEncryptionKeys, UnknownKek, load_keks
from handlers.privacy.sealing import open_input
from projections.inputs import ERASED, WITHHELD
from schemas.data_keys import KEY_RECORD, ErasedKey, WrappedDataKey
from schemas.records import Decide

log = logging.getLogger("chatwoot_router.privacy")


class ReaderKeys:
    """The data keys a reader was able to read, by conversation key, and the erasure fences it found."""

    def __init__(self, keks: KeyEncryptionKeys | None) -> None:
        self.keks = keks
        self.keys: dict[str, WrappedDataKey] = {}
        self.erased: dict[str, ErasedKey] = {}
        self.contacts: dict[str, int] = {}  # conversation -> the contact its latest key record names
        self._opened: dict[str, DataKey | None] = {}

    def add(self, raw: bytes | None, only: set[str] | None = None) -> None:
        """Take one record of `<app>.keys` (the latest of a conversation's records wins, as compaction keeps), if
        it is of a conversation in `only` (None: any)."""
        if raw is None:
            return
        try:
            record = KEY_RECORD.validate_json(raw)
        except ValidationError:
            return
        if only is not None and record.key not in only:
            return
        self._opened.pop(record.key, None)
        if record.contact_id is not None:
            self.contacts[record.key] = record.contact_id
        else:
            self.contacts.pop(record.key, None)
        if isinstance(record, ErasedKey):
            self.keys.pop(record.key, None)
            if record.scope == "conversation":  # `text`: only what was sealed before it is gone (the log says so)
                self.erased[record.key] = record
        else:
            self.erased.pop(record.key, None)
            self.keys[record.key] = record

    def data_key(self, conversation: str) -> DataKey | None:
        if conversation not in self._opened:
            record = self.keys.get(conversation)
            key = None
            if record is not None and self.keks is not None:
                try:
                    key = self.keks.unwrap(record.kek_id, record.wrapped, conversation)
                except (CannotOpen, UnknownKek) as exc:
                    log.warning("a data key does not open", extra={"key": conversation, "error": str(exc)})
            self._opened[conversation] = key
        return self._opened[conversation]

    def plain_input(self, conversation: str, decide: Decide) -> str | None:
        """The input System One read, or None when this reader cannot open it (no KEK, erased)."""
        if decide.text is not None:
            return decide.text
        if conversation in self.erased:
            return None
        try:
            return open_input(decide, self.data_key(conversation))
        except CannotOpen:
            return None

    def open_decide(self, conversation: str, decide: Decide) -> str:
        """The input System One read, or what a reader shows instead (erased / withheld)."""
        opened = self.plain_input(conversation, decide)
        if opened is not None:
            return opened
        return ERASED if conversation in self.erased else WITHHELD


async def read_reader_keys(
    bootstrap: str, app_id: str, only: Iterable[str] | None = None, *, partitions: Collection[int] | None = None
) -> ReaderKeys:
    """The data keys of `<app>.keys` (those of `only`, of `partitions`, when given), openable with the
    environment's KEK. A conversation's key is in the partition of the same number as its records."""
    keys = ReaderKeys(load_keks())
    wanted = None if only is None else set(only)

    def take(record: object) -> None:
        keys.add(getattr(record, "value", None), wanted)

    with contextlib.suppress(LookupError):  # an app from before issue 32 has no keys topic: nothing was sealed
        await topic_io.read_topic(bootstrap, f"{app_id}.keys", take, partitions=partitions)
    return keys


class KeysFollower:
    """`<app>.keys` followed by a reader of the live log: `refresh()` before folding what it just read. A data key
    is acknowledged before any record sealed under it is written, so after a refresh every sealed record read
    before it has its key (or its erasure fence) here."""

    def __init__(self, bootstrap: str, app_id: str, keks: KeyEncryptionKeys | None = None) -> None:
        self.keys = ReaderKeys(keks if keks is not None else load_keks())
        self.topic = f"{app_id}.keys"
        self._bootstrap = bootstrap
        self._consumer: AIOKafkaConsumer | None = None
        self._partitions: list[TopicPartition] = []

    async def refresh(self) -> None:
        if self.keys.keks is None:
            return  # nothing could be opened anyway: every sealed field is withheld
        if self._consumer is None:
            try:
                self._partitions = await topic_io.topic_partitions(self._bootstrap, self.topic)
            except LookupError:
                return  # not made yet (no worker ran)
            self._consumer = AIOKafkaConsumer(
                bootstrap_servers=self._bootstrap, enable_auto_commit=False, **client_options()
            )
            await self._consumer.start()
            self._consumer.assign(self._partitions)
            await self._consumer.seek_to_beginning(*self._partitions)
        consumer = self._consumer
        ends = await consumer.end_offsets(self._partitions)
        behind = [tp for tp, end in ends.items() if await consumer.position(tp) < end]
        while behind:
            for records in (await consumer.getmany(*behind, timeout_ms=200)).values():
                for record in records:
                    self.keys.add(record.value)
            behind = [tp for tp in behind if await consumer.position(tp) < ends[tp]]

    async def close(self) -> None:
        if self._consumer is not None:
            await self._consumer.stop()
