"""Signed agent-bot webhooks, delivered as Chatwoot's `AgentBots::WebhookJob` does (chatwoot.md §2-§3).

Each event gets its own delivery id, kept across retries; the timestamp and signature are recomputed per
attempt over `"<ts>." + body`. Only 429 and 500 are retried, three attempts in all, `retry_delay_s` apart
(3 s in Chatwoot; tests shrink it). After a final failure of a message event Chatwoot's fallback opens a
pending conversation (a 413 too: only 429 and 500 are retried).

Kind (the default): one conversation's deliveries go out in order, one at a time; conversations in parallel.
With `Realism` (realism.py) it is as Sidekiq does it: with `concurrent_webhooks` every delivery is its own job,
in parallel with the others of its conversation; `webhook_jitter_ms` delays each job's start by a random amount
up to it (so they arrive reordered); `webhook_duplicates` runs a job a second time, as a crashed Sidekiq process
does: the same payload under the same `X-Chatwoot-Delivery` (chatwoot.md §2: the id is made when the job is
enqueued and is part of it), with its own attempts, retries and failure fallback, logged as a delivery of its own
with `duplicate: true`. `settle` waits for all of them.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import io
import json
import time
import uuid
from collections import deque
from dataclasses import dataclass, field
from typing import Any

import aiohttp

from sandbox.realism import Realism
from sandbox.world import BotEvent, World

RETRYABLE = (429, 500)
ATTEMPTS = 3


def encode(payload: dict[str, Any]) -> bytes:
    """A webhook's body: compact JSON, as Chatwoot posts it."""
    return json.dumps(payload, separators=(",", ":"), ensure_ascii=False).encode("utf-8")


LARGE_BODY_BYTES = 1024 * 1024
"""Above this aiohttp wants a body as a stream (raw bytes would block the loop, it warns), as a 3 MiB e-mail is."""


def _payload(body: bytes) -> bytes | io.BytesIO:
    """The body to post in one attempt: a fresh stream for a large one (a stream is used up by an attempt)."""
    return io.BytesIO(body) if len(body) > LARGE_BODY_BYTES else body


def sign(secret: str, timestamp: str, body: bytes) -> str:
    """`sha256=<hex>` over `"<timestamp>." + body`, keyed with the secret's UTF-8 bytes."""
    digest = hmac.new(secret.encode("utf-8"), timestamp.encode("ascii") + b"." + body, hashlib.sha256)
    return "sha256=" + digest.hexdigest()


@dataclass
class Delivery:
    """One bot's delivery of one event, with what happened to each attempt."""

    delivery_id: str
    event: BotEvent
    url: str
    attempts: list[dict[str, Any]] = field(default_factory=list)
    outcome: str = "pending"  # pending | delivered | failed
    duplicate: bool = False  # a second run of the same job (realism: `webhook_duplicates`)

    def to_json(self) -> dict[str, Any]:
        data: dict[str, Any] = {
            "delivery_id": self.delivery_id,
            "event": self.event.event,
            "bot_id": self.event.bot_id,
            "account_id": self.event.account_id,
            "conversation_id": self.event.conversation_id,
            "url": self.url,
            "attempts": self.attempts,
            "outcome": self.outcome,
        }
        if self.duplicate:
            data["duplicate"] = True
        return data


class WebhookDispatcher:
    """Queues the world's bot events and delivers them; `deliveries` is the log of all of them."""

    def __init__(
        self,
        world: World,
        *,
        retry_delay_s: float = 3.0,
        timeout_s: float = 5.0,
        realism: Realism | None = None,
    ) -> None:
        self.world = world
        self.retry_delay_s = retry_delay_s
        self.timeout_s = timeout_s
        self.realism = realism or Realism()
        self.deliveries: list[Delivery] = []
        self._queues: dict[tuple[int, int], deque[Delivery]] = {}
        self._lanes: dict[tuple[int, int], asyncio.Task[None]] = {}
        self._jobs: set[asyncio.Task[None]] = set()  # concurrent deliveries, each its own "Sidekiq job"
        self._session: aiohttp.ClientSession | None = None
        self._idle = asyncio.Event()
        self._idle.set()

    async def start(self) -> None:
        self._session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=self.timeout_s))

    async def close(self) -> None:
        tasks = [*self._lanes.values(), *self._jobs]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        if self._session is not None:
            await self._session.close()

    def enqueue(self, event: BotEvent) -> None:
        """Called synchronously by the world at the moment of a change."""
        url = self.world.bot_webhook_url(self.world.bots[event.bot_id])
        if url is None:
            return
        delivery = Delivery(str(uuid.uuid4()), event, url)
        runs = [delivery]
        if self.realism.runs_twice():
            runs.append(Delivery(delivery.delivery_id, event, url, duplicate=True))
        loop = asyncio.get_running_loop()
        self._idle.clear()
        for run in runs:
            self.deliveries.append(run)
            if self.realism.concurrent_webhooks:
                job = loop.create_task(self._job(run))
                self._jobs.add(job)
                job.add_done_callback(self._job_done)
                continue
            key = (event.account_id, event.conversation_id)
            self._queues.setdefault(key, deque()).append(run)
            if key not in self._lanes:
                self._lanes[key] = loop.create_task(self._lane(key))

    @property
    def pending(self) -> int:
        """Deliveries not finished yet (queued, waiting for their start, or being attempted)."""
        return sum(len(queue) for queue in self._queues.values()) + len(self._jobs)

    async def _lane(self, key: tuple[int, int]) -> None:
        queue = self._queues[key]
        try:
            while queue:
                await self._start_after_jitter()
                await self._deliver(queue[0])
                queue.popleft()
        finally:
            del self._lanes[key]
            self._check_idle()

    async def _job(self, delivery: Delivery) -> None:
        await self._start_after_jitter()
        await self._deliver(delivery)

    def _job_done(self, job: asyncio.Task[None]) -> None:
        self._jobs.discard(job)
        self._check_idle()

    def _check_idle(self) -> None:
        if not self._lanes and not self._jobs:
            self._idle.set()

    async def _start_after_jitter(self) -> None:
        """A job starts when a Sidekiq thread takes it: at once in the kind sandbox, within the jitter otherwise."""
        delay = self.realism.jitter_s()
        if delay > 0:
            await asyncio.sleep(delay)

    async def settle(self, timeout_s: float = 30.0) -> None:
        """Wait until every queued delivery has finished (delivered or failed)."""
        async with asyncio.timeout(timeout_s):
            await self._idle.wait()

    async def _deliver(self, delivery: Delivery) -> None:
        assert self._session is not None, "dispatcher not started"
        bot = self.world.bots[delivery.event.bot_id]
        body = encode(delivery.event.payload)
        for attempt in range(1, ATTEMPTS + 1):
            timestamp = str(int(time.time()))
            headers = {
                "Content-Type": "application/json",
                "Accept": "application/json",
                "X-Chatwoot-Delivery": delivery.delivery_id,
                "X-Chatwoot-Timestamp": timestamp,
                "X-Chatwoot-Signature": sign(bot.secret, timestamp, body),
            }
            status: int | None = None
            try:
                async with self._session.post(delivery.url, data=_payload(body), headers=headers) as response:
                    status = response.status
                    answer = await response.read()
                # the answer's start too: a 2xx can mean "accepted" or "ignored" (tests tell them apart)
                outcome: dict[str, Any] = {
                    "status": status,
                    "at": time.time(),
                    "response": answer[:200].decode("utf-8", "replace"),
                }
                delivery.attempts.append(outcome)
            except (aiohttp.ClientError, TimeoutError) as exc:
                delivery.attempts.append({"error": type(exc).__name__, "at": time.time()})
            if status is not None and 200 <= status < 300:
                delivery.outcome = "delivered"
                return
            if status not in RETRYABLE or attempt == ATTEMPTS:
                break
            await asyncio.sleep(self.retry_delay_s)
        delivery.outcome = "failed"
        event = delivery.event
        self.world.bot_failure(event.account_id, event.conversation_id, event.event)
