"""Fencing and fail-stop (issue 34): a worker that may have lost its partitions, or cannot be sure a write it
depends on is durable, writes nothing more and stops without committing, then starts again in a fresh process.

**Fence.** Under at-least-once nothing in Kafka stops a member the group expelled from writing: a worker paused
longer than its session (a GC pause, a frozen VM, SIGSTOP) wakes up still holding its write cache and its queued
effects, while another member already owns its partitions. Kafka transactions would fence its producer; this
worker fences itself instead (the argument is in docs/architecture.md): it notes that it runs every second (a task
of its own) and, before each changelog write and each mutation, asks `in_doubt()`: when more than the session
timeout has passed without a beat, it may have been expelled, so it stops without writing.

**Fail-stop.** This is the path a SIGKILL takes, which every kill loop proves safe: what was not committed is folded
again from the log and the changelogs by whoever owns the partitions next. Stopping cleanly instead would run
Faust's shutdown, which flushes and commits offsets — exactly what must not happen after a failed barrier. The
fresh start (`exec` of the same command) waits for Kafka like any start; a supervisor sees no exit.
"""

from __future__ import annotations

import logging
import os
import sys
import time
from collections.abc import Callable
from typing import NoReturn

log = logging.getLogger("chatwoot_router.worker")

STARTING_AGAIN = "; starting again"
"""Ends every line of a worker that replaces itself with a fresh start: what the tests and the kill loop count."""
FAIL_STOP = "stopping without committing" + STARTING_AGAIN


def fail_stop(reason: str) -> NoReturn:
    """Log one line with `reason` (no record content), then replace this process by a fresh start."""
    log.critical(f"{reason}: {FAIL_STOP}")
    logging.shutdown()
    os.execv(sys.executable, [sys.executable, *sys.orig_argv[1:]])


class Fence:
    """Whether this worker went without running for longer than its session while it was a member of its group,
    or was told it is no longer the member it was; in doubt, for good, once either happened.

    The doubt is latched: after a pause, whichever runs first — a beat, a check before a write, the next join —
    must not erase the evidence for the others. A gap counts from the moment the group first gave the worker an
    assignment (`joined`, called from the consumer's thread the moment the join completes, before the event loop
    hears of it) for the rest of the process's life: while it recovers its tables and while it gives partitions
    up too (issue 40). A slow recovery or a long revoke is no gap — the beat is a task of its own and goes on
    while they wait — but a process frozen in one wakes with a write cache, queued effects and a recovery that
    will say "done". A fence armed only once the worker was ready, or by a beat after the assignment, saw no gap
    then, and the worker folded, wrote and mutated partitions another member owned by that time. Only a gap before
    the first join (a slow start: it owns nothing yet) does not count.
    """

    def __init__(
        self,
        session_timeout_s: float,
        clock: Callable[[], float] = time.monotonic,
        membership: Callable[[], str | None] | None = None,
    ) -> None:
        """`membership()`: why the group's client already knows this member was expelled, or None (asked once
        joined, before each write: the heartbeat may hear it before a refused commit says it)."""
        self.session_timeout_s = session_timeout_s
        self.clock = clock
        self.membership = membership
        self._last = clock()  # the last beat
        self._member_since: float | None = None  # when the first join completed
        self._gap: float | None = None
        self._expelled: str | None = None

    @property
    def armed(self) -> bool:
        """Whether a gap counts: the worker has been a member of its group."""
        return self._member_since is not None

    def joined(self) -> None:
        """The group gave this worker an assignment just now (any thread). A gap already under way is judged
        first, so a join that follows a pause never hides it."""
        self._judge(self.clock())
        if self._member_since is None:
            self._member_since = self.clock()

    def beat(self) -> None:
        """The worker is running now (a task of its own, every second)."""
        now = self.clock()
        self._judge(now)
        self._last = now

    def _judge(self, now: float) -> None:
        if self._gap is None and self._member_since is not None:
            gap = now - max(self._last, self._member_since)
            if gap > self.session_timeout_s:
                self._gap = gap

    def expelled(self, why: str) -> None:
        """The group told this worker it is no longer the member it was (a commit refused for an old generation or an
        unknown member): another worker may own its partitions now, armed or not. Latched like a gap."""
        if self._expelled is None:
            self._expelled = why

    def in_doubt(self) -> bool:
        """Whether the worker went without running for longer than its session, or the group said it expelled it."""
        if self._expelled is None and self.armed and self.membership is not None:
            self._expelled = self.membership()
        if self._expelled is not None:
            return True
        self._judge(self.clock())
        return self._gap is not None

    def reason(self) -> str:
        if self._expelled is not None:
            return f"{self._expelled}: its partitions may belong to another worker now"
        gap = self._gap if self._gap is not None else self.clock() - self._last
        return (
            f"the worker did not run for {gap:.1f} s, longer than its {self.session_timeout_s:g} s session: its "
            "partitions may belong to another worker now"
        )
