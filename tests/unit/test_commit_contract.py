"""The commit protocol against Faust's own consumer bookkeeping (issue 34): Faust's `_filter_committable_offsets`
and `_commit_offsets` run for real, only the broker call is replaced. When the worker commits less than Faust asked
(it acked records the service never folded), Faust must go on committing that partition afterwards.

Shown to fail without `streams/worker/transport.py` keeping Faust's own offset as its committed one: Faust's
`_new_offset` then saw a gap at the head of its acked records and never committed the partition again (a kill loop
in CI found it: 304 records whose states never reached the changelog)."""

from __future__ import annotations

from collections import defaultdict
from types import SimpleNamespace
from typing import Any

from aiokafka.consumer.group_coordinator import GroupCoordinator
from aiokafka.errors import CommitFailedError, IllegalGenerationError, RebalanceInProgressError, UnknownMemberIdError
from faust.types import TP
from intervaltree import IntervalTree

from handlers.worker.fencing import Fence
from streams.worker import transport

T = TP("router.conversations", 0)


class _Log:
    """Faust's service logger, silent (its `dev` and `info` lines); `flight_recorder` needs `log` too."""

    def __getattr__(self, name: str) -> Any:
        return lambda *args, **kwargs: None


class Recorder:
    def __init__(self) -> None:
        self.committed: list[dict[Any, int]] = []


def consumer_with(expected: list[int]) -> tuple[Any, Recorder]:
    """A transport consumer with Faust's real bookkeeping; the hook clamps to `expected.pop(0)` each commit."""
    consumer = transport.Consumer.__new__(transport.Consumer)  # nothing of it is started
    recorder = Recorder()

    async def commit(offsets: Any) -> bool:
        recorder.committed.append(dict(offsets))
        return True

    async def flush() -> None:
        return None

    class App:  # the parts of Faust's app its `_commit_offsets` calls (a class: the hook registry is weak)
        producer = SimpleNamespace(flush=flush)
        tables = SimpleNamespace(on_commit=lambda offsets: None)
        monitor = SimpleNamespace(on_tp_commit=lambda offsets: None)

    app = App()
    for name, value in {
        "app": app,
        "_acked": defaultdict(list),
        "_acked_index": defaultdict(set),
        "_committed_offset": defaultdict(lambda: None),
        "_gap": defaultdict(IntervalTree),
        "_commit": commit,
        "assignment": lambda: {T},
        "in_transaction": False,
        "log": _Log(),
    }.items():
        object.__setattr__(consumer, name, value)

    async def hook(offsets: Any) -> Any:
        limit = expected.pop(0)
        return {tp: min(offset, limit) for tp, offset in offsets.items()}

    transport.set_pre_commit(app, hook)
    return consumer, recorder


def ack(consumer: Any, *offsets: int) -> None:
    for offset in offsets:
        consumer._acked[T].append(offset)
        consumer._acked_index[T].add(offset)


async def commit_round(consumer: Any) -> bool:
    committable = consumer._filter_committable_offsets([T])  # Faust's own: takes the acked records off its list
    if not committable:
        return False
    return bool(await consumer._commit_offsets(committable))


async def test_a_clamped_commit_does_not_stop_faust_from_committing_the_partition_again() -> None:
    consumer, recorder = consumer_with(expected=[3, 10, 12])
    ack(consumer, 0, 1, 2, 3, 4)  # Faust acked 0-4; the service folded only 0-2 (next expected: 3)
    assert await commit_round(consumer)
    assert recorder.committed == [{T: 3}]  # not 5: records 3 and 4 were never folded
    ack(consumer, 5, 6, 7, 8, 9)  # later records; the service caught up (the gap reader folded 3 and 4)
    assert await commit_round(consumer), "Faust saw a gap at the head of its acked records and stopped committing"
    assert recorder.committed[-1] == {T: 10}
    ack(consumer, 10, 11)
    assert await commit_round(consumer)
    assert recorder.committed[-1] == {T: 12}


async def test_a_held_back_offset_is_committed_later_even_when_nothing_more_arrives() -> None:
    """A quiet partition: Faust acked 0-4 while the service had folded 0-2; no record comes after. The group's
    offset must still reach 5 once the service has folded 3 and 4, or a restart folds them again and a test (or an
    operator) waiting for the group to pass the conversation's last record waits for ever."""
    consumer, recorder = consumer_with(expected=[3, 3, 5])
    ack(consumer, 0, 1, 2, 3, 4)
    assert await commit_round(consumer)
    assert recorder.committed == [{T: 3}]
    await commit_round(consumer)  # still folding 3: held back again
    assert recorder.committed[-1] == {T: 3}
    assert await commit_round(consumer), "the held-back offset was never committed"
    assert recorder.committed[-1] == {T: 5}
    assert not await commit_round(consumer)  # owed nothing more: no commit
    assert len(recorder.committed) == 3


async def test_an_offset_held_back_on_a_revoked_partition_is_not_committed() -> None:
    consumer, recorder = consumer_with(expected=[3, 5])
    ack(consumer, 0, 1, 2, 3, 4)
    assert await commit_round(consumer)
    object.__setattr__(consumer, "assignment", lambda: set())  # the partition moved to another worker
    assert not await commit_round(consumer)
    assert recorder.committed == [{T: 3}]


def thread_committing(error: Exception, reported: list[str]) -> Any:
    """Our consumer thread with Faust's real `_commit`, whose aiokafka consumer's commit fails with `error` (raised
    from the group's answer, as aiokafka's coordinator does) through `fenced_commit`."""
    thread = transport.ConsumerThread.__new__(transport.ConsumerThread)  # nothing of it is started

    async def refused(offsets: Any) -> None:
        raise CommitFailedError("Commit cannot be completed since the group has already rebalanced") from error

    async def crash(exc: BaseException) -> None:
        raise AssertionError(f"Faust crashed the consumer: {exc!r}")

    consumer = SimpleNamespace(commit=transport.fenced_commit(refused, reported.append))
    for name, value in {
        "_consumer": consumer,
        "tp_last_committed_at": {},
        "assignment": lambda: {T},
        "log": _Log(),
        "crash": crash,
    }.items():
        object.__setattr__(thread, name, value)
    return thread


async def test_a_commit_refused_because_the_group_expelled_this_member_puts_the_worker_in_doubt() -> None:
    """An old generation or an unknown member: Faust's `_commit` swallows the refusal as an ordinary rebalance
    (returns False), so the worker learns of it only through `fenced_commit`; its fence then stops every further
    changelog write and mutation (handlers/worker/fencing.py). Shown to fail without `fenced_commit`."""
    for error in (IllegalGenerationError(), UnknownMemberIdError()):
        reported: list[str] = []
        fence = Fence(15.0)
        thread = thread_committing(error, reported)
        assert await thread._commit({T: 5}) is False  # Faust: "already rebalanced", nothing crashed
        assert reported == [f"the group refused an offset commit ({type(error).__name__})"]
        fence.expelled(reported[0])
        assert fence.in_doubt()  # not joined too: an expelled member owns nothing, whatever it thinks
        assert "refused an offset commit" in fence.reason()


async def test_a_commit_refused_during_an_ordinary_rebalance_is_not_a_doubt() -> None:
    """REBALANCE_IN_PROGRESS: this member is still in the group and rejoins; its revoke writes its cache as usual."""
    reported: list[str] = []
    thread = thread_committing(RebalanceInProgressError(), reported)
    assert await thread._commit({T: 5}) is False
    assert reported == []


def test_a_heartbeat_that_found_this_member_unknown_puts_a_worker_holding_partitions_in_doubt() -> None:
    """Issue 40: after a pause the consumer's thread may hear UNKNOWN_MEMBER_ID on its heartbeat before the worker
    commits anything; aiokafka then resets its generation to -1, and the fence's next question (before a changelog
    write or a mutation) sees it, without waiting for a commit to be refused after the write."""
    coordinator = SimpleNamespace(generation=7, member_id="m-1", request_rejoin=lambda: None)
    app = SimpleNamespace(
        _consumer=SimpleNamespace(_thread=SimpleNamespace(_consumer=SimpleNamespace(_coordinator=coordinator))),
        consumer_generation_id=7,
    )
    fence = Fence(15.0, membership=lambda: transport.forgotten_by_group(app))
    fence.joined()
    assert not fence.in_doubt()
    GroupCoordinator.reset_generation(coordinator)  # what aiokafka does on UNKNOWN_MEMBER_ID or ILLEGAL_GENERATION
    assert fence.in_doubt()
    assert "no longer knows this member" in fence.reason()
    idle = Fence(15.0, membership=lambda: transport.forgotten_by_group(app))
    assert not idle.in_doubt()  # not joined yet: not asked (before the first join the generation is -1 too)
    assert transport.forgotten_by_group(SimpleNamespace()) is None  # insides moved: no doubt from the probe
