"""A deterministic stand-in for System One: answers a §7.1 request from the request alone.

Each option is scored by how many of its criterion's words (crudely stemmed) the ticket shares; the best wins
with a probability that grows with its lead. Greetings and empty chatter answer `request: none`; a ticket that
matches nothing (or two owners equally) is `unclear` / `none`. Good enough for a demo that makes sensible
decisions and for tests that need confident and unconfident answers on cue.
"""

from __future__ import annotations

import re
from typing import Any

_WORD = re.compile(r"[a-z0-9]+")


def _word_set(text: str) -> frozenset[str]:
    return frozenset(text.split(" "))


_STOP = _word_set(
    "a an and are as at be but by can could do does for from have how i if in is it its me my need no not "
    "of on or our please so that the their them there this to too us was we what when where which who why "
    "will with would you your about any some all just get got has had want wants question questions "
    "customer ticket support help thanks thank one more other"
)
_GREETING = _word_set(
    "hi hello hey hallo hola yo morning evening afternoon good anyone anybody someone here there test "
    "testing ok okay ping greetings"
)
_NOTHING = {"unclear", "none"}


def _stem(word: str) -> str:
    for suffix in ("ing", "ed", "es", "s"):
        if len(word) > len(suffix) + 3 and word.endswith(suffix):
            word = word[: -len(suffix)]
            break
    return word[:6]


def _words(text: str) -> set[str]:
    return {_stem(w) for w in _WORD.findall(text.lower()) if w not in _STOP}


def _choice(ticket_words: set[str], criteria: dict[str, str]) -> dict[str, Any]:
    names = [name for name in criteria if name not in _NOTHING]
    fallback = next((name for name in criteria if name in _NOTHING), None)
    scores = {name: len(ticket_words & _words(criteria[name])) for name in names}
    ranked = sorted(names, key=lambda n: -scores[n])
    best = ranked[0] if ranked else None
    top = scores[best] if best else 0
    second = scores[ranked[1]] if len(ranked) > 1 else 0
    if best is None or top == 0 or (top == second and fallback is not None):
        choice = fallback if fallback is not None else (best or next(iter(criteria)))
        confidence = 0.9 if fallback is not None else 0.3
    else:
        choice = best
        confidence = round(min(0.97, 0.75 + 0.1 * (top - second)), 2)
    rest = [name for name in criteria if name != choice]
    share = round((1 - confidence) / len(rest), 4) if rest else 0.0
    probabilities = {name: (confidence if name == choice else share) for name in criteria}
    return {"choice": choice, "probabilities": probabilities}


_FILLER = _word_set("i a an the is are am me my name this it im its we our there")


def _request(ticket: str) -> dict[str, Any]:
    """`none` when the ticket holds nothing but greetings and filler ("hi", "hello, anyone there?").

    The router's e-mail-domain prefix line says who wrote, not what they want, so it is not read here.
    """
    if ticket.startswith("Contact email domain:"):
        ticket = ticket.partition("\n")[2]
    asks = bool(set(_WORD.findall(ticket.lower())) - _GREETING - _FILLER)
    choice, confidence = ("request", 0.92) if asks else ("none", 0.95)
    other = "none" if choice == "request" else "request"
    return {"choice": choice, "probabilities": {choice: confidence, other: round(1 - confidence, 2)}}


def answer(body: Any) -> dict[str, Any] | None:
    """The answers to a request body, or None when the body is not a §7.1 request."""
    if not isinstance(body, dict):
        return None
    state, questions = body.get("state"), body.get("questions")
    if not isinstance(state, dict) or not isinstance(questions, dict) or not isinstance(state.get("ticket"), str):
        return None
    ticket: str = state["ticket"]
    ticket_words = _words(ticket)
    answers: dict[str, Any] = {}
    for name, question in questions.items():
        criteria = question.get("criteria") if isinstance(question, dict) else None
        if not isinstance(criteria, dict) or not criteria:
            return None
        if name == "request":
            answers[name] = _request(ticket)
        else:
            answers[name] = _choice(ticket_words, {str(k): str(v) for k, v in criteria.items()})
    return {"answers": answers, "model": body.get("model")}
