"""The arithmetic of Chatwoot's rate limit, pure (issue 30 "Throttling is not failure").

Chatwoot throttles every client IP with Rack::Attack (`RACK_ATTACK_LIMIT`, 3,000 requests a minute by default,
counted in fixed one-minute windows) and answers `429` in plain text, without `Retry-After`. The router paces
itself below that with a token bucket per installation, and backs the whole installation off after a 429: for
`Retry-After` when a proxy in front adds one (seconds or an HTTP date), else for a delay that starts at
`FIRST_BACKOFF_S` and doubles while 429s continue, up to `MAX_BACKOFF_S`.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from email.utils import parsedate_to_datetime

DEFAULT_REQUESTS_PER_MIN = 2400
"""Below Chatwoot's 3,000: a bucket of BURST_S seconds' worth plus a minute's rate stays under it in any window."""
BURST_S = 10.0
FIRST_BACKOFF_S = 5.0
MAX_BACKOFF_S = 60.0
MAX_RETRY_AFTER_S = 300.0
"""A `Retry-After` longer than this is taken as this: a misconfigured proxy must not stop routing for hours."""


def retry_after_s(value: str | None, now: datetime) -> float | None:
    """Seconds to wait from a `Retry-After` header (delta-seconds or an HTTP date); None when absent or unreadable."""
    if value is None or not value.strip():
        return None
    text = value.strip()
    if text.isdigit():
        return min(float(text), MAX_RETRY_AFTER_S)
    try:
        when = parsedate_to_datetime(text)
    except (TypeError, ValueError):
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    return min(max((when - now).total_seconds(), 0.0), MAX_RETRY_AFTER_S)


def next_backoff(previous_s: float | None, first_s: float = FIRST_BACKOFF_S) -> float:
    """The pause after a 429 without `Retry-After`: `first_s`, then twice the last one, at most MAX_BACKOFF_S."""
    if previous_s is None:
        return first_s
    return min(previous_s * 2, MAX_BACKOFF_S)


def worker_rate(per_minute: float, owned: int, partitions: int) -> float:
    """This worker's requests a minute: its share of the partitions (at least one), so a group stays under the
    installation's budget together."""
    if partitions <= 0:
        return per_minute
    return per_minute * max(min(owned, partitions), 1) / partitions


@dataclass
class TokenBucket:
    """`rate_per_s` tokens a second, at most `capacity` saved up; times are seconds on a monotonic clock."""

    rate_per_s: float
    capacity: float
    tokens: float
    at: float

    @classmethod
    def per_minute(cls, per_minute: float, now: float) -> TokenBucket:
        rate = max(per_minute, 1.0) / 60
        capacity = max(rate * BURST_S, 1.0)
        return cls(rate, capacity, capacity, now)

    def refill(self, now: float) -> None:
        if now > self.at:
            self.tokens = min(self.capacity, self.tokens + (now - self.at) * self.rate_per_s)
        self.at = max(self.at, now)

    def wait_s(self, now: float, n: float = 1.0) -> float:
        """Seconds until `n` tokens are there (0: now)."""
        self.refill(now)
        missing = n - self.tokens
        return 0.0 if missing <= 0 else missing / self.rate_per_s

    def take(self, now: float, n: float = 1.0) -> None:
        self.refill(now)
        self.tokens -= n

    def set_rate(self, per_minute: float, now: float) -> None:
        self.refill(now)
        self.rate_per_s = max(per_minute, 1.0) / 60
        self.capacity = max(self.rate_per_s * BURST_S, 1.0)
        self.tokens = min(self.tokens, self.capacity)
