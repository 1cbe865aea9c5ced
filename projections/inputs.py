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
from schemas.records import MessageView

MAX_TEXTS = 3
MAX_INPUT_UTF16 = 1600


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
    """What System One is asked about: `key` = kept message ids joined by ',', `count` ≤ 3."""

    key: str
    count: int
    text: str


def build_input(messages: Sequence[MessageView], email_domain: str | None) -> TurnInput:
    """§6.5: the first three usable customer texts (already redacted), domain prefix, cut to 1,600 units."""
    kept: list[MessageView] = []
    for m in messages:
        if len(kept) == MAX_TEXTS:
            break
        if is_customer_message(m) and m.text is not None and is_usable(m.text):
            kept.append(m)
    text = " ".join(m.text or "" for m in kept)
    if email_domain:
        text = f"Contact email domain: {email_domain}\n{text}"
    return TurnInput(
        key=",".join(str(m.id) for m in kept), count=len(kept), text=cut_utf16(text, MAX_INPUT_UTF16)
    )


def memo_key(input_: TurnInput, config: RouterConfig, account_id: int) -> str:
    """Decisions 2: the input ids plus a hash of the text, the account's routing setup, the model and the
    fixed Jev texts, so a changed model or configuration decides again while retries never do."""
    material = '{"text": ' + json.dumps(input_.text, ensure_ascii=False) + ", " + _setup_json(config, account_id)
    digest = hashlib.sha256(material.encode()).hexdigest()
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
