"""Structured JSON logs on stderr for every process (behavior.md §11).

One JSON object per line: time, level, logger, message, plus the `extra={...}` fields of the call. Fields
whose names suggest a secret or a message body are dropped here as a last line of defence; callers still
must log only ids, counts and outcomes.
"""

from __future__ import annotations

import json
import logging
import sys
from datetime import UTC, datetime
from typing import Any, TextIO

# Attributes every LogRecord has; anything else on a record came from `extra=`.
_STANDARD_ATTRS = frozenset(vars(logging.LogRecord("", 0, "", 0, "", None, None))) | {"message", "asctime"}
_FORBIDDEN_WORDS = ("secret", "token", "signature", "password", "authorization", "content", "body")


def _safe_field(name: str) -> bool:
    lowered = name.lower()
    return not any(word in lowered for word in _FORBIDDEN_WORDS)


class JsonFormatter(logging.Formatter):
    """Formats a record as one JSON line; exceptions become `error_type` / `error` fields."""

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "time": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        for key, value in vars(record).items():
            if key not in _STANDARD_ATTRS and not key.startswith("_") and _safe_field(key):
                entry[key] = value
        if record.exc_info and record.exc_info[1] is not None:
            error = record.exc_info[1]
            entry.setdefault("error_type", type(error).__name__)
            entry.setdefault("error", str(error))
        return json.dumps(entry, default=str, ensure_ascii=False)


def configure_logging(level: int | str = logging.INFO, stream: TextIO | None = None) -> None:
    """Send all logs through one JSON handler (replacing any handlers already on the root logger)."""
    handler = logging.StreamHandler(stream or sys.stderr)
    handler.setFormatter(JsonFormatter())
    root = logging.getLogger()
    for existing in list(root.handlers):
        root.removeHandler(existing)
    root.addHandler(handler)
    root.setLevel(level)
