"""The ingress's pre-built log line (`log_line`, issue 16 part 4): the same JSON object as the generic formatter,
the same fields dropped (secrets, bodies), printable ASCII, and the ordinary logging path wherever the line
would not reach exactly one of our handlers (so caplog and other handlers still see records)."""

from __future__ import annotations

import contextlib
import io
import json
import logging
from collections.abc import Iterator
from datetime import datetime
from typing import Any

import pytest
from aiohttp import ClientSession
from aiohttp.test_utils import TestServer

from handlers.ingress.door import WEBHOOK_PATH, create_app
from handlers.logging_setup import JsonFormatter, LogLimiter, RateLimitedStreamHandler, log_line
from tests.unit.test_webhook_app import NOW_MS, SETTINGS, MemoryWriter, message, signed

NAME = "chatwoot_router.test_log_line"
FIELDS: dict[str, Any] = {
    "outcome": "accepted",
    "event": "message_créé \x7f\n",
    "account_id": 1,
    "delivery_id": "d-1",
    "produce_ms": 1.25,
    "content": "my password is hunter2",
    "signature": "sha256=abc",
    "agent_bot_token": "bot-token",
    "Body_bytes": 3,
    "_private": "x",
    "odd": object(),
}


@contextlib.contextmanager
def only_our_handler(name: str) -> Iterator[io.StringIO]:
    """`name` logs to one RateLimitedStreamHandler only, as in the processes (configure_logging).

    Entered inside the test: pytest attaches its capture handlers to non-propagating loggers when a test
    phase starts, and with those present `log_line` (rightly) takes the ordinary path."""
    out = io.StringIO()
    logger = logging.getLogger(name)
    handler = RateLimitedStreamHandler(out, LogLimiter())
    logger.addHandler(handler)
    logger.propagate = False
    logger.setLevel(logging.INFO)
    try:
        yield out
    finally:
        logger.removeHandler(handler)
        logger.propagate = True
        logger.setLevel(logging.NOTSET)


def _without_time(line: str) -> dict[str, Any]:
    entry: dict[str, Any] = json.loads(line)
    datetime.fromisoformat(entry.pop("time"))  # a valid ISO time, as the formatter writes it
    return entry


def test_the_line_is_the_formatters_object_without_what_must_not_be_logged() -> None:
    logger = logging.getLogger(NAME)
    with only_our_handler(NAME) as stream:
        log_line(logger, logging.INFO, "webhook", FIELDS)
        logger.info("webhook", extra=FIELDS)  # the generic path, same handler
    fast, generic = stream.getvalue().splitlines()
    assert _without_time(fast) == _without_time(generic)
    assert set(_without_time(fast)) == {"level", "logger", "message", "outcome", "event", "account_id",
                                        "delivery_id", "produce_ms", "odd"}  # fmt: skip
    assert fast.isascii() and fast.isprintable()
    for hidden in ("hunter2", "sha256=abc", "bot-token", "Body_bytes", "_private"):
        assert hidden not in fast


def test_plain_fields_are_written_by_orjson_and_ordered_like_the_formatter() -> None:
    fields = {"outcome": "ignored", "event": "message_updated", "signing_account": 2}
    with only_our_handler(NAME) as stream:
        log_line(logging.getLogger(NAME), logging.WARNING, "webhook", fields)
    (line,) = stream.getvalue().splitlines()
    assert list(json.loads(line)) == ["time", "level", "logger", "message", "outcome", "event", "signing_account"]
    assert '"level":"warning"' in line  # orjson's compact form: no formatter involved


def test_below_the_level_nothing_is_written() -> None:
    with only_our_handler(NAME) as stream:
        log_line(logging.getLogger(NAME), logging.DEBUG, "webhook", {"outcome": "accepted"})
    assert stream.getvalue() == ""


def test_caplog_and_other_handlers_still_get_records(caplog: pytest.LogCaptureFixture) -> None:
    logger = logging.getLogger(NAME)
    with only_our_handler(NAME) as stream, caplog.at_level(logging.INFO, logger=NAME):
        logger.propagate = True  # now caplog's handler on the root logger is on the way as well
        log_line(logger, logging.INFO, "webhook", {"outcome": "accepted", "content": "secret text"})
    (record,) = caplog.records
    assert (record.getMessage(), record.__dict__["outcome"]) == ("webhook", "accepted")
    assert record.funcName == "test_caplog_and_other_handlers_still_get_records"  # the caller, not log_line
    assert "secret text" not in JsonFormatter().format(record)
    assert json.loads(stream.getvalue())["outcome"] == "accepted"


async def test_the_ingress_writes_one_line_per_webhook_without_secrets_or_bodies() -> None:
    writer = MemoryWriter()
    server = TestServer(create_app(settings=lambda: SETTINGS, writer=writer, clock_ms=lambda: NOW_MS))
    await server.start_server()
    try:
        with only_our_handler("chatwoot_router.ingress") as out:
            async with ClientSession() as session:
                for headers in (signed(message()), signed(message(), secret="guess")):
                    url = server.make_url(WEBHOOK_PATH)
                    async with session.post(url, data=message(), headers=headers) as response:
                        await response.read()
    finally:
        await server.close()
    accepted, refused = (json.loads(line) for line in out.getvalue().splitlines())
    assert {k: v for k, v in accepted.items() if k not in ("time", "produce_ms")} == {
        "level": "info",
        "logger": "chatwoot_router.ingress",
        "message": "webhook",
        "outcome": "accepted",
        "event": "message_created",
        "signing_account": 1,
        "account_id": 1,
        "conversation_id": 42,
        "delivery_id": "d-1",
    }
    assert isinstance(accepted["produce_ms"], float)
    assert (refused["outcome"], refused["event"]) == ("bad_signature", "")  # nothing is read before the signature
    text = out.getvalue()
    assert text.count('"message":"webhook"') == 2  # both through the pre-built line, not the formatter
    for secret in ("hunter2", "jo@example.com", "Jo ", "whsec-account-one", signed(message())["X-Chatwoot-Signature"]):
        assert secret not in text
