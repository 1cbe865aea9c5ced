"""Jobs and their timing, shared by the route fold and the sweep fold (behavior.md §4.1–§4.6, §5).

Both folds keep one job per key (`Job`, `SweepJob`: version, attempts, not_before) and run it once due; a
request that arrives while the job exists merges into it; a failure backs off; a command waits for its outcome
until a deadline that allows each of its requests the full request timeout.
"""

from __future__ import annotations

from typing import TypeVar

from schemas.state import Job, SweepJob

DEFAULT_RETRY_BASE_MS = 5000
MAX_RETRY_DELAY_MS = 1_800_000
REQUEST_TIMEOUT_MS = 60_000  # §4.6: each request may take 60 s
DEADLINE_GRACE_MS = 30_000

J = TypeVar("J", Job, SweepJob)


def retry_delay(n: int, base_ms: int = DEFAULT_RETRY_BASE_MS) -> int:
    """§4.5: retryDelay(n) = min(base·2^n, 30 min)."""
    return int(min(base_ms * 2**n, MAX_RETRY_DELAY_MS))


def merged(job: J, now_ms: int) -> J:
    """§4.2: a new request for an existing job bumps its version; it is due now unless it is backing off."""
    not_before = job.not_before if job.attempts > 0 else min(job.not_before, now_ms)
    return job.evolve(version=job.version + 1, not_before=not_before)


def backed_off(job: J, now_ms: int, delay_ms: int) -> J:
    """§4.5: one more failed attempt, due again after `delay_ms`."""
    return job.evolve(attempts=job.attempts + 1, not_before=now_ms + delay_ms)


def due_again(job: J, now_ms: int) -> J:
    """A job that runs again now from a clean slate (merged while running, or the next page of a pass)."""
    return job.evolve(attempts=0, not_before=now_ms)


def command_deadline(now_ms: int, max_requests: int) -> int:
    """When a command's outcome is overdue: every request it may make may take the full timeout (§4.6)."""
    return now_ms + max_requests * REQUEST_TIMEOUT_MS + DEADLINE_GRACE_MS
