"""System One request body (behavior.md §7.1) and answer validation (§7.3-§7.4)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from projections.jev import (
    C_NONE_KIND,
    C_NONE_REQUEST,
    C_REQUEST,
    C_UNCLEAR,
    I_KIND,
    I_OWNER,
    I_REQUEST,
    I_TOPIC,
    Decision,
    JevError,
    asked_options,
    build_request,
    encode_request,
    js_ordered,
    read_decision,
)
from schemas.config import RouterConfig, parse_config


def _config(**routing: Any) -> RouterConfig:
    base: dict[str, Any] = {
        "model": "jev-test",
        "botIds": {"1": 5, "2": 6},
        "accounts": {
            "1": {
                "sales": {"assignee": 3, "covers": "Buying a plan"},
                "7": {"assignee": 4, "covers": "Team seven"},
                "billing": {"assignee": 5, "covers": "Invoices and refunds"},
                "2": {"assignee": 6, "covers": "Team two"},
            },
            "2": {"support": {"assignee": 9, "covers": "Everything"}},
        },
    }
    base.update(routing)
    return parse_config({"chatwoot": {"baseUrl": "https://cw.example"}, "routing": base})


def _q(text: str) -> str:
    return json.dumps(text, ensure_ascii=False)


def test_request_bytes_match_javascript_for_a_full_configuration() -> None:
    config = _config(
        topics={"shipping": "Parcels and delivery", "10": "Topic ten"},
        kinds={"1": {"refund": {"covers": "Refund requests"}, "3": {"covers": "Kind three"}}},
    )
    ticket = 'Grüße — "quoted"\nline two </b> \u2028'
    expected = (
        '{"model":"jev-test","state":{"ticket":"Grüße — \\"quoted\\"\\nline two </b> \u2028"},'
        '"questions":{'
        f'"owner":{{"type":"choice","instructions":{_q(I_OWNER)},"criteria":{{'
        f'"2":"Team two","7":"Team seven","sales":"Buying a plan","billing":"Invoices and refunds",'
        f'"unclear":{_q(C_UNCLEAR)}}}}},'
        f'"topic":{{"type":"choice","instructions":{_q(I_TOPIC)},"criteria":{{'
        f'"10":"Topic ten","shipping":"Parcels and delivery"}}}},'
        f'"request":{{"type":"choice","instructions":{_q(I_REQUEST)},"criteria":{{'
        f'"request":{_q(C_REQUEST)},"none":{_q(C_NONE_REQUEST)}}}}},'
        f'"kind":{{"type":"choice","instructions":{_q(I_KIND)},"criteria":{{'
        f'"3":"Kind three","refund":"Refund requests","none":{_q(C_NONE_KIND)}}}}}'
        "}}"
    )
    assert encode_request(build_request(config, 1, ticket)) == expected.encode("utf-8")


def test_fixed_texts_escape_quotes_like_json_stringify() -> None:
    body = encode_request(build_request(_config(), 1, "hi"))
    assert b'(for example \\"hi\\" or \\"hello, anyone there?\\")' in body


def test_lone_surrogates_are_escaped_like_well_formed_json_stringify() -> None:
    body = encode_request(build_request(_config(), 1, "cut \ud83d| whole \U0001f600"))
    assert b'"ticket":"cut \\ud83d| whole \xf0\x9f\x98\x80"' in body


def test_topic_and_kind_questions_only_when_configured() -> None:
    plain = build_request(_config(), 1, "t")
    assert list(plain["questions"]) == ["owner", "request"]
    with_kinds = _config(kinds={"1": {"refund": {"covers": "Refunds"}}})
    assert list(build_request(with_kinds, 2, "t")["questions"]) == ["owner", "request"]
    assert list(build_request(with_kinds, 1, "t")["questions"]) == ["owner", "request", "kind"]


def test_empty_kinds_still_ask_the_kind_question_with_only_none() -> None:
    body = build_request(_config(kinds={"1": {}}), 1, "t")
    assert body["questions"]["kind"]["criteria"] == {"none": C_NONE_KIND}


def test_owner_options_are_the_accounts_own_plus_unclear() -> None:
    body = build_request(_config(), 2, "t")
    assert list(body["questions"]["owner"]["criteria"]) == ["support", "unclear"]


@pytest.mark.parametrize(
    ("names", "expected"),
    [
        (["b", "10", "a", "2"], ["2", "10", "b", "a"]),
        (["07", "7"], ["7", "07"]),  # "07" is not canonical: it keeps insertion order
        (["x", "4294967295", "4294967294"], ["4294967294", "x", "4294967295"]),  # 2^32-1 is no array index
        (["0", "z"], ["0", "z"]),
    ],
)
def test_integer_like_names_come_first_in_numeric_order(names: list[str], expected: list[str]) -> None:
    assert list(js_ordered([(n, n) for n in names])) == expected


# --- answers ----------------------------------------------------------------------------------------------

ASKED = {
    "owner": ("billing", "sales", "unclear"),
    "topic": ("shipping", "returns"),
    "request": ("request", "none"),
    "kind": ("refund", "none"),
}


def _answers(**overrides: Any) -> dict[str, Any]:
    answers: dict[str, Any] = {
        "owner": {"choice": "billing", "probabilities": {"billing": 0.9, "sales": 0.1}},
        "topic": {"choice": "shipping", "confidence": 0.8},
        "request": {"choice": "request", "probabilities": {"request": 0.95}},
        "kind": {"choice": "refund", "probabilities": {"refund": 0.6}},
    }
    answers.update(overrides)
    return {"answers": answers}


def test_a_full_answer_becomes_a_decision() -> None:
    decision = read_decision(_answers(), ASKED, 0.7)
    assert decision == Decision(
        owner="billing",
        owner_confidence=0.9,
        topic="shipping",
        topic_confidence=0.8,
        kind="refund",
        kind_confidence=0.6,
        no_request=False,
    )


def test_unclear_and_none_become_null() -> None:
    body = _answers(owner={"choice": "unclear", "confidence": 0.9}, kind={"choice": "none", "confidence": 0.9})
    decision = read_decision(body, ASKED, 0.7)
    assert (decision.owner, decision.owner_confidence) == (None, 0.9)
    assert (decision.kind, decision.kind_confidence) == (None, 0.9)


def test_probability_of_the_choice_wins_even_when_zero() -> None:
    body = _answers(owner={"choice": "billing", "probabilities": {"billing": 0}, "confidence": 0.99})
    assert read_decision(body, ASKED, 0.7).owner_confidence == 0.0


def test_confidence_is_used_when_the_choice_has_no_probability() -> None:
    body = _answers(owner={"choice": "billing", "probabilities": {"sales": 0.2}, "confidence": 0.75})
    assert read_decision(body, ASKED, 0.7).owner_confidence == 0.75


def test_confidence_defaults_to_zero() -> None:
    assert read_decision(_answers(owner={"choice": "billing"}), ASKED, 0.7).owner_confidence == 0.0


@pytest.mark.parametrize(
    ("request_answer", "no_request"),
    [
        ({"choice": "none", "probabilities": {"none": 0.7}}, True),  # exactly the minimum counts
        ({"choice": "none", "probabilities": {"none": 0.69}}, False),
        ({"choice": "none"}, False),
        ({"choice": "request", "probabilities": {"request": 0.99}}, False),
    ],
)
def test_no_request_needs_a_confident_none(request_answer: dict[str, Any], no_request: bool) -> None:
    assert read_decision(_answers(request=request_answer), ASKED, 0.7).no_request is no_request


def test_questions_not_asked_yield_null_and_zero() -> None:
    asked = {"owner": ASKED["owner"], "request": ASKED["request"]}
    decision = read_decision(_answers(), asked, 0.7)
    assert (decision.topic, decision.topic_confidence, decision.kind, decision.kind_confidence) == (
        None,
        0.0,
        None,
        0.0,
    )


def test_extra_fields_and_answers_are_ignored() -> None:
    body = _answers(mood={"choice": 5}, owner={"choice": "sales", "why": "x", "confidence": 0.8})
    body["usage"] = {"tokens": 3}
    assert read_decision(body, ASKED, 0.7).owner == "sales"


@pytest.mark.parametrize(
    "body",
    [
        None,
        [],
        "answers",
        {},
        {"answers": None},
        {"answers": []},
        _answers(owner={"choice": 3}),
        _answers(owner={"probabilities": {"billing": 1}}),
        _answers(owner=None),
        _answers(owner="billing"),
        _answers(owner={"choice": "billing", "probabilities": [0.9]}),
        _answers(owner={"choice": "billing", "probabilities": {"billing": "0.9"}}),
        _answers(owner={"choice": "billing", "probabilities": {"billing": True}}),
        _answers(kind={"choice": "refund", "confidence": "high"}),
    ],
)
def test_malformed_responses_are_invalid(body: object) -> None:
    with pytest.raises(JevError, match=r"^TypeSafe Jev: invalid response$"):
        read_decision(body, ASKED, 0.7)


@pytest.mark.parametrize(
    ("question", "answer"),
    [
        ("owner", {"choice": "marketing", "confidence": 1}),  # an invented owner
        ("topic", {"choice": "none"}),  # topic has no "none" option
        ("request", {"choice": "maybe"}),
        ("kind", {"choice": "unclear"}),
    ],
)
def test_a_choice_outside_the_options_names_the_question(question: str, answer: dict[str, Any]) -> None:
    with pytest.raises(JevError, match=rf"^TypeSafe Jev: no valid {question}$"):
        read_decision(_answers(**{question: answer}), ASKED, 0.7)


def test_a_missing_answer_names_the_question() -> None:
    body = _answers()
    del body["answers"]["request"]
    with pytest.raises(JevError, match=r"^TypeSafe Jev: no valid request$"):
        read_decision(body, ASKED, 0.7)


def test_asked_options_read_back_from_the_request() -> None:
    body = build_request(_config(kinds={"1": {}}), 1, "t")
    assert asked_options(body) == {
        "owner": ("2", "7", "sales", "billing", "unclear"),
        "request": ("request", "none"),
        "kind": ("none",),
    }
