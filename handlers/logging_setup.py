"""Structured JSON logs on stderr for every process (behavior.md §11), with library loggers rate-limited.

One JSON object per line: time, level, logger, message, plus the `extra={...}` fields of the call. Fields
whose names suggest a secret or a message body are dropped here as a last line of defence; callers still
must log only ids, counts and outcomes.

Libraries can flood: during a broker outage aiokafka logs thousands of `Unable connect to node…` lines a
second. `RateLimitedStreamHandler` lets at most `LIBRARY_BURST` lines per library logger through in each
`LIBRARY_INTERVAL_S` window and then writes one `"N similar lines suppressed"` line for that logger (when the
window is over and the next line of any logger arrives, or when the process exits). The router's own loggers
(`chatwoot_router.*`) are not limited: they log one line per request or per decision, never in a loop.

aiohttp's server loggers report malformed requests and connections reset by clients with the offending bytes
in the exception text and a traceback. Those records are rewritten to one warning, `http request error` with
the exception class as `error_type` and nothing of the request, at most once per cause per window.

`log_line` is the per-request path of the ingress (issue 16 part 4): the same JSON object, built once with
orjson at the call site and written straight to the handler's stream, instead of a LogRecord, `extra` merging
and the generic formatter (16 % of the ingress's CPU per webhook). It applies the same field filter and keeps
lines printable ASCII; wherever the line would not reach exactly one `RateLimitedStreamHandler` (tests with
caplog, other handlers, filters) it logs through `logging` as before.
"""

from __future__ import annotations

import json
import logging
import sys
import threading
import time
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from typing import Any, TextIO

import orjson

# Attributes every LogRecord has; anything else on a record came from `extra=`.
_STANDARD_ATTRS = frozenset(vars(logging.LogRecord("", 0, "", 0, "", None, None))) | {"message", "asctime"}
_FORBIDDEN_WORDS = ("secret", "token", "signature", "password", "authorization", "content", "body")

OWN_LOGGER_PREFIX = "chatwoot_router"
LIBRARY_BURST = 5
"""Lines a library logger may write per window before the rest is counted instead of written."""
LIBRARY_INTERVAL_S = 10.0
"""The rate-limit window."""
_AIOHTTP_SERVER_LOGGERS = ("aiohttp.server", "aiohttp.access")


def _safe_field(name: str) -> bool:
    lowered = name.lower()
    return not any(word in lowered for word in _FORBIDDEN_WORDS)


def _kept_field(name: str) -> bool:
    """Whether JsonFormatter writes an `extra` field of this name (cached: the ingress logs a fixed set)."""
    kept = _KEPT.get(name)
    if kept is None:
        kept = _KEPT[name] = name not in _STANDARD_ATTRS and not name.startswith("_") and _safe_field(name)
    return kept


_KEPT: dict[str, bool] = {}


class JsonFormatter(logging.Formatter):
    """Formats a record as one JSON line; exceptions become `error_type` / `error` fields."""

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "time": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": _message(record),
        }
        for key, value in vars(record).items():
            if key not in _STANDARD_ATTRS and not key.startswith("_") and _safe_field(key):
                entry[key] = value
        if record.exc_info and record.exc_info[1] is not None:
            error = record.exc_info[1]
            entry.setdefault("error_type", type(error).__name__)
            entry.setdefault("error", str(error))
        # ensure_ascii keeps the line valid UTF-8 whatever a library put in its message (lone surrogates too)
        return json.dumps(entry, default=str, ensure_ascii=True)


def _message(record: logging.LogRecord) -> str:
    try:
        return record.getMessage()
    except Exception:  # a library's bad format string must not lose the line
        return str(record.msg)


def _is_library(name: str) -> bool:
    return name != OWN_LOGGER_PREFIX and not name.startswith(OWN_LOGGER_PREFIX + ".")


def _is_aiohttp_server(name: str) -> bool:
    return any(name == prefix or name.startswith(prefix + ".") for prefix in _AIOHTTP_SERVER_LOGGERS)


def _sanitise_aiohttp(record: logging.LogRecord) -> str:
    """Rewrite an aiohttp server record in place: a warning without request bytes; returns its cause."""
    error = record.exc_info[1] if record.exc_info else None
    cause = type(error).__name__ if error is not None else "unknown"
    if record.levelno > logging.WARNING:
        record.levelno, record.levelname = logging.WARNING, "WARNING"
    if error is not None:
        record.msg = "http request error"  # a malformed request, a reset connection, …: never its bytes
        record.args = ()
        record.__dict__["error_type"] = cause
        status = getattr(error, "code", None) or getattr(error, "status", None)
        if isinstance(status, int):
            record.__dict__["http_status"] = status
    record.exc_info = None
    record.exc_text = None
    record.stack_info = None
    return cause


class _Window:
    __slots__ = ("count", "started", "suppressed")

    def __init__(self, started: float) -> None:
        self.started = started
        self.count = 0
        self.suppressed = 0


class LogLimiter:
    """Per-key windows: `allow(key)` is True for the first `burst` calls of each `interval_s` window; the rest
    are counted, and `expired()` hands out each finished window's count once."""

    def __init__(
        self,
        burst: int = LIBRARY_BURST,
        interval_s: float = LIBRARY_INTERVAL_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.burst = burst
        self.interval_s = interval_s
        self._clock = clock
        self._windows: dict[tuple[str, str], _Window] = {}
        self._pending: list[tuple[tuple[str, str], int]] = []
        self._lock = threading.Lock()

    def allow(self, key: tuple[str, str], burst: int | None = None) -> bool:
        limit = self.burst if burst is None else burst
        with self._lock:
            now = self._clock()
            window = self._windows.get(key)
            if window is None or now - window.started >= self.interval_s:
                if window is not None and window.suppressed:
                    self._pending.append((key, window.suppressed))
                window = self._windows[key] = _Window(now)
            if window.count < limit:
                window.count += 1
                return True
            window.suppressed += 1
            return False

    def expired(self, *, everything: bool = False) -> list[tuple[tuple[str, str], int]]:
        """(key, suppressed count) of each window that is over (or of every window) and suppressed lines."""
        with self._lock:
            reports, self._pending = self._pending, []
            now = self._clock()
            for key, window in list(self._windows.items()):
                over = now - window.started >= self.interval_s
                if window.suppressed and (over or everything):
                    reports.append((key, window.suppressed))
                    window.suppressed = 0
                if over:
                    del self._windows[key]
        return reports


class RateLimitedStreamHandler(logging.StreamHandler[TextIO]):
    """A JSON stream handler that rate-limits library loggers and cleans aiohttp's request errors."""

    def __init__(self, stream: TextIO | None = None, limiter: LogLimiter | None = None) -> None:
        super().__init__(stream if stream is not None else sys.stderr)
        self.limiter = limiter or LogLimiter()
        self.setFormatter(JsonFormatter())

    def handle(self, record: logging.LogRecord) -> bool:
        self._report_suppressed()
        name = record.name
        if _is_library(name):
            if _is_aiohttp_server(name):
                cause = _sanitise_aiohttp(record)
                allowed = self.limiter.allow((name, cause), burst=1)
            else:
                allowed = self.limiter.allow((name, ""))
            if not allowed:
                return False
        return bool(super().handle(record))

    def write_line(self, line: str) -> None:
        """Write a line already formatted (see `log_line`); own loggers are never rate-limited."""
        self._report_suppressed()
        with self.lock:  # type: ignore[union-attr]  # created by Handler.__init__
            try:
                self.stream.write(line + self.terminator)
                self.flush()
            except (OSError, ValueError):  # a closed or broken stderr must not fail the request
                pass

    def _report_suppressed(self, *, everything: bool = False) -> None:
        for (name, cause), count in self.limiter.expired(everything=everything):
            summary = logging.LogRecord(
                name, logging.WARNING, __file__, 0, "%d similar lines suppressed", (count,), None
            )
            summary.__dict__["suppressed"] = count
            if cause:
                summary.__dict__["error_type"] = cause
            super().handle(summary)

    def close(self) -> None:
        try:
            self._report_suppressed(everything=True)
        finally:
            super().close()


class _SecondCache:
    """The "YYYY-MM-DDTHH:MM:SS" part of the time field, formatted once per second."""

    second = -1
    prefix = ""


def _iso_time(created: float) -> str:
    """`datetime.fromtimestamp(created, UTC).isoformat(timespec="milliseconds")`, cheaply."""
    second = int(created)
    if second != _SecondCache.second:
        _SecondCache.prefix = datetime.fromtimestamp(second, UTC).strftime("%Y-%m-%dT%H:%M:%S")
        _SecondCache.second = second
    return f"{_SecondCache.prefix}.{int((created - second) * 1000):03d}+00:00"


def _dumps(entry: dict[str, Any]) -> str:
    try:
        line = orjson.dumps(entry)
    except TypeError:  # a value orjson cannot write (lone surrogates, odd types): the formatter's way
        return json.dumps(entry, default=str, ensure_ascii=True)
    if not line.isascii():  # keep lines printable ASCII, as JsonFormatter's ensure_ascii does
        return json.dumps(entry, default=str, ensure_ascii=True)
    return line.decode("ascii")


def _sole_handler(logger: logging.Logger, level: int) -> RateLimitedStreamHandler | None:
    """The one handler a record of `logger` at `level` would reach, when that is a RateLimitedStreamHandler
    with no filters; None when anything else (another handler, a filter, a library logger) is involved."""
    if logger.filters or _is_library(logger.name):
        return None
    found: RateLimitedStreamHandler | None = None
    current: logging.Logger | None = logger
    while current is not None:
        for handler in current.handlers:
            if found is not None or type(handler) is not RateLimitedStreamHandler or handler.filters:
                return None
            if level >= handler.level:
                found = handler
        if not current.propagate:
            break
        current = current.parent
    return found


def log_line(logger: logging.Logger, level: int, message: str, fields: Mapping[str, Any]) -> None:
    """`logger.log(level, message, extra=fields)`, written as one pre-built JSON line when possible."""
    if not logger.isEnabledFor(level):
        return
    handler = _sole_handler(logger, level)
    if handler is None:
        logger.log(level, message, extra=dict(fields), stacklevel=2)
        return
    entry: dict[str, Any] = {
        "time": _iso_time(time.time()),
        "level": logging.getLevelName(level).lower(),
        "logger": logger.name,
        "message": message,
    }
    for key, value in fields.items():
        if _kept_field(key):
            entry[key] = value
    handler.write_line(_dumps(entry))


def configure_logging(level: int | str = logging.INFO, stream: TextIO | None = None) -> RateLimitedStreamHandler:
    """Send all logs through one rate-limited JSON handler (replacing any handlers already on the root logger)."""
    handler = RateLimitedStreamHandler(stream or sys.stderr)
    root = logging.getLogger()
    for existing in list(root.handlers):
        root.removeHandler(existing)
    root.addHandler(handler)
    root.setLevel(level)
    return handler
