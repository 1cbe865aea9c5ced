"""The commit barrier: every write the worker depends on is acknowledged before it relies on it (issue 34).

Faust's `Producer.flush()` is not a barrier (docs/architecture.md "The commit protocol"): it returns as soon as
one 0.1 s wait passes without a message handed over, and a failed changelog send is only logged. So the worker
keeps the future of every write itself — each table's changelog record (`streams/worker/tables.py`) and each
record it sends — and `wait` awaits them all: before offsets are committed, before an effect that depends on them
is executed, before a configuration switch, before partitions are given up. A write that failed, or that is not
acknowledged within the deadline (below the group's rebalance timeout), breaks the barrier: the caller stops the
worker without committing (`handlers/worker/fencing.py`), the path a SIGKILL already proves safe.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

DEFAULT_TIMEOUT_S = 30.0
"""How long a barrier waits for its writes: under the 60 s rebalance timeout, above the producer's own 20 s request
timeout (a write aiokafka gives up on fails the barrier before the deadline does)."""

COMPACT_AT = 4096
"""Acknowledged futures are dropped from the list once it is this long (writes between two waits are many)."""


class BarrierBroken(Exception):
    """A write the worker depends on failed or was not acknowledged in time: stop without committing."""


class Barrier:
    """The futures of the writes sent since the last wait; `wait` returns once every one is acknowledged."""

    def __init__(self, timeout_s: float = DEFAULT_TIMEOUT_S) -> None:
        self.timeout_s = timeout_s
        self._pending: list[asyncio.Future[object]] = []

    def add(self, future: asyncio.Future[object]) -> None:
        """Track one write's future (a Faust `FutureMessage`, resolved or failed when Kafka answers)."""
        self._pending.append(future)
        if len(self._pending) >= COMPACT_AT:
            self._pending = [f for f in self._pending if not f.done() or f.cancelled() or f.exception() is not None]

    @property
    def pending(self) -> int:
        return sum(1 for f in self._pending if not f.done())

    async def wait(self, hand_over: Callable[[], Awaitable[object]] | None = None) -> int:
        """Hand buffered writes to the client (`hand_over`, e.g. the producer's flush), then wait until every write
        tracked so far is acknowledged; returns how many. Raises `BarrierBroken` when one failed or the deadline
        passed (the writes stay unknown: the caller must not commit or act on them)."""
        pending, self._pending = self._pending, []
        try:
            async with asyncio.timeout(self.timeout_s):
                if hand_over is not None:
                    await hand_over()
                results = await asyncio.gather(*pending, return_exceptions=True)
        except TimeoutError:
            waiting = sum(1 for f in pending if not f.done())
            raise BarrierBroken(
                f"{waiting} of {len(pending)} writes not acknowledged within {self.timeout_s:g} s"
            ) from None
        failed = [r for r in results if isinstance(r, BaseException)]
        if failed:
            raise BarrierBroken(f"{len(failed)} of {len(pending)} writes failed ({type(failed[0]).__name__})")
        return len(pending)
