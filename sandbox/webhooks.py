"""Signed agent-bot webhooks, delivered as Chatwoot's `AgentBots::WebhookJob` does (chatwoot-api.md §2-§3).

Each event gets its own delivery id, kept across retries; the timestamp and signature are recomputed per
attempt over `"<ts>." + body`. Only 429 and 500 are retried, three attempts in all, `retry_delay_s` apart
(3 s in Chatwoot; tests shrink it). After a final failure of a message event Chatwoot's fallback opens a
pending conversation. One conversation's deliveries go out in order, one at a time; conversations in parallel.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import json
import time
import uuid
from collections import deque
from dataclasses import dataclass, field
from typing import Any

import aiohttp

from sandbox.world import BotEvent, World

RETRYABLE = (429, 500)
ATTEMPTS = 3


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

    def to_json(self) -> dict[str, Any]:
        return {
            "delivery_id": self.delivery_id,
            "event": self.event.event,
            "bot_id": self.event.bot_id,
            "account_id": self.event.account_id,
            "conversation_id": self.event.conversation_id,
            "url": self.url,
            "attempts": self.attempts,
            "outcome": self.outcome,
        }


class WebhookDispatcher:
    """Queues the world's bot events and delivers them; `deliveries` is the log of all of them."""

    def __init__(self, world: World, *, retry_delay_s: float = 3.0, timeout_s: float = 5.0) -> None:
        self.world = world
        self.retry_delay_s = retry_delay_s
        self.timeout_s = timeout_s
        self.deliveries: list[Delivery] = []
        self._queues: dict[tuple[int, int], deque[Delivery]] = {}
        self._lanes: dict[tuple[int, int], asyncio.Task[None]] = {}
        self._session: aiohttp.ClientSession | None = None
        self._idle = asyncio.Event()
        self._idle.set()

    async def start(self) -> None:
        self._session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=self.timeout_s))

    async def close(self) -> None:
        for task in list(self._lanes.values()):
            task.cancel()
        await asyncio.gather(*self._lanes.values(), return_exceptions=True)
        if self._session is not None:
            await self._session.close()

    def enqueue(self, event: BotEvent) -> None:
        """Called synchronously by the world at the moment of a change."""
        url = self.world.bot_webhook_url(self.world.bots[event.bot_id])
        if url is None:
            return
        delivery = Delivery(str(uuid.uuid4()), event, url)
        self.deliveries.append(delivery)
        key = (event.account_id, event.conversation_id)
        self._queues.setdefault(key, deque()).append(delivery)
        self._idle.clear()
        if key not in self._lanes:
            self._lanes[key] = asyncio.get_running_loop().create_task(self._lane(key))

    async def _lane(self, key: tuple[int, int]) -> None:
        queue = self._queues[key]
        try:
            while queue:
                await self._deliver(queue[0])
                queue.popleft()
        finally:
            del self._lanes[key]
            if not self._lanes:
                self._idle.set()

    async def settle(self, timeout_s: float = 30.0) -> None:
        """Wait until every queued delivery has finished (delivered or failed)."""
        async with asyncio.timeout(timeout_s):
            await self._idle.wait()

    async def _deliver(self, delivery: Delivery) -> None:
        assert self._session is not None, "dispatcher not started"
        bot = self.world.bots[delivery.event.bot_id]
        body = json.dumps(delivery.event.payload, separators=(",", ":"), ensure_ascii=False).encode("utf-8")
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
                async with self._session.post(delivery.url, data=body, headers=headers) as response:
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
