"""The request budget of one Chatwoot installation, shared by every client of the process (issue 30).

Every Chatwoot request waits here for a token first (projections/worker/throttle.py), so the worker stays under
Chatwoot's per-IP limit instead of meeting it; a worker's rate is its share of the partitions, so a group of
workers stays under it together. Waiting requests are served in turn, one per conversation (a lane) at a time:
one conversation with many reads cannot starve the others. After a 429 the whole installation pauses; requests
wait, nothing fails. What waiting cost is kept in `stats` for the metrics and the console.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import weakref
from collections import OrderedDict, deque
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime

from projections.worker.throttle import (
    DEFAULT_REQUESTS_PER_MIN,
    FIRST_BACKOFF_S,
    TokenBucket,
    next_backoff,
    retry_after_s,
)


@dataclass
class BudgetStats:
    throttled: int = 0
    """429 answers received."""
    waited_s: float = 0.0
    """Seconds requests spent waiting for the budget, summed over requests."""
    paused_s: float = 0.0
    """Seconds the installation was paused after 429s."""
    per_minute: float = DEFAULT_REQUESTS_PER_MIN
    """This process's current rate."""
    last_throttled_at: float | None = None
    """Wall-clock time of the last 429."""


class RequestBudget:
    """Tokens for one installation's requests; `take(lane)` waits for one, fairly between lanes."""

    def __init__(
        self,
        per_minute: float = DEFAULT_REQUESTS_PER_MIN,
        clock: Callable[[], float] = time.monotonic,
        first_backoff_s: float = FIRST_BACKOFF_S,
    ):
        self._clock = clock
        self._first_backoff_s = first_backoff_s
        self._bucket = TokenBucket.per_minute(per_minute, clock())
        self._paused_until = 0.0
        self._backoff_s: float | None = None
        self._lanes: OrderedDict[str, deque[tuple[float, asyncio.Future[None]]]] = OrderedDict()
        self._pump: asyncio.Task[None] | None = None
        self._wake = asyncio.Event()
        self.stats = BudgetStats(per_minute=per_minute)

    def set_rate(self, per_minute: float) -> None:
        """A new share (a rebalance) or a new setting; waiting requests are served at the new rate."""
        self._bucket.set_rate(per_minute, self._clock())
        self.stats.per_minute = per_minute
        self._wake.set()

    @property
    def paused_for_s(self) -> float:
        return max(self._paused_until - self._clock(), 0.0)

    async def take(self, lane: str, n: float = 1.0) -> float:
        """Wait for `n` tokens (a request and the one right after it take them together); returns seconds waited."""
        now = self._clock()
        if not self._lanes and now >= self._paused_until and self._bucket.wait_s(now, n) == 0:
            self._bucket.take(now, n)  # the common case: no queue, no pause, a token there
            return 0.0
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._lanes.setdefault(lane, deque()).append((n, future))
        if self._pump is None or self._pump.done():
            self._pump = asyncio.ensure_future(self._serve())
        self._wake.set()
        try:
            await future
        except asyncio.CancelledError:
            self._forget(lane, future)
            raise
        waited = self._clock() - now
        self.stats.waited_s += waited
        return waited

    def throttled(self, retry_after: str | None) -> float:
        """A 429: pause the installation for `Retry-After`, else for a backoff that grows while 429s continue."""
        pause = retry_after_s(retry_after, datetime.now(UTC))
        if pause is None:
            pause = self._backoff_s = next_backoff(self._backoff_s, self._first_backoff_s)
        now = self._clock()
        until = now + pause
        if until > self._paused_until:
            self.stats.paused_s += until - max(self._paused_until, now)
            self._paused_until = until
        self.stats.throttled += 1
        self.stats.last_throttled_at = time.time()
        return pause

    def answered(self) -> None:
        """A request got through: the next 429 starts the backoff over."""
        self._backoff_s = None

    def _forget(self, lane: str, future: asyncio.Future[None]) -> None:
        queue = self._lanes.get(lane)
        if queue is None:
            return
        for item in list(queue):
            if item[1] is future:
                queue.remove(item)
        if not queue:
            del self._lanes[lane]

    async def _serve(self) -> None:
        """Hand tokens out in turn: the first waiting lane gets one, then goes to the back of the line."""
        while self._lanes:
            now = self._clock()
            lane, queue = next(iter(self._lanes.items()))
            n, future = queue[0]
            delay = max(self._paused_until - now, self._bucket.wait_s(now, n))
            if delay > 0:
                self._wake.clear()
                # a new rate or a cancelled waiter may change what is due: look again when woken
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(delay):
                        await self._wake.wait()
                continue
            queue.popleft()
            if not queue:
                del self._lanes[lane]
            else:
                self._lanes.move_to_end(lane)
            if not future.done():
                self._bucket.take(now, n)
                future.set_result(None)


_BUDGETS: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, dict[str, RequestBudget]] = weakref.WeakKeyDictionary()


def budget_for(base_url: str) -> RequestBudget:
    """The budget for the installation at `base_url`, one per installation and event loop, shared by its clients
    (a loop of its own: its waiters and its pump belong to one loop)."""
    budgets = _BUDGETS.setdefault(asyncio.get_running_loop(), {})
    key = base_url.rstrip("/").lower()
    budget = budgets.get(key)
    if budget is None:
        budget = budgets[key] = RequestBudget()
    return budget
