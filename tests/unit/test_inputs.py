"""The turn input (behavior.md §6.5) and the memo key (§7.6, Decisions 2)."""

from __future__ import annotations

from projections.inputs import build_input, memo_key
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


def test_memo_key_hashes_the_material_as_one_json_object() -> None:
    """The configuration's part of the material is serialized once per configuration; the digest stays that of
    the whole object as `json.dumps` writes it, so memos written before keep matching."""
    import hashlib
    import json

    from projections.jev import FIXED_TEXTS

    config = make_config()
    routing = config.routing
    for text in ("hi", 'é "quoted" \\ \n ünï 😀', ""):
        turn = build_input([incoming(1, text)], "example.org")
        material = {
            "text": turn.text,
            "owners": {n: o.model_dump(by_alias=True) for n, o in routing.accounts[1].items()},
            "topics": routing.topics,
            "kinds": {n: k.model_dump(by_alias=True) for n, k in (config.kinds_of(1) or {}).items()},
            "minConfidence": routing.min_confidence,
            "model": routing.model,
            "fixed": FIXED_TEXTS,
        }
        digest = hashlib.sha256(json.dumps(material, sort_keys=False, ensure_ascii=False).encode()).hexdigest()
        assert memo_key(turn, config, 1) == memo_key(turn, config, 1) == f"{turn.key}#{digest[:32]}"
