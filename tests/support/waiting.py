"""Waiting for a condition: poll it until it holds, fail with what was awaited at the deadline."""

from __future__ import annotations

import time
from collections.abc import Callable
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
