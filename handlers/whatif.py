"""The effectful part of `whatif`: reading the event log, and (`--ask`) System One with an answer cache.

Nothing here talks to Chatwoot. The log is read without a consumer group (handlers/kafka_io.py), so a what-if
never disturbs the workers. System One gets only the candidate's new questions, at most `concurrency` at a
time; each answer is kept in `<cache>/<digest>.json`, the digest being the SHA-256 of the request body
(the redacted input, the questions and the model), so a second run asks nothing. The cache holds System One's
answers only (choices and probabilities), never the input text.
"""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from aiokafka import ConsumerRecord

from handlers.kafka_io import Progress, read_topic
from handlers.systemone import SystemOneClient
from projections.jev import JevError
from projections.whatif import Question, TurnRecorder
from schemas.records import MARKER_KEY

DEFAULT_CACHE_DIR = Path(".whatif-cache")
DEFAULT_CONCURRENCY = 4


async def record_turns(
    bootstrap: str,
    topic: str,
    recorder: TurnRecorder,
    *,
    only_key: str | None = None,
    progress: Progress | None = None,
) -> TurnRecorder:
    """Feed `topic` to `recorder` (only `only_key`'s records and the markers, when given)."""
    wanted = {only_key.encode(), MARKER_KEY.encode()} if only_key is not None else None

    def apply(record: ConsumerRecord[bytes, bytes]) -> None:
        if wanted is None or record.key in wanted:
            recorder.feed(record.value, record.offset, record.partition)

    await read_topic(bootstrap, topic, apply, progress=progress)
    return recorder


class AnswerCache:
    """System One's answers by question digest, one JSON file each, written atomically."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory

    def _path(self, digest: str) -> Path:
        if not digest.isalnum():
            raise ValueError("a question digest is hexadecimal")
        return self.directory / f"{digest}.json"

    def get(self, digest: str) -> object | None:
        path = self._path(digest)
        try:
            stored = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return None
        return stored.get("answer") if isinstance(stored, dict) else None

    def put(self, digest: str, answer: object) -> None:
        self.directory.mkdir(parents=True, exist_ok=True)
        path = self._path(digest)
        scratch = path.with_suffix(f".{os.getpid()}.tmp")
        scratch.write_text(json.dumps({"answer": answer}, ensure_ascii=False), encoding="utf-8")
        scratch.replace(path)


@dataclass
class Asked:
    """What `ask` got: answers by digest, and how many came from System One, from the cache, or failed."""

    answers: dict[str, object] = field(default_factory=dict)
    asked: int = 0
    cached: int = 0
    failed: dict[str, str] = field(default_factory=dict)


async def ask(
    questions: Iterable[Question],
    client: SystemOneClient,
    cache: AnswerCache,
    *,
    concurrency: int = DEFAULT_CONCURRENCY,
) -> Asked:
    """Put each question not in the cache to System One, `concurrency` at a time; cache what it answers."""
    result = Asked()
    gate = asyncio.Semaphore(concurrency)

    async def one(question: Question) -> None:
        cached = cache.get(question.digest)
        if cached is not None:
            result.answers[question.digest] = cached
            result.cached += 1
            return
        async with gate:
            try:
                answer = await client.post(question.body)
            except JevError as exc:  # the message names the HTTP status or the failure class, never a body
                result.failed[question.digest] = str(exc)
                return
        result.asked += 1
        cache.put(question.digest, answer)
        result.answers[question.digest] = answer

    await asyncio.gather(*(one(q) for q in {q.digest: q for q in questions}.values()))
    return result
