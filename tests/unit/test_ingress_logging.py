"""Log limits (issue 10 item 4): library loggers write a few lines per window and then one "N similar lines
suppressed" line; the router's own loggers are not limited; aiohttp's request errors become one warning per
cause per window without the request's bytes; every line is one JSON object of printable ASCII."""

from __future__ import annotations

import io
import json
import logging
from collections.abc import Iterator

import pytest

from handlers.logging_setup import LIBRARY_BURST, LogLimiter, RateLimitedStreamHandler


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def logs() -> Iterator[tuple[Clock, io.StringIO, RateLimitedStreamHandler]]:
    clock, stream = Clock(), io.StringIO()
    handler = RateLimitedStreamHandler(stream, LogLimiter(burst=LIBRARY_BURST, interval_s=10.0, clock=clock))
    loggers = [logging.getLogger(name) for name in ("aiokafka.conn", "aiokafka", "aiohttp.server", "chatwoot_router.t")]
    for logger in loggers:
        logger.addHandler(handler)
        logger.propagate = False
        logger.setLevel(logging.DEBUG)
    yield clock, stream, handler
    for logger in loggers:
        logger.removeHandler(handler)
        logger.propagate = True
        logger.setLevel(logging.NOTSET)


def lines(stream: io.StringIO) -> list[dict[str, object]]:
    return [json.loads(line) for line in stream.getvalue().splitlines()]


def test_a_library_flood_is_a_few_lines_and_one_count_per_window(
    logs: tuple[Clock, io.StringIO, RateLimitedStreamHandler],
) -> None:
    clock, stream, _ = logs
    for n in range(4000):  # one second of aiokafka during an outage
        logging.getLogger("aiokafka.conn").error("Unable connect to node with id %d", n)
        logging.getLogger("aiokafka").error("Unable to update metadata from [%d]", n)
    assert len(lines(stream)) == 2 * LIBRARY_BURST
    clock.now += 10
    logging.getLogger("aiokafka").error("Unable to update metadata from [1]")
    written = lines(stream)
    summaries = [line for line in written if str(line["message"]).endswith("similar lines suppressed")]
    assert sorted((s["logger"], s["suppressed"]) for s in summaries) == [
        ("aiokafka", 4000 - LIBRARY_BURST),
        ("aiokafka.conn", 4000 - LIBRARY_BURST),
    ]
    assert all(s["level"] == "warning" for s in summaries)
    assert written[-1]["message"] == "Unable to update metadata from [1]"  # a new window has room again


def test_counts_still_pending_are_written_when_the_handler_closes(
    logs: tuple[Clock, io.StringIO, RateLimitedStreamHandler],
) -> None:
    _, stream, handler = logs
    for _ in range(LIBRARY_BURST + 3):
        logging.getLogger("aiokafka").warning("again")
    handler.close()
    assert lines(stream)[-1]["message"] == "3 similar lines suppressed"


def test_the_routers_own_loggers_are_not_limited(logs: tuple[Clock, io.StringIO, RateLimitedStreamHandler]) -> None:
    _, stream, _ = logs
    for n in range(50):
        logging.getLogger("chatwoot_router.t").info("webhook", extra={"n": n})
    assert len(lines(stream)) == 50


def test_aiohttp_request_errors_are_one_warning_per_cause_without_the_request(
    logs: tuple[Clock, io.StringIO, RateLimitedStreamHandler],
) -> None:
    clock, stream, _ = logs
    server = logging.getLogger("aiohttp.server")
    for _ in range(20):
        try:
            raise ValueError("Invalid header value char: b'X-Secret: hunter2\\xff'")
        except ValueError as exc:
            server.exception("Error handling request from %s", "203.0.113.9", exc_info=exc)
        try:
            raise ConnectionResetError("reset by hunter2")
        except ConnectionResetError as exc:
            server.error("Error handling request", exc_info=exc)
    written = lines(stream)
    assert [(line["level"], line["message"], line["error_type"]) for line in written] == [
        ("warning", "http request error", "ValueError"),
        ("warning", "http request error", "ConnectionResetError"),
    ]
    assert "hunter2" not in stream.getvalue() and "Traceback" not in stream.getvalue()
    clock.now += 10
    server.warning("plain")
    summaries = {(line["error_type"], line["suppressed"]) for line in lines(stream) if "suppressed" in line}
    assert summaries == {("ValueError", 19), ("ConnectionResetError", 19)}


def test_lines_are_printable_json_whatever_a_library_logs(
    logs: tuple[Clock, io.StringIO, RateLimitedStreamHandler],
) -> None:
    _, stream, _ = logs
    logging.getLogger("aiokafka").warning("odd \udcff bytes\nand a newline %s", "\x00")
    text = stream.getvalue()
    assert text.isascii() and len(text.splitlines()) == 1
    assert lines(stream)[0]["message"] == "odd \udcff bytes\nand a newline \x00"
