"""Chatwoot's rate limit, the arithmetic (projections/worker/throttle.py) and the budget's order of service
(handlers/clients/budget.py): issue 30 "Throttling is not failure"."""

from __future__ import annotations

import asyncio
import itertools
import time
from datetime import UTC, datetime

import pytest

from handlers.clients.budget import GROUP_S, RequestBudget
from projections.worker.throttle import TokenBucket, next_backoff, retry_after_s, worker_rate

NOW = datetime(2026, 12, 3, 10, 0, 0, tzinfo=UTC)


@pytest.mark.parametrize(
    ("header", "expected"),
    [
        (None, None),
        ("", None),
        ("7", 7.0),
        ("Thu, 03 Dec 2026 10:00:30 GMT", 30.0),  # an HTTP date, 30 s ahead
        ("Thu, 03 Dec 2026 09:59:00 GMT", 0.0),  # already past
        ("86400", 300.0),  # a day: capped, routing never stops for hours on a proxy's word
        ("soon", None),
    ],
)
def test_retry_after_is_read_in_both_its_forms(header: str | None, expected: float | None) -> None:
    assert retry_after_s(header, NOW) == expected


def test_the_backoff_without_a_header_doubles_up_to_a_minute() -> None:
    pauses = []
    last = None
    for _ in range(6):
        last = next_backoff(last)
        pauses.append(last)
    assert pauses == [5.0, 10.0, 20.0, 40.0, 60.0, 60.0]


def test_a_worker_takes_its_share_of_the_partitions_and_never_none() -> None:
    assert worker_rate(2400, 6, 12) == 1200
    assert worker_rate(2400, 12, 12) == 2400
    assert worker_rate(2400, 0, 12) == 200  # between assignments it may still finish a command
    assert worker_rate(2400, 4, 12) + worker_rate(2400, 8, 12) == 2400  # a group stays under it together


def test_a_bucket_saves_ten_seconds_of_rate_and_then_paces() -> None:
    bucket = TokenBucket.per_minute(600, now=0.0)  # 10 a second
    assert bucket.capacity == 100
    bucket.take(0.0, 100)
    assert bucket.wait_s(0.0) == pytest.approx(0.1)
    assert bucket.wait_s(0.5) == 0.0  # five tokens came back
    bucket.set_rate(60, now=0.5)  # a smaller share after a rebalance: what was saved is capped too
    assert bucket.capacity == 10 and bucket.tokens <= 10


def test_in_any_minute_the_default_stays_under_chatwoots_limit() -> None:
    """Chatwoot counts per fixed minute: a full bucket plus a minute of rate must stay below 3,000."""
    bucket = TokenBucket.per_minute(2400, now=0.0)
    assert bucket.capacity + 2400 < 3000


async def test_the_conversation_that_asked_first_is_served_first() -> None:
    budget = RequestBudget(per_minute=600, group_s=0)  # 10 a second, one at a time: the order alone
    await budget.take("drain", n=100)  # the saved-up tokens are gone: from now on each request waits
    served: list[str] = []

    async def conversation(lane: str, reads: int) -> None:
        for _ in range(reads):  # one request after the other, as a run makes them
            await budget.take(lane)
            served.append(lane)

    first = asyncio.ensure_future(conversation("1:first", 3))
    await asyncio.sleep(0)
    later = [asyncio.ensure_future(conversation(f"1:{n}", 3)) for n in range(3)]
    await asyncio.wait_for(asyncio.gather(first, *later), 10)
    # the first conversation's reads come in a row, not one per pass behind every other conversation's
    assert served == ["1:first"] * 3 + ["1:0"] * 3 + ["1:1"] * 3 + ["1:2"] * 3, served


async def test_tokens_go_out_in_groups_to_the_conversations_first_in_line() -> None:
    """While requests wait, the budget wakes once per group of tokens, not once per token: their answers reach the
    log together and are folded in one batch."""
    budget = RequestBudget(per_minute=2400)  # 40 a second: 10 tokens a group
    await budget.take("drain", n=400)
    served: list[tuple[float, str]] = []

    async def request(lane: str) -> None:
        await budget.take(lane)
        served.append((time.monotonic(), lane))

    await asyncio.wait_for(asyncio.gather(*(request(f"1:{n}") for n in range(12))), 10)
    assert [lane for _, lane in served] == [f"1:{n}" for n in range(12)]
    times = [at for at, _ in served]
    # one token every 25 ms would be 12 wake-ups
    wake_ups = 1 + sum(1 for a, b in itertools.pairwise(times) if b - a > GROUP_S / 10)
    assert wake_ups <= 4, times  # 12 tokens at 10 a group: 2 groups (one or two more if one straddles), not 12


async def test_a_conversation_with_many_reads_goes_behind_the_others_after_its_hold() -> None:
    budget = RequestBudget(per_minute=6000, hold_tokens=3)
    await budget.take("drain", n=1000)
    served: list[str] = []

    async def request(lane: str) -> None:
        await budget.take(lane)
        served.append(lane)

    busy = [asyncio.ensure_future(request("1:busy")) for _ in range(8)]
    await asyncio.sleep(0)  # the busy conversation queues first
    other = asyncio.ensure_future(request("1:other"))
    await asyncio.wait_for(asyncio.gather(*busy, other), 10)
    assert served.index("1:other") == 3, served  # after the busy one's three in front, not after all eight


async def test_a_429_pauses_every_request_of_the_installation() -> None:
    budget = RequestBudget(per_minute=6000, first_backoff_s=0.3)
    assert budget.throttled(None) == pytest.approx(0.3)
    assert budget.paused_for_s > 0.2
    waited = await asyncio.wait_for(budget.take("1:1"), 5)
    assert waited > 0.2  # it waited for the pause instead of failing
    assert budget.throttled(None) == pytest.approx(0.6)  # 429s continue: the pause grows
    budget.answered()
    assert budget.throttled(None) == pytest.approx(0.3)  # a request got through in between: it starts over
    assert budget.stats.throttled == 3


async def test_a_cancelled_waiter_leaves_the_line() -> None:
    budget = RequestBudget(per_minute=60)  # one a second
    await budget.take("drain", n=10)
    waiting = asyncio.ensure_future(budget.take("1:gone"))
    await asyncio.sleep(0)
    waiting.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiting
    assert not budget._lanes
