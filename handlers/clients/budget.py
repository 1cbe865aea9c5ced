"""The request budget of one Chatwoot installation, shared by every client of the process (issue 30).

Every Chatwoot request waits here for a token first (projections/worker/throttle.py), so the worker stays under
Chatwoot's per-IP limit instead of meeting it; a worker's rate is its share of the partitions, so a group of
workers stays under it together. Waiting requests are served first come, first served by conversation (a lane):
the conversation that asked first gets the next token, so a conversation under way finishes its few requests in
a row and its read right before a mutation stays fresh (served in turn, 200 queued conversations each waited
~5 s a request, their fresh reads went stale and were made again: issue 40). A conversation keeps its place for
`HOLD_TOKENS` tokens, then goes behind the others: one with many reads cannot starve them. Each token wakes one
waiter, the one it serves, and tokens go out in groups (GROUP_S). After a 429 the whole installation pauses;
requests wait, nothing fails. What waiting cost is kept in `stats` for the metrics and the console.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import time
import weakref
from collections import deque
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

HOLD_TOKENS = 64
"""Tokens a conversation takes in its place in line before it goes behind the others: more than one run may make
(§4.6, 45), so a turn's runs are served in a row, and few enough that no conversation holds the line for long."""
GROUP_S = 0.25
"""While requests wait, tokens are handed out in groups at most this often (10 at the default rate), not one by one:
their answers then reach the log together and the worker folds them in one batch, where one record at a time
cost a Kafka produce, a fetch and a thread hop each (issue 40: waiting cost 2x the CPU of working). The rate is
the bucket's either way; a waiting request waits at most this much longer."""
IDLE_S = 60.0
"""A conversation that asked nothing for this long has left the line: when it asks again, it queues at the back."""


@dataclass
class _Place:
    """A conversation's place in line: the order it first asked in, the tokens taken there, when it last asked."""

    order: int
    taken: float = 0.0
    last_s: float = 0.0


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
    """Tokens for one installation's requests; `take(lane)` waits for one, first come first served by lane."""

    def __init__(
        self,
        per_minute: float = DEFAULT_REQUESTS_PER_MIN,
        clock: Callable[[], float] = time.monotonic,
        first_backoff_s: float = FIRST_BACKOFF_S,
        hold_tokens: float = HOLD_TOKENS,
        group_s: float = GROUP_S,
    ):
        self._clock = clock
        self._first_backoff_s = first_backoff_s
        self._bucket = TokenBucket.per_minute(per_minute, clock())
        self._paused_until = 0.0
        self._backoff_s: float | None = None
        self._lanes: dict[str, deque[tuple[float, asyncio.Future[None]]]] = {}  # the lanes waiting now
        self._places: dict[str, _Place] = {}  # every lane that asked within IDLE_S, waiting or not
        self._order = itertools.count()
        self._hold_tokens = hold_tokens
        self._group_s = group_s
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
        place = self._place(lane, now)
        if not self._lanes and now >= self._paused_until and self._bucket.wait_s(now, n) == 0:
            self._bucket.take(now, n)  # the common case: no queue, no pause, a token there
            place.taken += n
            return 0.0
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._lanes.setdefault(lane, deque()).append((n, future))
        if self._pump is None or self._pump.done():
            self._pump = asyncio.ensure_future(self._serve())
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

    def _place(self, lane: str, now: float) -> _Place:
        """`lane`'s place in line: kept while it asks within IDLE_S, a new one at the back when it comes back
        later or has taken its HOLD_TOKENS."""
        place = self._places.get(lane)
        if place is None or self._left(lane, place, now) or place.taken >= self._hold_tokens:
            if len(self._places) > 2 * len(self._lanes) + 1024:  # forget the lanes that left, now and then
                self._places = {k: p for k, p in self._places.items() if not self._left(k, p, now)}
            place = self._places[lane] = _Place(next(self._order))
        place.last_s = now
        return place

    def _left(self, lane: str, place: _Place, now: float) -> bool:
        return lane not in self._lanes and now - place.last_s > IDLE_S

    def _first_in_line(self) -> str:
        """The waiting lane that has been in line longest."""
        places = self._places
        return min(self._lanes, key=lambda lane: places[lane].order)

    async def _serve(self) -> None:
        """Hand tokens out first come, first served: each goes to the waiting lane that has been in line longest."""
        while self._lanes:
            now = self._clock()
            lane = self._first_in_line()
            queue = self._lanes[lane]
            n, future = queue[0]
            delay = max(self._paused_until - now, self._bucket.wait_s(now, n))
            if delay > 0:
                self._wake.clear()
                # a new rate may change what is due: look again when woken. A new waiter does not wake the pump:
                # it queues behind the ones that wait already, and the next group serves it
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(max(delay, self._group_s)):
                        await self._wake.wait()
                continue
            queue.popleft()
            if not queue:
                del self._lanes[lane]
            if not future.done():
                self._bucket.take(now, n)
                future.set_result(None)
                place = self._places[lane]
                place.taken += n
                if place.taken >= self._hold_tokens and lane in self._lanes:
                    self._place(lane, now)  # its turn in front is over: behind the lanes waiting now


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
