"""Fail-stop: when the worker cannot be sure a write it depends on is durable, or that it still owns its
partitions, it stops at once without committing and starts again in a fresh process (issue 34).

This is the path a SIGKILL takes, which every kill loop proves safe: what was not committed is folded again from
the log and the changelogs by whoever owns the partitions next. Stopping cleanly instead would run Faust's
shutdown, which flushes and commits offsets — exactly what must not happen after a failed barrier. The fresh
start (`exec` of the same command) waits for Kafka like any start; a supervisor sees no exit.
"""

from __future__ import annotations

import logging
import os
import sys
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
