"""The input of a turn (behavior.md §6.5) and the decision memo key (§7.6, Decisions 2)."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from dataclasses import dataclass

from projections.jev import FIXED_TEXTS
from projections.redaction import cut_utf16, is_usable
from schemas.chatwoot import MessageType
from schemas.config import RouterConfig
from schemas.records import ConversationView, Decide, MessageView

MAX_TEXTS = 3
MAX_INPUT_UTF16 = 1600
WITHHELD = "(withheld: sealed under the conversation's data key; docs/privacy.md)"
"""What a reader shows for a sealed input it cannot open (no key-encryption key given)."""
ERASED = "(erased: the conversation was forgotten; docs/privacy.md)"
TEXT_EXPIRED = "(erased: older than ROUTER_TEXT_RETENTION_DAYS; docs/privacy.md)"
"""What a reader shows for a sealed input whose data key was destroyed by `forget`."""


def is_customer_message(m: MessageView) -> bool:
    """§6.5: an incoming, public, not deleted, not automatic message from the contact."""
    return (
        m.message_type == MessageType.INCOMING
        and not m.private
        and not m.deleted
        and not m.auto_reply
        and m.sender_type in (None, "contact")
    )


@dataclass(frozen=True)
class TurnInput:
    """What System One is asked about: `key` = kept message ids joined by ',', `count` ≤ 3.

    Read from records written before issue 32 it holds the plaintext `text`; from sealed records it holds the
    sealed `parts` and `domain` and their digests instead (the fold never sees customer text: docs/privacy.md)."""

    key: str
    count: int
    text: str | None = None
    parts: tuple[str, ...] = ()
    domain: str | None = None
    digests: tuple[str, ...] = ()
    domain_digest: str | None = None


def input_text(texts: Sequence[str], email_domain: str | None) -> str:
    """§6.5: the texts joined by a space after the domain line, cut to 1,600 units (the text System One reads)."""
    text = " ".join(texts)
    if email_domain:
        text = f"Contact email domain: {email_domain}\n{text}"
    return cut_utf16(text, MAX_INPUT_UTF16)


def _usable(m: MessageView) -> bool:
    if m.sealed_text is not None:
        return bool(m.usable)
    return m.text is not None and is_usable(m.text)


def build_input(messages: Sequence[MessageView], email_domain: str | None) -> TurnInput:
    """§6.5 on plaintext (records written before issue 32): the first three usable customer texts (already
    redacted), domain prefix, cut to 1,600 units."""
    return turn_input(messages, ConversationView(inbox_id=None, status=None, email_domain=email_domain))


def turn_input(messages: Sequence[MessageView], current: ConversationView | None) -> TurnInput:
    """§6.5: the first three usable customer texts (already redacted), domain prefix, cut to 1,600 units; sealed
    texts stay sealed (the worker that asks System One opens them)."""
    kept: list[MessageView] = []
    for m in messages:
        if len(kept) == MAX_TEXTS:
            break
        if is_customer_message(m) and _usable(m):
            kept.append(m)
    key = ",".join(str(m.id) for m in kept)
    # Sealed texts make a sealed input; texts read before sealing (a run begun before the upgrade) make a plaintext
    # one as before. Across that upgrade a domain of the other kind is left out rather than mixed in.
    if kept and all(m.sealed_text is not None for m in kept):
        return TurnInput(
            key=key,
            count=len(kept),
            parts=tuple(m.sealed_text or "" for m in kept),
            domain=current.sealed_email_domain if current is not None else None,
            digests=tuple(m.text_digest or "" for m in kept),
            domain_digest=current.email_domain_digest if current is not None else None,
        )
    domain = current.email_domain if current is not None else None
    return TurnInput(key=key, count=len(kept), text=input_text([m.text or "" for m in kept], domain))


def memo_key(input_: TurnInput, config: RouterConfig, account_id: int) -> str:
    """Decisions 2: the input ids plus a hash of the text, the account's routing setup, the model and the
    fixed Jev texts, so a changed model or configuration decides again while retries never do.

    A sealed input is hashed by its texts' keyed digests instead of its text: equal texts give equal keys within
    the conversation, and once its data key is destroyed no one can test a guessed text against the key."""
    if input_.text is not None:
        material = '{"text": ' + json.dumps(input_.text, ensure_ascii=False)
    else:
        sealed = {"digests": list(input_.digests), "domain": input_.domain_digest}
        material = '{"sealed": ' + json.dumps(sealed)
    digest = hashlib.sha256((material + ", " + _setup_json(config, account_id)).encode()).hexdigest()
    return f"{input_.key}#{digest[:32]}"


_SETUPS: dict[tuple[int, int], tuple[RouterConfig, str]] = {}
_SETUPS_KEPT = 64


def _setup_json(config: RouterConfig, account_id: int) -> str:
    """The memo material after its text, as `json.dumps` writes the whole object (default separators): the
    same for every turn under one configuration, so it is serialized once per configuration and account (the
    configuration is frozen; the cache holds it, so its id cannot be reused while cached)."""
    cached = _SETUPS.get((id(config), account_id))
    if cached is not None and cached[0] is config:
        return cached[1]
    routing = config.routing
    kinds = config.kinds_of(account_id)
    setup = {
        "owners": {n: o.model_dump(by_alias=True) for n, o in routing.accounts[account_id].items()},
        "topics": routing.topics,
        "kinds": None if kinds is None else {n: k.model_dump(by_alias=True) for n, k in kinds.items()},
        "minConfidence": routing.min_confidence,
        "model": routing.model,
        "fixed": FIXED_TEXTS,
    }
    text = json.dumps(setup, sort_keys=False, ensure_ascii=False)[1:]  # without its "{": it follows the text
    if len(_SETUPS) >= _SETUPS_KEPT:
        _SETUPS.clear()
    _SETUPS[(id(config), account_id)] = (config, text)
    return text


def decide_command(input_: TurnInput) -> Decide:
    """The System One call for `input_`: its plaintext text (records before issue 32) or its sealed parts."""
    if input_.text is not None:
        return Decide(input_key=input_.key, text=input_.text)
    return Decide(input_key=input_.key, parts=input_.parts, domain=input_.domain)
