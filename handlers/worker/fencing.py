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
    """How long this worker went without running; in doubt, for good, once a gap exceeded the session timeout.

    The doubt is latched: after a pause, whichever runs first — a beat or a check before a write — must not erase
    the evidence for the other. It is armed while the worker owns partitions and folds them (not during a table
    recovery or a rebalance: a slow recovery is no reason to stop).
    """

    def __init__(self, session_timeout_s: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.session_timeout_s = session_timeout_s
        self.clock = clock
        self.armed = False
        self._last = clock()
        self._gap: float | None = None
        self._expelled: str | None = None

    def arm(self) -> None:
        """The worker owns partitions from now on: a gap longer than the session counts."""
        self.armed = True
        self._last = self.clock()

    def disarm(self) -> None:
        """The worker owns nothing it folds right now (a rebalance, a table recovery); a doubt already latched
        stays."""
        self.armed = False

    def beat(self) -> None:
        """The worker is running now (a tick, a record)."""
        now = self.clock()
        if self.armed and self._gap is None and now - self._last > self.session_timeout_s:
            self._gap = now - self._last
        self._last = now

    def expelled(self, why: str) -> None:
        """The group told this worker it is no longer the member it was (a commit refused for an old generation or an
        unknown member): another worker may own its partitions now, armed or not. Latched like a gap."""
        if self._expelled is None:
            self._expelled = why

    def in_doubt(self) -> bool:
        """Whether the worker went without running for longer than its session, or the group said it expelled it."""
        if self._expelled is not None:
            return True
        if self.armed and self._gap is None and self.clock() - self._last > self.session_timeout_s:
            self._gap = self.clock() - self._last
        return self._gap is not None

    def reason(self) -> str:
        if self._expelled is not None:
            return f"{self._expelled}: its partitions may belong to another worker now"
        gap = self._gap if self._gap is not None else self.clock() - self._last
        return (
            f"the worker did not run for {gap:.1f} s, longer than its {self.session_timeout_s:g} s session: its "
            "partitions may belong to another worker now"
        )
