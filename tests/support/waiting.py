"""Waiting for a condition: poll it until it holds, or await it, and fail with what was awaited at the deadline.

A test states a time bound as the deadline of what it waits for, never as an assertion on a measured duration.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

import httpx
import pytest


def wait_until(what: str, check: Callable[[], Any], deadline_s: float = 60, every_s: float = 0.1) -> Any:
    """Poll `check` until it returns something truthy; fail with `what` at the deadline."""
    deadline = time.monotonic() + deadline_s
    last: Any = None
    while time.monotonic() < deadline:
        try:
            last = check()
        except (httpx.HTTPError, OSError) as exc:
            last = exc
        else:
            if last:
                return last
        time.sleep(every_s)  # polling interval between condition checks, bounded by the deadline
    pytest.fail(f"timed out waiting for {what}; last seen: {last!r}")


@contextlib.asynccontextmanager
async def within(deadline_s: float, what: str) -> AsyncIterator[None]:
    """The body must finish within `deadline_s`; it is cancelled at the deadline and the test fails with `what`."""
    timeout = asyncio.timeout(deadline_s)
    try:
        async with timeout:
            yield
    except TimeoutError:
        if not timeout.expired():
            raise
        pytest.fail(f"not within {deadline_s:g} s: {what}")
