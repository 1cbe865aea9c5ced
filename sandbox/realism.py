"""The rough edges of a real Chatwoot (chatwoot.md §8, issue 30 item 3), each off unless asked for.

The kind sandbox answers every request, posts one conversation's webhooks one at a time in order, and never sends
the events a real installation adds. A `Realism` switches on, one by one or all together (`REALISTIC`, `--realistic`):

- `rate_limit`: Rack::Attack's `req/ip` throttle, N requests a minute per client IP (`RateLimiter`);
- `concurrent_webhooks`: every delivery is its own Sidekiq job, so one conversation's events race each other;
- `webhook_jitter_ms`: each job starts after a random delay up to this, so deliveries arrive reordered;
- `webhook_duplicates`: the probability that a job runs twice (a Sidekiq crash re-runs it: same payload, same
  `X-Chatwoot-Delivery`, as §2 says of at-least-once delivery);
- `waiting_since_updates`: a bot's public reply clears `waiting_since`, which sends a `conversation_updated`.

The world, the dispatcher and the rate limiter share one `Realism`, so `/_sandbox/settings` changes them at once.
"""

from __future__ import annotations

import json
import math
import random
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

PERIOD_S = 60
"""Rack::Attack's period for `req/ip` (`1.minute`); its windows are fixed: `floor(now / period)`."""

THROTTLED_BODY = b"Retry later\n"
"""rack-attack's default throttled responder: 429, `content-type: text/plain`, this body, no Retry-After (Chatwoot
never turns on `throttled_response_retry_after_header`)."""

LARGE_EMAIL_BYTES = 3 * 1024 * 1024
"""The webhook size `large_email` exceeds by default: past the router door's 2 MiB limit."""


KIND: dict[str, Any] = {
    "rate_limit": 0,
    "concurrent_webhooks": False,
    "webhook_jitter_ms": 0.0,
    "webhook_duplicates": 0.0,
    "waiting_since_updates": False,
}
"""The kind sandbox: no limit, in-order deliveries one at a time per conversation, no extra events."""

REALISTIC: dict[str, Any] = {
    "rate_limit": 3000,
    "concurrent_webhooks": True,
    "webhook_jitter_ms": 300.0,
    "webhook_duplicates": 0.05,
    "waiting_since_updates": True,
}
"""A default Chatwoot: 3,000 requests a minute (`RACK_ATTACK_LIMIT`), jobs in parallel and started within 300 ms,
one in twenty run twice, bot replies clearing `waiting_since`."""


@dataclass
class Realism:
    """Which rough edges are on; the defaults are the kind sandbox (nothing on). `seed` makes the random draws
    (jitter, duplicates) repeatable."""

    rate_limit: int = 0  # requests a minute per client IP; 0 = no limit
    concurrent_webhooks: bool = False
    webhook_jitter_ms: float = 0.0
    webhook_duplicates: float = 0.0
    waiting_since_updates: bool = False
    seed: int | None = None
    rng: random.Random = field(default_factory=random.Random, repr=False, compare=False)

    def __post_init__(self) -> None:
        _check(self.switches())
        self.rng.seed(self.seed)

    def switches(self) -> dict[str, Any]:
        return {name: getattr(self, name) for name in KIND}

    def update(self, settings: dict[str, Any]) -> None:
        """Apply the settings API's fields, all or none: `realistic` first (true: every edge at its `REALISTIC`
        value, false: none), then each field given, so `{"realistic": true, "rate_limit": 20}` is realistic with
        a tiny limit. Raises ValueError on a bad value."""
        values = self.switches()
        if "realistic" in settings:
            values = dict(REALISTIC if _flag("realistic", settings["realistic"]) else KIND)
        if "rate_limit" in settings:
            values["rate_limit"] = int(settings["rate_limit"] or 0)
        for name in ("concurrent_webhooks", "waiting_since_updates"):
            if name in settings:
                values[name] = _flag(name, settings[name])
        for name in ("webhook_jitter_ms", "webhook_duplicates"):
            if name in settings:
                values[name] = float(settings[name])
        seed = settings.get("seed", self.seed)
        seed = None if seed is None else int(seed)
        _check(values)
        for name, value in values.items():
            setattr(self, name, value)
        if "seed" in settings:
            self.seed = seed
            self.rng.seed(seed)

    def jitter_s(self) -> float:
        """How long the next webhook job waits before its first attempt."""
        return self.rng.uniform(0, self.webhook_jitter_ms) / 1000 if self.webhook_jitter_ms > 0 else 0.0

    def runs_twice(self) -> bool:
        """Whether the next webhook job is run a second time (a Sidekiq crash after it posted)."""
        return self.webhook_duplicates > 0 and self.rng.random() < self.webhook_duplicates

    def to_json(self) -> dict[str, Any]:
        return {**self.switches(), "seed": self.seed}


def realistic(seed: int | None = None, **overrides: Any) -> Realism:
    """Every rough edge at its `REALISTIC` value, but for `overrides` (field name -> value)."""
    return Realism(**{**REALISTIC, **overrides}, seed=seed)


def _check(values: dict[str, Any]) -> None:
    """Refuse values Chatwoot could not have (a negative limit, a probability above 1)."""
    if values["rate_limit"] < 0:
        raise ValueError("rate_limit must be 0 (off) or a number of requests a minute")
    if values["webhook_jitter_ms"] < 0:
        raise ValueError("webhook_jitter_ms must not be negative")
    if not 0.0 <= values["webhook_duplicates"] <= 1.0:
        raise ValueError("webhook_duplicates is a probability, from 0 to 1")


def _flag(name: str, value: Any) -> bool:
    if not isinstance(value, bool):
        raise ValueError(f"{name} must be true or false")
    return value


class RateLimiter:
    """Rack::Attack's `throttle('req/ip', limit: RACK_ATTACK_LIMIT, period: 1.minute)`: a count per client IP in
    fixed one-minute windows of the sandbox's clock (`/_sandbox/clock` moves into the next window); a request
    whose count passes the limit is throttled, and throttled requests count too, as in rack-attack.

    Real Chatwoot safelists loopback (`127.0.0.1`, `::1`); the sandbox does not, or no local router could ever
    be throttled. The client IP is the peer address (no proxy headers are read)."""

    def __init__(self, realism: Realism) -> None:
        self.realism = realism
        self.window: int | None = None
        self.counts: Counter[str] = Counter()
        self.throttled: Counter[str] = Counter()  # 429s per client IP since the sandbox started

    def admit(self, ip: str, now: float) -> bool:
        """Count one request from `ip` at `now`; False when it is to be answered 429."""
        limit = self.realism.rate_limit
        if limit <= 0:
            return True
        window = math.floor(now / PERIOD_S)
        if window != self.window:
            self.window = window
            self.counts.clear()
        self.counts[ip] += 1
        if self.counts[ip] <= limit:
            return True
        self.throttled[ip] += 1
        return False

    def restart(self) -> None:
        """Forget this window's counts (a new limit starts counting afresh)."""
        self.window = None
        self.counts.clear()

    def to_json(self) -> dict[str, Any]:
        return {
            "rate_limit": self.realism.rate_limit,
            "throttled": sum(self.throttled.values()),
            "throttled_by_ip": dict(self.throttled),
            "window_start": self.window * PERIOD_S if self.window is not None else None,
            "requests_this_window": dict(self.counts),
        }


def large_email(min_webhook_bytes: int = LARGE_EMAIL_BYTES) -> tuple[str, str]:
    """The text and HTML parts of a long newsletter-style e-mail whose `message_created` webhook passes
    `min_webhook_bytes`: the webhook carries `content_attributes` twice (top level and `conversation.messages[0]`),
    each with both parts three times (`full`, `reply`, `quoted`: a new mail quotes no history), and the text three
    times more (`content`, and `content` and `processed_message_content` in `messages[0]`); those copies alone
    are sized past it."""
    style = "font-family:Arial,Helvetica,sans-serif;font-size:14px;line-height:20px;color:#333333;padding:4px 0"

    def paragraph(n: int) -> tuple[str, str]:
        text = f"Item {n}: the quarterly report lists every order, refund and invoice of the period in detail."
        return text, f'<tr><td style="{style}">{text}</td></tr>'

    def encoded(value: str) -> int:
        return len(json.dumps(value, ensure_ascii=False).encode("utf-8")) - 2  # without the quotes

    sample_text, sample_html = paragraph(0)
    text_bytes = encoded(sample_text) + 2  # and its newline, escaped
    per_paragraph = 2 * (3 * text_bytes + 3 * encoded(sample_html)) + 3 * text_bytes
    count = min_webhook_bytes // per_paragraph + 1
    pieces = [paragraph(n) for n in range(1, count + 1)]
    text = "\n".join(piece[0] for piece in pieces)
    html = "<html><body><table>" + "".join(piece[1] for piece in pieces) + "</table></body></html>"
    return text, html
