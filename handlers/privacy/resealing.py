"""What `replay state --to-app` writes of a conversation's data key and of its personal fields (issue 32).

The copy of the log into a new app carries `<old>.keys` with it, so the new app opens what the old one sealed and a
forgotten conversation stays forgotten, and it seals on the way what a log written before sealing holds in clear
(docs/privacy.md "Logs written before sealing"). Pure: the I/O is `handlers/logs/key_copy.py`.

- `latest_keys`: the latest value of each conversation's key (a compacted topic that compaction has not reached yet
  still holds older values: the last one wins).
- `key_to_copy`: what the new app's `keys` gets for one conversation, given what the old and the new hold. A fence
  is never replaced by a key, and a conversation whose latest value is the fence only ever gets the fence.
- `seal_event`: a copied record with its plaintext sealed under the conversation's key; for a forgotten
  conversation, under a throwaway key that is never stored, so the text cannot be opened by anyone and the fold still
  decides as the old app did (`usable` and the digests are kept). The same function seals again, under the new
  app's key, fields sealed under another (`source`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Literal

from pydantic import ValidationError

from handlers.privacy.envelope import CannotOpen, DataKey
from handlers.privacy.sealing import EMAIL_DOMAIN, TEXT, message_field, seal_conversation, seal_message
from schemas.chatwoot import MessageType
from schemas.data_keys import KEY_RECORD, ErasedKey, WrappedDataKey
from schemas.records import (
    ChainedOutcomes,
    ConversationResult,
    ConversationView,
    CreateMessageResult,
    EffectOutcome,
    Forgotten,
    MessageView,
    Record,
    TurnResult,
)

KeyRecord = WrappedDataKey | ErasedKey
SameKey = Callable[[WrappedDataKey, WrappedDataKey], bool]


def latest_keys(values: Iterable[bytes | None]) -> dict[str, KeyRecord]:
    """The latest record of each conversation among `values` (a `keys` partition in offset order); what does not
    decode as a key record is skipped, as readers skip it."""
    latest: dict[str, KeyRecord] = {}
    for raw in values:
        if raw is None:
            continue
        try:
            record = KEY_RECORD.validate_json(raw)
        except ValidationError:
            continue
        latest[record.key] = record
    return latest


@dataclass(frozen=True)
class KeyCopy:
    """What the new app's `keys` gets for one conversation: `write` (None: it holds the right value already), and
    whether its fields sealed under the old app's key must be sealed again under the new app's (`reseal`)."""

    write: KeyRecord | None = None
    reseal: bool = False


def is_final(record: KeyRecord | None) -> bool:
    """Whether `record` is the fence of a conversation forgotten whole: no key ever follows it. (A fence of scope
    `text`, ROUTER_TEXT_RETENTION_DAYS, erases what was sealed so far; a new key may follow it.)"""
    return isinstance(record, ErasedKey) and record.scope != "text"


def key_to_copy(old: KeyRecord, new: KeyRecord | None, same_key: SameKey) -> KeyCopy:
    """`old` is the conversation's latest record on the old app's `keys`, `new` on the new app's. `same_key(a, b)`
    says whether two wrapped keys hold the same data key (it needs the KEK; called only when their bytes differ).

    - a fence is copied unless the new app holds that fence, or a final one, already; it replaces a key the new app
      holds (a key the copy made for text an older log held in clear is erased with the rest);
    - a key is copied where the new app holds nothing or a fence of scope `text`; never over a final fence;
    - where both hold a key: the old one's wrapping when it is the same data key (rewrapped since, a KEK rotation),
      else the new app's key stays (the copy made it for fields an older log held in clear, and the old app made
      its own since) and what the old one sealed is sealed again under it."""
    if new == old or is_final(new):
        return KeyCopy()
    if isinstance(old, ErasedKey) or new is None or isinstance(new, ErasedKey):
        return KeyCopy(write=old)
    if old.kek_id == new.kek_id and old.wrapped == new.wrapped:
        return KeyCopy(write=old)  # the same key, another record (its contact id): the old app's is the latest
    if same_key(old, new):
        return KeyCopy(write=old)
    return KeyCopy(reseal=True)


def fence_of(forgotten: Forgotten) -> ErasedKey:
    """The final fence a `Forgotten` record of a whole conversation proves was written (for a `keys` topic that
    lost it)."""
    return ErasedKey(key=forgotten.key, at_ms=forgotten.at_ms, reason=forgotten.reason)


def forgets_whole(forgotten: Forgotten) -> bool:
    return forgotten.scope != "text"


@dataclass
class Erasures:
    """The `Forgotten` records of a partition's log, by conversation: which were forgotten whole, and up to which
    offset each one's text was erased (a text read before an erasure is erased with it, whatever its scope)."""

    whole: dict[str, Forgotten] = field(default_factory=dict)
    until: dict[str, int] = field(default_factory=dict)

    def add(self, offset: int, forgotten: Forgotten) -> None:
        if forgets_whole(forgotten):
            self.whole.setdefault(forgotten.key, forgotten)
        self.until[forgotten.key] = max(offset, self.until.get(forgotten.key, -1))

    def erased(self, conversation: str, offset: int) -> bool:
        return conversation in self.whole or offset < self.until.get(conversation, -1)


Fate = Literal["erase", "seal", "mint"]


def plaintext_fate(conversation: str, offset: int, target: KeyRecord | None, erasures: Erasures) -> Fate:
    """What becomes of a field in clear that the record at `offset` holds, given the conversation's latest record on
    the new app's `keys`: `erase` (sealed under a throwaway key: it was erased, or read before an erasure), `seal`
    under the key the new app holds, or `mint` a key for it first (the conversation has none yet)."""
    if isinstance(target, ErasedKey) or erasures.erased(conversation, offset):
        return "erase"
    return "mint" if target is None else "seal"


def _messages(event: Record) -> list[MessageView]:
    found: list[MessageView] = []
    for outcome in _outcomes(event):
        result = outcome.result
        if isinstance(result, TurnResult):
            found.extend(result.messages)
        elif isinstance(result, CreateMessageResult) and result.message is not None:
            found.append(result.message)
    return found


def _conversations(event: Record) -> list[ConversationView]:
    return [o.result.conversation for o in _outcomes(event) if isinstance(o.result, ConversationResult)]


def _outcomes(event: Record) -> list[EffectOutcome]:
    if isinstance(event, EffectOutcome):
        return [event]
    if isinstance(event, ChainedOutcomes):
        return list(event.outcomes)
    return []


def plaintext_in(event: Record) -> bool:
    """Whether the record holds a personal field in clear (a record written before sealing)."""
    return any(m.text is not None for m in _messages(event)) or any(
        c.email_domain is not None for c in _conversations(event)
    )


def sealed_in(event: Record) -> bool:
    """Whether the record holds a sealed personal field."""
    return any(m.sealed_text is not None for m in _messages(event)) or any(
        c.sealed_email_domain is not None for c in _conversations(event)
    )


def contact_of(event: Record) -> int | None:
    """The contact id of the conversation, as its incoming contact messages name it (what the worker keeps beside
    a data key for `forget --contact`), or None."""
    for m in _messages(event):
        if m.message_type == MessageType.INCOMING and m.sender_type == "contact" and m.sender_id is not None:
            return m.sender_id
    return None


def _message(view: MessageView, key: DataKey, source: DataKey | None) -> MessageView:
    if view.text is not None:
        return seal_message(view, key)
    if view.sealed_text is None or source is None:
        return view
    try:
        plain = source.open(view.sealed_text, message_field(view.id))
    except CannotOpen:  # sealed under a key destroyed since (a text erasure): it stays unreadable as it was
        return view
    return view.model_copy(
        update={"sealed_text": key.seal(plain, message_field(view.id)), "text_digest": key.digest(plain, TEXT)}
    )


def _conversation(view: ConversationView, key: DataKey, source: DataKey | None) -> ConversationView:
    if view.email_domain is not None:
        return seal_conversation(view, key)
    if view.sealed_email_domain is None or source is None:
        return view
    try:
        plain = source.open(view.sealed_email_domain, EMAIL_DOMAIN)
    except CannotOpen:
        return view
    return view.model_copy(
        update={
            "sealed_email_domain": key.seal(plain, EMAIL_DOMAIN),
            "email_domain_digest": key.digest(plain, EMAIL_DOMAIN),
        }
    )


def _outcome(outcome: EffectOutcome, key: DataKey, source: DataKey | None) -> EffectOutcome:
    result = outcome.result
    if isinstance(result, TurnResult):
        result = result.model_copy(update={"messages": tuple(_message(m, key, source) for m in result.messages)})
    elif isinstance(result, ConversationResult):
        result = result.model_copy(update={"conversation": _conversation(result.conversation, key, source)})
    elif isinstance(result, CreateMessageResult) and result.message is not None:
        result = result.model_copy(update={"message": _message(result.message, key, source)})
    else:
        return outcome
    return outcome.model_copy(update={"result": result})


def seal_event(event: Record, key: DataKey, source: DataKey | None = None) -> Record:
    """`event` with every plaintext personal field sealed under `key`, and, with `source`, every field sealed under
    `source` opened and sealed again under `key` (one that does not open under it stays as it is); other records
    as they are."""
    if isinstance(event, EffectOutcome):
        return _outcome(event, key, source)
    if isinstance(event, ChainedOutcomes):
        return event.model_copy(update={"outcomes": [_outcome(o, key, source) for o in event.outcomes]})
    return event


__all__ = [
    "Erasures",
    "Fate",
    "KeyCopy",
    "KeyRecord",
    "contact_of",
    "fence_of",
    "forgets_whole",
    "is_final",
    "key_to_copy",
    "latest_keys",
    "plaintext_fate",
    "plaintext_in",
    "seal_event",
    "sealed_in",
]
