"""Lanes: per-conversation order, concurrency across conversations, caps, isolation and clean-up."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

import pytest

from handlers.worker.lanes import Lanes

DEADLINE_S = 5.0


class Gauge:
    """Counts work in flight, overall and per account, and remembers the maxima."""

    def __init__(self) -> None:
        self.now = 0
        self.peak = 0
        self.by_account: dict[int, int] = {}
        self.account_peak: dict[int, int] = {}

    def work(self, account: int, release: asyncio.Event) -> Callable[[], Awaitable[None]]:
        async def run() -> None:
            self.now += 1
            self.by_account[account] = self.by_account.get(account, 0) + 1
            self.peak = max(self.peak, self.now)
            self.account_peak[account] = max(self.account_peak.get(account, 0), self.by_account[account])
            try:
                await release.wait()
            finally:
                self.now -= 1
                self.by_account[account] -= 1

        return run


async def until(condition: Callable[[], bool]) -> None:
    """Wait for `condition` with a deadline, yielding to the loop in between."""
    async with asyncio.timeout(DEADLINE_S):
        while not condition():
            await asyncio.sleep(0)


async def test_items_of_one_lane_run_in_submission_order_one_at_a_time() -> None:
    lanes = Lanes(hold_s=0)
    seen: list[int] = []
    running = 0
    overlapped = False

    def item(n: int) -> Callable[[], Awaitable[None]]:
        async def run() -> None:
            nonlocal running, overlapped
            running += 1
            overlapped = overlapped or running > 1
            await asyncio.sleep(0)
            seen.append(n)
            running -= 1

        return run

    for n in range(50):
        await lanes.submit("1:7", 1, item(n))
    async with asyncio.timeout(DEADLINE_S):
        await lanes.drain()
    assert seen == list(range(50))
    assert not overlapped


async def test_different_lanes_run_at_the_same_time() -> None:
    lanes = Lanes(hold_s=0)
    gauge = Gauge()
    release = asyncio.Event()
    for conversation in range(10):
        await lanes.submit(f"1:{conversation}", 1, gauge.work(1, release))
    await until(lambda: gauge.now == 10)
    release.set()
    async with asyncio.timeout(DEADLINE_S):
        await lanes.drain()
    assert gauge.now == 0 and lanes.pending == 0


async def test_the_global_cap_bounds_work_in_flight() -> None:
    lanes = Lanes(hold_s=0, global_cap=4, account_cap=100)
    gauge = Gauge()
    release = asyncio.Event()
    for n in range(20):
        await lanes.submit(f"{n % 5}:{n}", n % 5, gauge.work(n % 5, release))
    await until(lambda: gauge.now == 4)
    for _ in range(20):  # give any item past the cap every chance to start
        await asyncio.sleep(0)
    assert (gauge.now, lanes.in_flight) == (4, 4)
    release.set()
    async with asyncio.timeout(DEADLINE_S):
        await lanes.drain()
    assert gauge.peak == 4


async def test_the_account_cap_leaves_room_for_other_accounts() -> None:
    lanes = Lanes(hold_s=0, global_cap=5, account_cap=2)
    gauge = Gauge()
    busy, other = asyncio.Event(), asyncio.Event()
    for n in range(10):  # account 1 floods ten conversations
        await lanes.submit(f"1:{n}", 1, gauge.work(1, busy))
    await lanes.submit("2:1", 2, gauge.work(2, other))
    # account 2 starts although account 1 has eight items waiting: only two of them hold slots
    await until(lambda: gauge.by_account.get(2) == 1)
    for _ in range(20):
        await asyncio.sleep(0)
    assert gauge.by_account[1] == 2
    busy.set()
    other.set()
    async with asyncio.timeout(DEADLINE_S):
        await lanes.drain()
    assert gauge.account_peak == {1: 2, 2: 1}


async def test_a_slow_item_delays_only_its_own_lane() -> None:
    lanes = Lanes(hold_s=0)
    stuck = asyncio.Event()
    finished: list[str] = []

    async def slow() -> None:
        await stuck.wait()
        finished.append("slow")

    def quick(name: str) -> Callable[[], Awaitable[None]]:
        async def run() -> None:
            finished.append(name)

        return run

    await lanes.submit("1:1", 1, slow)
    await lanes.submit("1:1", 1, quick("after slow"))
    for n in range(5):
        await lanes.submit(f"1:{n + 2}", 1, quick(f"other {n}"))
    await until(lambda: len(finished) == 5)
    assert sorted(finished) == [f"other {n}" for n in range(5)]
    assert not stuck.is_set() and lanes.pending == 2
    stuck.set()
    async with asyncio.timeout(DEADLINE_S):
        await lanes.drain()
    assert finished[-2:] == ["slow", "after slow"]


async def test_an_error_is_logged_and_the_lane_goes_on(caplog: pytest.LogCaptureFixture) -> None:
    lanes = Lanes(hold_s=0)
    done: list[int] = []

    async def broken() -> None:
        raise RuntimeError("boom with a secret body")

    async def fine() -> None:
        done.append(1)

    with caplog.at_level(logging.ERROR, logger="handlers.worker.lanes"):
        await lanes.submit("1:1", 1, broken)
        await lanes.submit("1:1", 1, fine)
        async with asyncio.timeout(DEADLINE_S):
            await lanes.drain()
    assert done == [1]
    (record,) = caplog.records
    assert record.getMessage() == "lane work failed"
    assert (record.__dict__["lane"], record.__dict__["error_type"]) == ("1:1", "RuntimeError")
    assert "secret" not in caplog.text


async def test_idle_lanes_are_cleaned_up() -> None:
    lanes = Lanes(hold_s=0)
    count = 0

    async def tick() -> None:
        nonlocal count
        count += 1

    for conversation in range(10_000):
        await lanes.submit(f"{conversation % 7 + 1}:{conversation}", conversation % 7 + 1, tick)
    async with asyncio.timeout(30):
        await lanes.drain()
    assert count == 10_000
    assert lanes.lane_count == 0 and lanes.pending == 0
    assert not lanes._accounts  # per-account caps go with their last lane


async def test_submit_waits_when_too_much_is_queued() -> None:
    lanes = Lanes(hold_s=0, max_pending=3)
    release = asyncio.Event()
    gauge = Gauge()
    for _ in range(3):
        await lanes.submit("1:1", 1, gauge.work(1, release))
    fourth = asyncio.create_task(lanes.submit("1:2", 1, gauge.work(1, release)))
    for _ in range(20):
        await asyncio.sleep(0)
    assert not fourth.done() and lanes.pending == 3
    release.set()
    async with asyncio.timeout(DEADLINE_S):
        await fourth
        await lanes.drain()
    assert lanes.pending == 0 and gauge.peak <= 2


async def test_close_cancels_queued_work_and_refuses_more() -> None:
    lanes = Lanes(hold_s=0)
    started = asyncio.Event()
    ran_after: list[int] = []

    async def forever() -> None:
        started.set()
        await asyncio.Event().wait()

    async def later() -> None:
        ran_after.append(1)

    await lanes.submit("1:1", 1, forever)
    await lanes.submit("1:1", 1, later)
    async with asyncio.timeout(DEADLINE_S):
        await started.wait()
        await lanes.close()
        await lanes.drain()
    assert ran_after == [] and lanes.pending == 0 and lanes.lane_count == 0
    with pytest.raises(RuntimeError, match="closed"):
        await lanes.submit("1:1", 1, later)


# --- first come, first served: a lane keeps its slots for its conversation's next command ---------------------


class Turns:
    """Conversations whose turns are a few commands each, the next queued only after the previous one ran.

    `step` plays the fold's round trip: after a command ran, the conversation's next one is queued (or, after its
    last, `end_hold` is called, as the worker does once the run waits for nothing).
    """

    def __init__(self, lanes: Lanes, steps: int, *, end_holds: bool = True) -> None:
        self.lanes = lanes
        self.steps = steps
        self.end_holds = end_holds
        self.ran: list[tuple[str, int]] = []
        self.ended: list[str] = []
        self.round_trips: set[asyncio.Task[None]] = set()

    def command(self, lane: str, n: int) -> Callable[[], Awaitable[None]]:
        async def run() -> None:
            self.ran.append((lane, n))
            task = asyncio.create_task(self.next_after(lane, n))
            self.round_trips.add(task)
            task.add_done_callback(self.round_trips.discard)

        return run

    async def next_after(self, lane: str, n: int) -> None:
        for _ in range(3):  # the outcome goes through the fold before the next command comes back
            await asyncio.sleep(0)
        if n + 1 < self.steps:
            await self.lanes.submit(lane, 1, self.command(lane, n + 1))
            return
        self.ended.append(lane)
        if self.end_holds:
            self.lanes.end_hold(lane)


async def test_the_first_conversations_of_a_burst_finish_first() -> None:
    lanes = Lanes(account_cap=2, hold_s=30.0)  # a hold that ran out would blow the deadline
    turns = Turns(lanes, steps=5)
    for conversation in range(6):
        await lanes.submit(f"1:{conversation}", 1, turns.command(f"1:{conversation}", 0))
    await until(lambda: len(turns.ended) == 6)
    # two slots: conversations 0 and 1 run their whole turns before 2 and 3 start, and so on
    first_of_third = turns.ran.index(("1:2", 0))
    assert sorted(turns.ran[:first_of_third]) == [(lane, n) for lane in ("1:0", "1:1") for n in range(5)]
    first_of_fifth = turns.ran.index(("1:4", 0))
    assert {lane for lane, _ in turns.ran[first_of_third:first_of_fifth]} == {"1:2", "1:3"}
    await until(lambda: lanes.lane_count == 0)


async def test_without_holding_a_burst_advances_in_lockstep() -> None:
    """The behaviour holding replaces: every conversation advances one step per pass and all end together."""
    lanes = Lanes(account_cap=2, hold_s=0)
    turns = Turns(lanes, steps=5)
    for conversation in range(6):
        await lanes.submit(f"1:{conversation}", 1, turns.command(f"1:{conversation}", 0))
    await until(lambda: len(turns.ended) == 6)
    assert turns.ran.index(("1:5", 0)) < turns.ran.index(("1:0", 1))  # every turn started before any went on


async def test_a_hold_nobody_ends_runs_out_and_the_lane_goes_away() -> None:
    lanes = Lanes(account_cap=1, hold_s=0.05)
    turns = Turns(lanes, steps=2, end_holds=False)
    await lanes.submit("1:1", 1, turns.command("1:1", 0))
    await lanes.submit("1:2", 1, turns.command("1:2", 0))
    await until(lambda: len(turns.ended) == 2)  # 1:2 got the slot once 1:1's hold ran out
    assert turns.ended == ["1:1", "1:2"]
    await until(lambda: lanes.lane_count == 0)
    assert not lanes._accounts


async def test_a_lane_that_waited_too_long_makes_holders_yield() -> None:
    lanes = Lanes(account_cap=1, hold_s=30.0, starving_s=0.05)
    release = asyncio.Event()
    holder_steps = 0

    async def holder() -> None:
        nonlocal holder_steps
        holder_steps += 1
        await lanes.submit("1:1", 1, holder)  # a conversation that always has another command
        await release.wait()
        await asyncio.sleep(0)

    waited: list[str] = []

    async def waiter() -> None:
        waited.append("1:2")

    await lanes.submit("1:1", 1, holder)
    await lanes.submit("1:2", 1, waiter)
    await until(lambda: holder_steps == 1)
    release.set()  # from now on the holder runs command after command with its slot
    await until(lambda: waited == ["1:2"])
    assert holder_steps >= 1
    await lanes.close()


async def test_cancelling_the_lanes_of_moved_partitions_drops_their_work_and_keeps_the_others() -> None:
    """At a revoke, what still runs for a partition another worker now owns is cancelled (issue 34): it must not
    race the new owner; the other lanes go on."""
    lanes = Lanes(hold_s=0)
    release = asyncio.Event()
    ran: list[str] = []

    def item(name: str) -> Callable[[], Awaitable[None]]:
        async def run() -> None:
            await release.wait()
            ran.append(name)

        return run

    for name in ("moved-1", "moved-2", "kept-1"):
        await lanes.submit(name.split("-")[0], 1, item(name))
    await until(lambda: lanes.in_flight == 2)
    assert await lanes.cancel(lambda lane: lane == "moved") == 2
    assert lanes.pending == 1 and lanes.lane_count == 1
    release.set()
    await lanes.drain()
    assert ran == ["kept-1"]
