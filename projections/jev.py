"""System One ("Jev") question texts and the decision read from its answers (behavior.md §7).

The instruction and criteria texts are this project's own wording (Decisions 5). They live here and only here:
the request body is built from them, and they are part of the decision memo's hash, so rewording them makes
the router decide again.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping, Sequence
from typing import Any

from schemas.config import RouterConfig
from schemas.decision import Decision

I_OWNER = "Choose who should handle this support ticket. Judge only from the ticket text."
I_TOPIC = "Choose the topic of this support ticket. Judge only from the ticket text."
I_REQUEST = "Choose whether the customer asks for anything in this ticket. Judge only from the ticket text."
I_KIND = "Choose the kind of this support ticket. Judge only from the ticket text."
C_UNCLEAR = (
    "There is no concrete request yet, or the ticket mixes several of the listed areas, or it is about a "
    "different product, or it cannot be given to exactly one of the listed owners."
)
C_REQUEST = (
    "The customer wants support, information or an action: a question about a product or service, a problem, "
    "or something to be done, even if stated briefly."
)
C_NONE_REQUEST = (
    'Nothing has been asked yet: a greeting or a check whether anyone is there (for example "hi" or '
    '"hello, anyone there?"), a test, only a name or contact details, or a few words that request nothing.'
)
C_NONE_KIND = "None of the listed kinds."

FIXED_TEXTS: dict[str, str] = {
    "I_owner": I_OWNER,
    "I_topic": I_TOPIC,
    "I_request": I_REQUEST,
    "I_kind": I_KIND,
    "C_unclear": C_UNCLEAR,
    "C_request": C_REQUEST,
    "C_none_request": C_NONE_REQUEST,
    "C_none_kind": C_NONE_KIND,
}


# --- the request (behavior.md §7.1) ---------------------------------------------------------------------

_ARRAY_INDEX_LIMIT = 2**32 - 1  # JavaScript orders property names that are array indices (< 2^32 - 1) first


def _js_index(name: str) -> int | None:
    """The numeric value of a canonical array-index name ("0", "7", not "07"), as JavaScript sees it."""
    if not name.isascii() or not name.isdigit() or (len(name) > 1 and name[0] == "0"):
        return None
    value = int(name)
    return value if value < _ARRAY_INDEX_LIMIT else None


def js_ordered(items: list[tuple[str, str]]) -> dict[str, str]:
    """A dict whose key order is the one `JSON.stringify` gives an object built by inserting `items`.

    JavaScript lists integer-like property names first, in numeric order, then the others in insertion order.
    Owner and kind names may be such names, and the earlier router's request bytes followed that rule.
    """
    indexed = sorted((i, k, v) for k, v in items if (i := _js_index(k)) is not None)
    ordered = {k: v for _, k, v in indexed}
    ordered.update((k, v) for k, v in items if _js_index(k) is None)
    return ordered


def _question(instructions: str, criteria: list[tuple[str, str]]) -> dict[str, Any]:
    return {"type": "choice", "instructions": instructions, "criteria": js_ordered(criteria)}


def build_request(config: RouterConfig, account_id: int, ticket: str) -> dict[str, Any]:
    """The System One request body for one ticket of one account, key order included (§7.1)."""
    routing = config.routing
    owners = [(name, owner.covers) for name, owner in routing.accounts[account_id].items()]
    questions: dict[str, Any] = {"owner": _question(I_OWNER, [*owners, ("unclear", C_UNCLEAR)])}
    if routing.topics is not None:
        questions["topic"] = _question(I_TOPIC, list(routing.topics.items()))
    questions["request"] = _question(I_REQUEST, [("request", C_REQUEST), ("none", C_NONE_REQUEST)])
    kinds = config.kinds_of(account_id)
    if kinds is not None:
        kind_items = [(name, kind.covers) for name, kind in kinds.items()]
        questions["kind"] = _question(I_KIND, [*kind_items, ("none", C_NONE_KIND)])
    return {"model": routing.model, "state": {"ticket": ticket}, "questions": questions}


_LONE_SURROGATE = re.compile("[\ud800-\udfff]")


def encode_request(body: dict[str, Any]) -> bytes:
    """The request bytes as `JSON.stringify` writes them: compact, non-ASCII kept as UTF-8, and a lone
    surrogate (a pair cut in half) escaped as `\\udxxx` instead of making the text unencodable."""
    text = json.dumps(body, ensure_ascii=False, separators=(",", ":"))
    return _LONE_SURROGATE.sub(lambda m: f"\\u{ord(m.group()):04x}", text).encode("utf-8")


def asked_options(body: dict[str, Any]) -> dict[str, tuple[str, ...]]:
    """Question name -> its option names, read back from a request built by `build_request`."""
    questions: dict[str, Any] = body["questions"]
    return {name: tuple(question["criteria"]) for name, question in questions.items()}


# --- the response (behavior.md §7.3-§7.4) ----------------------------------------------------------------


class JevError(Exception):
    """A System One failure; the message is safe to log (no ticket text, no key)."""


def _is_number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def _valid_shape(answer: object) -> bool:
    if not isinstance(answer, dict) or not isinstance(answer.get("choice"), str):
        return False
    probabilities = answer.get("probabilities")
    if probabilities is not None and not (
        isinstance(probabilities, dict) and all(_is_number(p) for p in probabilities.values())
    ):
        return False
    confidence = answer.get("confidence")
    return confidence is None or _is_number(confidence)


def _confidence(answer: dict[str, Any]) -> float:
    """probabilities[choice] when present (even 0), else `confidence`, else 0."""
    probabilities = answer.get("probabilities") or {}
    if answer["choice"] in probabilities:
        return float(probabilities[answer["choice"]])
    confidence = answer.get("confidence")
    return float(confidence) if confidence is not None else 0.0


def read_decision(body: object, asked: Mapping[str, Sequence[str]], min_confidence: float) -> Decision:
    """Validate Jev's answers to the asked questions and reduce them to a Decision (§7.3, §7.4).

    `asked` maps each asked question to its option names (see `asked_options`). Answers to questions that were
    not asked are ignored, whatever their shape. Raises JevError with the §7.3 messages.
    """
    answers = body.get("answers") if isinstance(body, dict) else None
    if not isinstance(answers, dict):
        raise JevError("TypeSafe Jev: invalid response")
    for question in asked:
        if question in answers and not _valid_shape(answers[question]):
            raise JevError("TypeSafe Jev: invalid response")
    chosen: dict[str, tuple[str, float]] = {}
    for question, options in asked.items():
        answer = answers.get(question)
        if answer is None or answer["choice"] not in options:
            raise JevError(f"TypeSafe Jev: no valid {question}")
        chosen[question] = (answer["choice"], _confidence(answer))

    def pick(question: str, nothing: str | None) -> tuple[str | None, float]:
        if question not in chosen:
            return None, 0.0
        choice, confidence = chosen[question]
        return (None if choice == nothing else choice), confidence

    owner, owner_confidence = pick("owner", "unclear")
    topic, topic_confidence = pick("topic", None)
    kind, kind_confidence = pick("kind", "none")
    request_choice, request_confidence = chosen.get("request", ("request", 0.0))
    return Decision(
        owner=owner,
        owner_confidence=owner_confidence,
        topic=topic,
        topic_confidence=topic_confidence,
        kind=kind,
        kind_confidence=kind_confidence,
        no_request=request_choice == "none" and request_confidence >= min_confidence,
    )
