"""The worker's Kafka transport: Faust's aiokafka transport with a long-poll that is short only when it must be.

faust-streaming creates its worker consumer with `fetch_max_wait_ms=1500`. aiokafka leaves a partition whose
fetched records are not yet consumed out of the next fetch request, so under load a record produced to such a
partition can wait for a long-poll on the *other* partitions to time out: each hop of the route procedure
(command -> outcome -> next command) then took about a second (bench/worker_bench.py, docs/benchmarks.md). A
short long-poll (FETCH_MAX_WAIT_MS) bounds that wait. When no partition is left out (every fetched record was
consumed, none is paused), every partition is in the request and the broker answers it as soon as any of them gets
a record: the long-poll is then IDLE_FETCH_MAX_WAIT_MS, and an idle worker makes 2 fetch requests a second instead
of 20 (issue 40: an idle worker spent 27 ms of CPU a second on them, a third of a throttled burst's extra cost).

The consumer also runs the worker's pre-commit hook (`set_pre_commit`) in `_commit_offsets`, before Faust
commits the offsets: the write cache's changed keys are written there and the hook waits at the commit barrier
until every write is acknowledged, so no offset is committed before the states of the records below it are
durable, and it clamps the offsets to what the worker folded (docs/architecture.md "The commit protocol").

Faust picks a transport by the broker URL's scheme from its `faust.transports` entry points; this package
registers `router-kafka` (pyproject.toml), and the worker's broker URLs use it. Nothing in Faust is patched.
"""

from __future__ import annotations

import weakref
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

import aiokafka
from aiokafka.errors import CommitFailedError, IllegalGenerationError, UnknownMemberIdError
from faust.transport.drivers import aiokafka as faust_aiokafka
from faust.types import TP

SCHEME = "router-kafka"
FETCH_MAX_WAIT_MS = 50
"""The long-poll while a partition is left out of the fetch request: a record produced to it waits at most this."""
IDLE_FETCH_MAX_WAIT_MS = 500
"""The long-poll while no partition is left out (aiokafka's own default): a new record answers it at once."""


class LongPoll:
    """`fetch_max_wait_ms` as aiokafka's fetcher puts it in each fetch request: FETCH_MAX_WAIT_MS while a partition
    the worker consumes is left out of the request (aiokafka holds fetched records of it not consumed yet, or has
    it paused), else IDLE_FETCH_MAX_WAIT_MS. Faust keeps its tables' changelog partitions assigned but consumes them
    only while it recovers: the records aiokafka fetched of them wait in the fetcher for good, and do not count.
    The fetcher passes the value on to the request, which packs it as an Int32 when it is sent: `__index__` is where
    it is read."""

    def __init__(self, consumer: aiokafka.AIOKafkaConsumer, consumed: Callable[[Any], bool]) -> None:
        """`consumed(tp)`: whether the worker consumes that partition now."""
        self._consumer = consumer
        self._consumed = consumed

    def __index__(self) -> int:
        fetcher = getattr(self._consumer, "_fetcher", None)
        waiting = getattr(fetcher, "_records", None)
        subscription = getattr(self._consumer, "_subscription", None)
        if waiting is None or subscription is None:
            return FETCH_MAX_WAIT_MS  # not started, or an aiokafka whose insides moved: the safe value
        # read in the consumer's thread: `waiting` is that thread's own; list() copies it in one step
        left_out = [*list(waiting), *subscription.paused_partitions()]
        if any(self._consumed(tp) for tp in left_out):
            return FETCH_MAX_WAIT_MS
        return IDLE_FETCH_MAX_WAIT_MS

    __int__ = __index__

    def __repr__(self) -> str:
        return f"LongPoll({int(self)} ms)"


class ConsumerThread(faust_aiokafka.AIOKafkaConsumerThread):
    """Faust's consumer thread, whose worker consumer long-polls as `LongPoll` says."""

    def _create_worker_consumer(self, transport: Any) -> aiokafka.AIOKafkaConsumer:
        consumer = super()._create_worker_consumer(transport)
        if not hasattr(consumer, "_fetch_max_wait_ms"):
            raise RuntimeError("aiokafka consumer has no _fetch_max_wait_ms: revisit streams/worker/transport.py")
        consumer._fetch_max_wait_ms = LongPoll(consumer, self._consumed)  # handed to its fetcher when it starts
        consumer.commit = fenced_commit(consumer.commit, self._report_expelled)
        return consumer

    def _consumed(self, tp: Any) -> bool:
        """Whether Faust consumes `tp` now: one of its active partitions, or one whose buffer is full (it comes back
        as soon as that drains); every assigned one before it has chosen. Membership only: the sets belong to the
        event loop's thread, and this runs in the consumer's."""
        faust_consumer = self.consumer
        active = getattr(faust_consumer, "_active_partitions", None)
        if active is None:
            return True
        return tp in active or tp in getattr(faust_consumer, "_buffered_partitions", ())

    async def on_partitions_assigned(self, assigned: Any, generation_id: int = 0) -> None:
        """In the consumer's thread, the moment a join completes: the fence counts a pause from here (issue 40),
        before the event loop, which may be frozen with the rest of the process right now, hears of the join."""
        joined = _on_joined.get(self.consumer.app)
        if joined is not None:
            joined()
        await super().on_partitions_assigned(assigned, generation_id)

    def _report_expelled(self, why: str) -> None:
        report = _on_expelled.get(self.consumer.app)
        if report is not None:
            report(why)


Commit = Callable[..., Awaitable[None]]


def fenced_commit(commit: Commit, on_expelled: Callable[[str], None]) -> Commit:
    """`commit`, telling `on_expelled` when the group refuses it because this member was expelled.

    aiokafka turns an OffsetCommit answered with UNKNOWN_MEMBER_ID or ILLEGAL_GENERATION into a CommitFailedError
    ("the group has already rebalanced"), and Faust's `_commit` takes that as an ordinary rebalance: it returns
    False and the worker goes on, its revoke about to write its cache while another member may own its partitions
    (issue 34: fencing). REBALANCE_IN_PROGRESS is the ordinary case (this member is still in the group and rejoins)
    and is not reported. The error is raised on as before."""

    async def commit_or_report(*args: Any, **kwargs: Any) -> None:
        try:
            await commit(*args, **kwargs)
        except CommitFailedError as exc:
            cause = exc.__cause__
            if isinstance(cause, UnknownMemberIdError | IllegalGenerationError):
                on_expelled(f"the group refused an offset commit ({type(cause).__name__})")
            raise

    return commit_or_report


PreCommit = Callable[[Mapping[TP, int]], Awaitable[Mapping[TP, int]]]

_pre_commit: weakref.WeakKeyDictionary[Any, PreCommit] = weakref.WeakKeyDictionary()


_on_expelled: weakref.WeakKeyDictionary[Any, Callable[[str], None]] = weakref.WeakKeyDictionary()


_on_joined: weakref.WeakKeyDictionary[Any, Callable[[], None]] = weakref.WeakKeyDictionary()


def set_on_joined(app: Any, report: Callable[[], None]) -> None:
    """Call `report` (in the consumer's thread) each time `app`'s consumer completes a join of its group."""
    _on_joined[app] = report


def set_on_expelled(app: Any, report: Callable[[str], None]) -> None:
    """Call `report` when `app`'s group refuses a commit because this member was expelled (`fenced_commit`)."""
    _on_expelled[app] = report


def forgotten_by_group(app: Any) -> str | None:
    """Why `app`'s consumer knows it is no longer the member it was, or None: its heartbeat (or a join) was answered
    UNKNOWN_MEMBER_ID or ILLEGAL_GENERATION, and aiokafka reset its generation to -1 (`reset_generation`) while
    the app still works under the generation it was assigned in. The heartbeat runs in the consumer's thread and
    may learn this before any commit is refused: the fence asks before each write (handlers/worker/fencing.py).
    Two attribute reads; None when aiokafka's insides are not where they were."""
    thread = getattr(getattr(app, "_consumer", None), "_thread", None)
    coordinator = getattr(getattr(thread, "_consumer", None), "_coordinator", None)
    generation = getattr(coordinator, "generation", None)
    assigned_in = getattr(app, "consumer_generation_id", 0)
    if isinstance(generation, int) and generation < 0 and isinstance(assigned_in, int) and assigned_in > 0:
        return f"the group no longer knows this member (assigned in generation {assigned_in})"
    return None


def set_pre_commit(app: Any, hook: PreCommit) -> None:
    """Run `hook` at every offset commit of `app`'s consumer, before Faust commits: it gets the offsets Faust would
    commit and returns those that may be (the worker's commit protocol: docs/architecture.md)."""
    _pre_commit[app] = hook


class Consumer(faust_aiokafka.Consumer):
    # partition -> Faust's offset the hook held back at the last commit: committed at every commit until the hook
    # allows it, even when no record is acked there in the meantime (a quiet partition would otherwise keep the
    # group's lower offset, and a restart would fold its records again)
    def _owed(self) -> dict[TP, int]:
        return self.__dict__.setdefault("_owed_offsets", {})

    def _new_consumer_thread(self) -> faust_aiokafka.AIOKafkaConsumerThread:
        return ConsumerThread(self, loop=self.loop, beacon=self.beacon)

    def _filter_committable_offsets(self, tps: Any) -> dict[TP, int]:
        """Faust's offsets to commit, plus those held back before on partitions still assigned to this consumer."""
        offsets = dict(super()._filter_committable_offsets(tps))
        owed = self._owed()
        if owed:
            assignment = self.assignment()
            for tp in [tp for tp in owed if tp not in assignment]:
                del owed[tp]  # revoked: its next owner folds from the group's offset
            for tp, offset in owed.items():
                offsets.setdefault(tp, offset)
        return offsets

    async def _commit_offsets(self, offsets: Mapping[TP, int], start_new_transaction: bool = True) -> bool:
        """The worker's hook first (write the cache, wait at the barrier, clamp the offsets to what was folded);
        Faust then commits what the hook allows.

        `offsets` were taken from the acknowledged records before this runs, so everything the hook writes
        covers at least the records below them."""
        hook = _pre_commit.get(self.app)
        if hook is None:
            return await super()._commit_offsets(offsets, start_new_transaction=start_new_transaction)
        allowed = await hook(offsets)
        did_commit = (
            await super()._commit_offsets(allowed, start_new_transaction=start_new_transaction) if allowed else False
        )
        # Faust took these offsets' records off its acked list before this ran (`_new_offset`); if it kept the lower
        # offset the hook allowed as its committed one, the next acked record would look like a gap at the head
        # and Faust would never commit the partition again. So Faust keeps its own offset as committed, while the
        # group holds the lower one until a later commit (`_owed`) moves it on.
        owed = self._owed()
        held_back = {tp: offset for tp, offset in offsets.items() if allowed.get(tp) != offset}
        for tp in offsets:
            if tp not in held_back:
                owed.pop(tp, None)
        if held_back:
            assignment = self.assignment()
            held_back = {tp: offset for tp, offset in held_back.items() if tp in assignment}
            self._committed_offset.update(held_back)
            owed.update(held_back)
        return did_commit


class Transport(faust_aiokafka.Transport):
    Consumer = Consumer


def broker_urls(bootstrap: str) -> list[str]:
    """Faust broker URLs for a bootstrap list ("host:port,host:port") on this transport."""
    return [f"{SCHEME}://{host.strip()}" for host in bootstrap.split(",") if host.strip()]
