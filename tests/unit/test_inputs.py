"""The turn input (behavior.md §6.5) and the memo key (§7.6, Decisions 2)."""

from __future__ import annotations

from typing import Any

import pytest

from projections.inputs import build_input, memo_key
from schemas.records import MessageView
from tests.unit.test_fold_driver import T0, incoming, make_config, outgoing


def test_first_three_usable_customer_texts_are_kept() -> None:
    messages = [
        incoming(1, "[REDACTED]"),
        incoming(2, "hello"),
        outgoing(3),
        incoming(4, "auto", auto_reply=True),
        incoming(5, "deleted", deleted=True),
        incoming(6, "private", private=True),
        incoming(7, "by agent", sender_type="user"),
        incoming(8, "second"),
        incoming(9, "third"),
        incoming(10, "fourth"),
    ]
    result = build_input(messages, None)
    assert (result.key, result.count, result.text) == ("2,8,9", 3, "hello second third")


def test_domain_prefix_and_the_1600_unit_cut() -> None:
    result = build_input([incoming(1, "ab " * 700)], "example.org")
    assert result.text.startswith("Contact email domain: example.org\nab ab")
    assert len(result.text) == 1600
    emoji = build_input([incoming(1, "😀" * 900)], None)
    assert len(emoji.text.encode("utf-16-le")) // 2 <= 1600
    assert build_input([incoming(1, "hi")], "").text == "hi"


def test_memo_key_changes_with_text_model_and_routing_but_not_otherwise() -> None:
    config = make_config()
    base = build_input([incoming(1, "hi", created_at=T0 / 1000)], None)
    key = memo_key(base, config, 1)
    assert key.startswith("1#")
    assert memo_key(build_input([incoming(1, "hi", created_at=None)], None), config, 1) == key
    assert memo_key(build_input([incoming(1, "ho")], None), config, 1) != key
    assert memo_key(base, make_config(model="jev-2"), 1) != key
    assert memo_key(base, make_config(minConfidence=0.8), 1) != key
    assert memo_key(base, make_config(topics={"other": "x"}), 1) != key


# --- golden memo keys (behavior.md §12.1: memos survive upgrades) --------------------------------------------


def said(mid: int, text: str) -> MessageView:
    """A customer message as the executor records it: `text` is already redacted (no redaction rule runs here)."""
    return MessageView(
        id=mid, message_type=0, private=False, sender_type="contact", created_at=T0 / 1000, conversation_id=2, text=text
    )


TURNS: dict[str, tuple[list[MessageView], str | None]] = {
    "hi": ([said(1, "hi")], None),
    "unicode, quotes, a domain": ([said(7, 'é "quoted" \\ \n ünï 😀')], "example.org"),
    "three texts and a domain": (
        [said(3, "Hello"), said(5, "I was charged twice"), said(9, "Refund please")],
        "lopez-consulting.test",
    ),
    "empty": ([], None),
    "empty, with a domain": ([], "example.org"),
}
CONFIGS: dict[str, dict[str, Any]] = {
    "make_config()": {},
    "another model": {"model": "jev-2"},
    "another minConfidence": {"minConfidence": 0.8},
    "no kinds at all": {"kinds": None},
}


@pytest.mark.parametrize(
    ("turn", "config", "golden"),
    [
        ("hi", "make_config()", "1#3de0d987eb88077ca6af801de4a66856"),
        ("unicode, quotes, a domain", "make_config()", "7#361e06e36a4fb1bd0d661ae2d0c082e8"),
        ("three texts and a domain", "make_config()", "3,5,9#2db5aedac4b2da5b6b06a3b1091fe804"),
        ("empty", "make_config()", "#5670b155434cb8a5b553f6750065af81"),
        ("empty, with a domain", "make_config()", "#49fad315d05fb49fac2c615d016eee45"),
        ("hi", "another model", "1#5859cb56c86d2a5920b602f1cc10a886"),
        ("unicode, quotes, a domain", "another minConfidence", "7#345b350a91719fe8f2e19dcbddc571e5"),
        ("three texts and a domain", "no kinds at all", "3,5,9#f32140fdd7e2573351e51039a6d2f52a"),
    ],
)
def test_memo_keys_are_the_ones_earlier_releases_stored(turn: str, config: str, golden: str) -> None:
    """Golden memo keys, computed once by the release that introduced them and pasted here as literals.

    A memo written by an earlier release must keep matching after an upgrade (behavior.md §12.1; Decisions 2):
    the state's `memos` are keyed by these strings, so the same input under the same configuration must give the
    same key, byte for byte. If this fails, the change (the material's fields or their order, the JSON
    serialization, the hash, the fixed Jev texts of `projections/jev.py`, the domain prefix, the id list)
    invalidates every stored memo and every conversation is decided again: that needs a migration and a release
    note, never a new literal. (The configurations are `make_config` of `tests/unit/test_fold_driver.py` with the
    overrides of `CONFIGS`; if that helper changes, pin its old document here instead of changing a literal.)
    """
    messages, domain = TURNS[turn]
    routing = make_config(**CONFIGS[config])
    key = memo_key(build_input(messages, domain), routing, 1)
    assert key == golden
    assert memo_key(build_input(messages, domain), routing, 1) == golden  # the cached serialization too
