"""`whatif --ask`: new questions go to System One a few at a time, once; the cache answers every later run."""

from __future__ import annotations

import argparse
import asyncio
import json
from pathlib import Path

import httpx
import pytest

from handlers.clients.systemone import SystemOneClient
from handlers.logs.whatif import AnswerCache, ask
from projections.jev import build_request
from projections.whatif.replay import Question, question_digest
from streams.whatif_cmd import conversation_key, duration_s, instant_ms
from tests.unit.test_fold_driver import make_config

ANSWER = {"answers": {"owner": {"choice": "billing", "confidence": 0.9}}}


def questions(n: int) -> list[Question]:
    config = make_config()
    bodies = [build_request(config, 1, f"ticket {i}") for i in range(n)]
    return [Question(question_digest(b), b) for b in bodies]


async def test_questions_are_asked_at_most_n_at_a_time_once_and_then_cached(tmp_path: Path) -> None:
    in_flight = peak = 0
    seen: list[bytes] = []

    async def system_one(request: httpx.Request) -> httpx.Response:
        nonlocal in_flight, peak
        in_flight += 1
        peak = max(peak, in_flight)
        await asyncio.sleep(0)  # let the other questions start, if the gate allowed them
        await asyncio.sleep(0)
        in_flight -= 1
        seen.append(request.content)
        assert request.headers["authorization"] == "Bearer key"
        return httpx.Response(200, json=ANSWER)

    cache = AnswerCache(tmp_path / "cache")
    asked_for = questions(6)
    async with SystemOneClient("https://s1.example/v1", "key", transport=httpx.MockTransport(system_one)) as client:
        first = await ask([*asked_for, asked_for[0]], client, cache, concurrency=2)
        assert (first.asked, first.cached, first.failed) == (6, 0, {})
        assert peak == 2 and len(seen) == 6
        again = await ask(asked_for, client, cache, concurrency=2)
    assert (again.asked, again.cached) == (0, 6) and len(seen) == 6
    assert again.answers == {q.digest: ANSWER for q in asked_for}
    stored = sorted(p.name for p in (tmp_path / "cache").iterdir())
    assert stored == sorted(f"{q.digest}.json" for q in asked_for)
    assert all("ticket" not in p.read_text() for p in (tmp_path / "cache").iterdir())  # answers only, no input


async def test_a_failed_question_is_reported_and_not_cached(tmp_path: Path) -> None:
    def failing(request: httpx.Request) -> httpx.Response:
        return httpx.Response(503)

    cache = AnswerCache(tmp_path)
    (question,) = questions(1)
    async with SystemOneClient("https://s1.example/v1", "key", transport=httpx.MockTransport(failing)) as client:
        result = await ask([question], client, cache)
    assert result.failed == {question.digest: "TypeSafe Jev: HTTP 503"} and result.answers == {}
    assert cache.get(question.digest) is None


def test_an_unreadable_cache_entry_is_asked_again(tmp_path: Path) -> None:
    cache = AnswerCache(tmp_path)
    (tmp_path / "abc.json").write_text("{not json")
    assert cache.get("abc") is None
    cache.put("abc", ANSWER)
    assert cache.get("abc") == ANSWER and json.loads((tmp_path / "abc.json").read_text()) == {"answer": ANSWER}
    with pytest.raises(ValueError):
        cache.get("../etc/passwd")


def test_command_line_values() -> None:
    assert [duration_s(v) for v in ("90s", "30m", "24h", "7d", "2w")] == [90, 1800, 86_400, 604_800, 1_209_600]
    assert instant_ms("2025-01-31T12:00:00Z") == instant_ms("2025-01-31T12:00:00") == 1_738_324_800_000
    assert instant_ms("2025-01-31T13:00:00+01:00") == 1_738_324_800_000
    assert conversation_key("1:42") == "1:42"
    for bad, parse in (("7 days", duration_s), ("yesterday", instant_ms), ("1-42", conversation_key)):
        with pytest.raises(argparse.ArgumentTypeError):
            parse(bad)
