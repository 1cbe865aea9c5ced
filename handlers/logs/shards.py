"""Partitions of the log shared out over processes (DESIGN §8 "Readers at scale": readers use every core).

A partition's records fold independently of every other partition's (a conversation lives in one partition), so
a rebuild, a verify and a what-if over everything run one task per partition, `jobs` processes at a time, the
largest partitions first. Each task runs its own event loop, consumer and producer in its process and returns a
small picklable result (counts, a capped list of rows); its progress (records read) comes back over a queue to
the parent, which shows it. With `jobs == 1` the tasks run one after the other in this process.

The pool forks its processes when it starts, before this module starts its own thread; a child's event loop is
its own (asyncio ignores a running loop inherited across a fork) and its signals are reset to the defaults.
"""

from __future__ import annotations

import asyncio
import multiprocessing
import os
import queue
import signal
import threading
from collections.abc import Callable, Coroutine, Iterable, Mapping
from typing import Any, TypeVar

from handlers.logs.reader import Progress

T = TypeVar("T")
Task = Callable[[int, Progress], Coroutine[Any, Any, T]]

STOP_SIGNALS = {signal.SIGTERM, signal.SIGINT}
_progress_queue: Any = None  # the child's end of the progress queue (set by the pool's initializer)
FLUSH_EVERY = 5000  # records between two progress messages from a child
SMALL_READ = 20_000  # records: below this a pool of processes costs more than it saves


def jobs_for(records: int, jobs: int | None) -> int:
    """The processes to use for a read of `records` records: `jobs` (default the cores), one for a small read."""
    return 1 if records < SMALL_READ else (jobs or default_jobs())


FORK_LOCK = threading.Lock()
"""Held while the pool's processes are forked. A library lock another thread of this process holds at the fork
(SQLite's, inside a query of the console's snapshot) stays held for good in the child, whose first use of that
library then waits forever: code that runs such a library beside `run_sharded` takes this lock around each use
(`handlers/console/snapshot.py`)."""


class ShardFailed(RuntimeError):
    """A task failed in its process; `str()` names the partition and the error (the traceback stays there)."""


def default_jobs() -> int:
    return max(1, os.cpu_count() or 1)


def run_sharded(
    task: Task[T],
    sizes: Mapping[int, int],
    jobs: int,
    progress: Progress | None = None,
) -> dict[int, T]:
    """`task(partition, progress)` for every partition of `sizes` (partition -> records to read), `jobs` at a time;
    returns each partition's result. Call it outside a running event loop."""
    order = sorted(sizes, key=lambda p: (-sizes[p], p))
    if jobs <= 1 or len(order) <= 1:
        return {p: asyncio.run(task(p, progress or _ignore)) for p in order}
    context = multiprocessing.get_context("fork")
    messages = context.Queue()
    # the children are forked with SIGTERM and SIGINT blocked and unblock them once their handlers are reset
    # (`_init_child`): a child ended before its initializer ran must not run the parent's handler (console stop)
    mask = signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)
    try:
        with FORK_LOCK:
            pool = context.Pool(min(jobs, len(order)), initializer=_init_child, initargs=(messages,))
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)
    with pool:
        stop = threading.Event()
        drain = threading.Thread(target=_drain, args=(messages, progress, stop), daemon=True)
        drain.start()
        try:
            results = dict(pool.imap_unordered(_Call(task), order))
        finally:
            stop.set()
            drain.join()
    failed = {p: r for p, r in results.items() if isinstance(r, _Failure)}
    if failed:
        partition, failure = min(failed.items())
        raise ShardFailed(f"partition {partition}: {failure.error}")
    return {p: r for p, r in results.items() if not isinstance(r, _Failure)}


class _Failure:
    def __init__(self, error: str) -> None:
        self.error = error


class _Call:
    """The picklable callable a pool process runs for one partition."""

    def __init__(self, task: Task[Any]) -> None:
        self.task = task

    def __call__(self, partition: int) -> tuple[int, Any]:
        sent = [0]

        def report(p: int, records: int) -> None:
            sent[0] += records
            if sent[0] >= FLUSH_EVERY:
                _progress_queue.put((p, sent[0]))
                sent[0] = 0

        try:
            result: Any = asyncio.run(self.task(partition, report))
        except Exception as exc:  # picklable whatever the exception was
            return partition, _Failure(f"{type(exc).__name__}: {exc}")
        finally:
            if sent[0]:
                _progress_queue.put((partition, sent[0]))
        return partition, result


def _init_child(messages: Any) -> None:
    """A pool process starts with the signal handling of a plain process: the parent's asyncio loop (the
    console's) set a wakeup descriptor for its own SIGTERM handler, and a child writing to it when the pool ends
    it would stop the parent."""
    global _progress_queue
    _progress_queue = messages
    if FORK_LOCK.locked():
        FORK_LOCK.release()  # forked while the parent held it: here nothing else holds it
    signal.set_wakeup_fd(-1)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, STOP_SIGNALS)  # blocked by the parent while it forked this process


def _drain(messages: Any, progress: Progress | None, stop: threading.Event) -> None:
    while not stop.is_set() or not messages.empty():
        try:
            partition, records = messages.get(timeout=0.2)
        except queue.Empty:
            continue
        if progress is not None:
            progress(partition, records)


def _ignore(partition: int, records: int) -> None:
    return None


def sizes_of(spans: Iterable[Any]) -> dict[int, int]:
    """partition -> records to read, from `log_reader.Span`s."""
    return {span.partition: span.size for span in spans}
