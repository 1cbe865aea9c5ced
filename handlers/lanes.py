"""Lanes: ordered work per conversation, concurrent across conversations, under caps (DESIGN §7 "Isolation").

The effect agent reads commands from one partition in order, but waiting for each HTTP call in turn would let
one slow System One answer hold up every other conversation of the partition. So each conversation gets a lane:
its commands still run one after another (the fold waits for one outcome per step anyway), while different
lanes run side by side. Two caps keep that from turning into a flood: a global one on work in flight, and a
per-account one so a single busy account cannot take every slot. `submit` blocks once too much is queued,
which pushes back on the consumer instead of buffering a partition's backlog in memory.

A lane exists only while it has work: with 10,000 conversations there are at most as many lanes as there are
queued items, never one per conversation ever seen.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

log = logging.getLogger(__name__)

Work = Callable[[], Awaitable[None]]

GLOBAL_CAP = 64
ACCOUNT_CAP = 16
MAX_PENDING = 1024


@dataclass
class _Lane:
    items: deque[Work] = field(default_factory=deque)
    task: asyncio.Task[None] | None = None


@dataclass
class _Account:
    """An account's cap; kept only while some of its lanes exist, so accounts do not accumulate either."""

    slots: asyncio.Semaphore
    lanes: int = 0


class Lanes:
    """Runs work in order per lane key and concurrently across lanes, with a global and a per-account cap.

    A lane belongs to one account (the account passed with its first queued item); work items are
    `async def` callables. An exception in one item is logged (type only: it may quote data) and the lane
    goes on with the next item.
    """

    def __init__(
        self, *, global_cap: int = GLOBAL_CAP, account_cap: int = ACCOUNT_CAP, max_pending: int = MAX_PENDING
    ) -> None:
        if min(global_cap, account_cap, max_pending) < 1:
            raise ValueError("caps must be at least 1")
        self._global = asyncio.Semaphore(global_cap)
        self._account_cap = account_cap
        self._room = asyncio.Semaphore(max_pending)
        self._lanes: dict[str, _Lane] = {}
        self._accounts: dict[int, _Account] = {}
        self._pending = 0
        self._in_flight = 0
        self._idle = asyncio.Event()
        self._idle.set()
        self._closed = False

    @property
    def pending(self) -> int:
        """Items queued or running."""
        return self._pending

    @property
    def in_flight(self) -> int:
        """Items running now."""
        return self._in_flight

    @property
    def lane_count(self) -> int:
        """Lanes that currently have work."""
        return len(self._lanes)

    async def submit(self, lane: str, account_id: int, work: Work) -> None:
        """Queue `work` at the end of `lane`; waits while `max_pending` items are already queued or running."""
        if self._closed:
            raise RuntimeError("lanes are closed")
        await self._room.acquire()
        if self._closed:
            self._room.release()
            raise RuntimeError("lanes are closed")
        self._pending += 1
        self._idle.clear()
        entry = self._lanes.get(lane)
        if entry is None:
            entry = self._lanes[lane] = _Lane()
            account = self._accounts.get(account_id)
            if account is None:
                account = self._accounts[account_id] = _Account(asyncio.Semaphore(self._account_cap))
            account.lanes += 1
            entry.task = asyncio.create_task(self._run(lane, account_id, entry), name=f"lane {lane}")
        entry.items.append(work)

    async def drain(self) -> None:
        """Wait until everything queued so far (and anything queued meanwhile) has run."""
        await self._idle.wait()

    async def close(self) -> None:
        """Refuse new work, cancel what is queued or running, and wait for the lanes to stop.

        Effects are at-least-once: a cancelled command is re-issued by the fold when its outcome is overdue.
        Call `drain()` first for a graceful stop.
        """
        self._closed = True
        tasks = [entry.task for entry in self._lanes.values() if entry.task is not None]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    async def _run(self, lane: str, account_id: int, entry: _Lane) -> None:
        account = self._accounts[account_id]
        try:
            while entry.items:
                work = entry.items[0]
                try:
                    # account slot first: work waiting on a busy account must not hold a global slot
                    async with account.slots, self._global:
                        self._in_flight += 1
                        try:
                            await work()
                        finally:
                            self._in_flight -= 1
                except Exception as exc:
                    log.error("lane work failed", extra={"lane": lane, "error_type": type(exc).__name__})
                finally:
                    entry.items.popleft()
                    self._done(1)
        finally:
            # on cancellation the rest of the lane is dropped with it
            self._done(len(entry.items))
            entry.items.clear()
            del self._lanes[lane]
            account.lanes -= 1
            if account.lanes == 0:
                del self._accounts[account_id]

    def _done(self, count: int) -> None:
        for _ in range(count):
            self._room.release()
        self._pending -= count
        if self._pending == 0:
            self._idle.set()
