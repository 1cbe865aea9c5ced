"""Lanes: ordered work per conversation, concurrent across conversations, under caps (DESIGN §7 "Isolation").

The effect agent reads commands from one partition in order, but waiting for each HTTP call in turn would let
one slow System One answer hold up every other conversation of the partition. So each conversation gets a lane:
its commands still run one after another (the fold waits for one outcome per step anyway), while different
lanes run side by side. Two caps keep that from turning into a flood: a global one on work in flight, and a
per-account one so a single busy account cannot take every slot. `submit` blocks once too much is queued,
which pushes back on the consumer instead of buffering a partition's backlog in memory.

**First come, first served.** A conversation's turn is a series of commands, each issued only after the
previous outcome went through the fold. If a lane gave its slot back after every command, a burst of
conversations would advance one step per pass and all end together at the end of the burst. So a lane that ran
a command keeps its slots for the conversation's next command (up to `HOLD_S`, or until the fold says the run no
longer waits: `end_hold`), and the conversations that came first finish first. Holding yields to fairness: once a
lane has waited `STARVING_S` for a slot, holders give theirs back after each command (round robin, as without
holding), so no command waits anywhere near its deadline in a long backlog.

A lane exists only while it has work or holds slots: with 10,000 conversations there are at most as many lanes as
there are queued items plus slots, never one per conversation ever seen.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

log = logging.getLogger(__name__)

Work = Callable[[], Awaitable[None]]

GLOBAL_CAP = 64
ACCOUNT_CAP = 16
MAX_PENDING = 1024
HOLD_S = 1.0
"""How long a lane keeps its slots for its conversation's next command (the fold's round trip is ~10-100 ms)."""
STARVING_S = 15.0
"""A lane waiting this long for slots stops others from holding theirs (a command's deadline is >= 90 s)."""


@dataclass
class _Lane:
    items: deque[Work] = field(default_factory=deque)
    task: asyncio.Task[None] | None = None
    more: asyncio.Event = field(default_factory=asyncio.Event)
    """Set when an item is queued or the hold is ended, to wake a lane that holds its slots."""
    hold_ended: bool = False


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
        self,
        *,
        global_cap: int = GLOBAL_CAP,
        account_cap: int = ACCOUNT_CAP,
        max_pending: int = MAX_PENDING,
        hold_s: float = HOLD_S,
        starving_s: float = STARVING_S,
    ) -> None:
        if min(global_cap, account_cap, max_pending) < 1:
            raise ValueError("caps must be at least 1")
        self._hold_s = hold_s
        self._starving_s = starving_s
        self._waiting: dict[str, float] = {}  # lanes waiting for slots -> since when (monotonic), oldest first
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
        """Lanes that currently have work or hold slots."""
        return len(self._lanes)

    def end_hold(self, lane: str) -> None:
        """The lane's conversation waits for no command now (its turn ended): give its slots back at once."""
        entry = self._lanes.get(lane)
        if entry is not None:  # if its last command is still running, the lane lets go once it is done
            entry.hold_ended = True
            entry.more.set()

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
        entry.hold_ended = False
        entry.more.set()

    async def drain(self) -> None:
        """Wait until everything queued so far (and anything queued meanwhile) has run."""
        await self._idle.wait()

    async def cancel(self, which: Callable[[str], bool]) -> int:
        """Cancel the lanes `which` selects (queued and running work): their partitions moved to another worker,
        which re-issues what it still awaits (a mutation whose attempt was recorded is never made twice). Returns
        how many items were dropped."""
        chosen = [(lane, entry) for lane, entry in self._lanes.items() if which(lane) and entry.task is not None]
        dropped = sum(len(entry.items) for _, entry in chosen)
        for _, entry in chosen:
            assert entry.task is not None
            entry.task.cancel()
        await asyncio.gather(*(entry.task for _, entry in chosen if entry.task is not None), return_exceptions=True)
        return dropped

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
                self._waiting[lane] = time.monotonic()
                try:
                    # account slot first: work waiting on a busy account must not hold a global slot
                    async with account.slots, self._global:
                        del self._waiting[lane]
                        await self._run_while_holding(lane, entry)
                finally:
                    self._waiting.pop(lane, None)
        finally:
            # on cancellation the rest of the lane is dropped with it
            self._done(len(entry.items))
            entry.items.clear()
            del self._lanes[lane]
            account.lanes -= 1
            if account.lanes == 0:
                del self._accounts[account_id]

    async def _run_while_holding(self, lane: str, entry: _Lane) -> None:
        """Run the lane's items with its slots; keep them for the next item unless told or made to yield."""
        while True:
            work = entry.items[0]
            self._in_flight += 1
            try:
                await work()
            except Exception as exc:
                log.error("lane work failed", extra={"lane": lane, "error_type": type(exc).__name__})
            finally:
                self._in_flight -= 1
                entry.items.popleft()
                self._done(1)
            if self._someone_starving():
                return
            if not entry.items:
                entry.more.clear()
                if entry.hold_ended or self._hold_s <= 0:
                    return
                try:
                    async with asyncio.timeout(self._hold_s):
                        await entry.more.wait()
                except TimeoutError:
                    return
                if not entry.items:  # the hold was ended
                    return

    def _someone_starving(self) -> bool:
        oldest = next(iter(self._waiting.values()), None)
        return oldest is not None and time.monotonic() - oldest >= self._starving_s

    def _done(self, count: int) -> None:
        for _ in range(count):
            self._room.release()
        self._pending -= count
        if self._pending == 0:
            self._idle.set()
