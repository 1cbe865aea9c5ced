"""Hypothesis fuzz of the in-process door over raw HTTP (no broker; an in-memory writer stands in for Kafka).

Bodies and headers are built byte by byte — random JSON, wrong types, deep nesting, any unicode including lone
surrogates (as JSON escapes and as raw bytes), headers that are not UTF-8, bad and upper-case signatures,
stale and future timestamps, bodies at and over 2 MiB, chunked or with a length — and every answer is checked
against the status table of behavior.md §3.2, computed here independently: never a 5xx, and a record only
for a fresh, validly signed, relevant event of the signing account.
"""

from __future__ import annotations

import asyncio
import io
import json
import logging
import re
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from handlers.ingress.connections import ConnectionGuard, ConnectionLimits
from handlers.ingress.door import create_app, delivery_id_of, serve
from handlers.logging_setup import RateLimitedStreamHandler
from projections.webhook import sign
from tests.support.strategies import json_like
from tests.unit.test_webhook_app import NOW_MS, NOW_S, SECRETS, SETTINGS, MemoryWriter, message

TIMESTAMP = re.compile(r"[0-9]{1,12}")
TWO_MIB = 2 * 1024 * 1024  # behavior.md §3.2 step 0: a body of more than 2 MiB is 413, exactly 2 MiB is accepted


@dataclass
class Served:
    port: int
    writer: MemoryWriter


@pytest.fixture
async def served() -> AsyncIterator[Served]:
    writer = MemoryWriter()
    guard = ConnectionGuard(ConnectionLimits(read_timeout_s=5.0, keepalive_timeout_s=5.0, max_connections=64))
    app = create_app(settings=lambda: SETTINGS, writer=writer, clock_ms=lambda: NOW_MS, guard=guard)
    runner = await serve(app, "127.0.0.1", 0)
    try:
        yield Served(runner.addresses[0][1], writer)
    finally:
        await runner.cleanup()


async def raw_post(port: int, headers: list[tuple[bytes, bytes]], body: bytes, *, chunked: bool) -> tuple[int, bytes]:
    """POST /chatwoot/agent-bot written by hand (any header bytes), answered on a closing connection."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    head = [b"POST /chatwoot/agent-bot HTTP/1.1", b"Host: door", b"Connection: close"]
    head += [name + b": " + value for name, value in headers]
    if chunked:
        head.append(b"Transfer-Encoding: chunked")
        size = 65536
        payload = b"".join(
            b"%x\r\n%s\r\n" % (len(body[i : i + size]), body[i : i + size]) for i in range(0, len(body), size)
        )
        payload += b"0\r\n\r\n"
    else:
        head.append(b"Content-Length: %d" % len(body))
        payload = body
    try:
        writer.write(b"\r\n".join(head) + b"\r\n\r\n" + payload)
        await writer.drain()
    except ConnectionError:
        pass  # answered (413) and closed before the whole body was taken
    try:
        response = await asyncio.wait_for(reader.read(), 10)
    except ConnectionError:
        response = b""
    finally:
        writer.close()
    assert response.startswith(b"HTTP/1.1 "), response[:80]
    status = int(response.split(b" ", 2)[1])
    return status, response.partition(b"\r\n\r\n")[2]


# --- the independent oracle (behavior.md §3.2 and §3.3) -----------------------------------------------------


def expected(headers: dict[str, str], body: bytes) -> tuple[int, bytes] | None:
    """(status, text) the table prescribes, or None when a signed JSON body decides between 200 and 403."""
    if len(body) > TWO_MIB:
        return 413, b"payload too large"
    ts = headers.get("X-Chatwoot-Timestamp")
    if ts is None or not TIMESTAMP.fullmatch(ts) or abs(int(ts) - int(NOW_S)) > 300:
        return 401, b"invalid or stale timestamp"
    if signer_of(headers, body) is None:
        return 401, b"invalid signature"
    try:
        json.loads(body.decode("utf-8"), parse_constant=_no_constants)
    except (ValueError, RecursionError):
        return 400, b"bad request"
    return None


def _no_constants(name: str) -> Any:
    raise ValueError(name)


def signer_of(headers: dict[str, str], body: bytes) -> int | None:
    given = headers.get("X-Chatwoot-Signature", "").lower()
    ts = headers.get("X-Chatwoot-Timestamp", "")
    return next((a for a, s in sorted(SECRETS.items()) if given == sign(s, ts, body)), None)


# --- strategies ---------------------------------------------------------------------------------------------

any_text = st.text(st.characters(codec=None, min_codepoint=0, max_codepoint=0x10FFFF), max_size=8)  # surrogates too
json_values = json_like(st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | any_text, any_text)
FIELDS: dict[str, st.SearchStrategy[Any]] = {
    "event": st.sampled_from(["message_created", "conversation_updated", "conversation_status_changed", "x"])
    | json_values,
    "account": st.fixed_dictionaries({"id": st.sampled_from([1, 2, 3, 0, -1, 2**53, "1", 1.0, 1.5, None, True])})
    | json_values,
    "id": st.sampled_from([1, 42, 0, -1, None, 1.5, 2**60, "7"]) | json_values,
    "conversation": st.fixed_dictionaries({"id": st.sampled_from([42, 0, None, "42"])}) | json_values,
    "message_type": st.sampled_from(["incoming", "outgoing", 0, 1, None, True]) | json_values,
    "private": st.sampled_from([True, False, None, 0]) | json_values,
    "sender": st.none() | st.fixed_dictionaries({}, optional={"type": st.sampled_from(["contact", "user", None])}),
    "updated_at": st.sampled_from([1.5, 1e308, -1e308, 2**64, None, "x"]) | json_values,
    "changed_attributes": st.lists(
        st.fixed_dictionaries(
            {"status": st.fixed_dictionaries({"previous_value": any_text | json_values, "current_value": any_text})}
        ),
        max_size=2,
    )
    | json_values,
    "content": any_text,
}
STATUS_CHANGE = {
    "event": "conversation_status_changed",
    "account": {"id": 1},
    "id": 7,
    "updated_at": 1790000000.5,
    "changed_attributes": [{"status": {"previous_value": "pending", "current_value": "\udc80 open"}}],
}
BASES = [json.loads(message()), json.loads(message(account=2)), STATUS_CHANGE]


def deep(depth: int) -> bytes:
    return b'{"event":"message_created","x":' + b"[" * depth + b"]" * depth + b"}"


def padded(payload: bytes, size: int) -> bytes:
    return payload[:-1] + b" " * max(0, size - len(payload)) + b"}"


one_change = st.sampled_from(sorted(FIELDS)).flatmap(lambda key: FIELDS[key].map(lambda value: {key: value}))
near_valid = st.builds(lambda base, change: {**base, **change}, st.sampled_from(BASES), st.just({}) | one_change)
bodies = st.one_of(
    near_valid.map(lambda p: json.dumps(p).encode()),
    near_valid.map(lambda p: json.dumps(p).encode()),
    near_valid.map(lambda p: json.dumps(p, ensure_ascii=False).encode("utf-8", "surrogatepass")),  # raw surrogates
    st.fixed_dictionaries({}, optional=FIELDS).map(lambda p: json.dumps(p).encode()),
    st.sampled_from([10, 500, 5000, 100_000]).map(deep),
    st.sampled_from([TWO_MIB, TWO_MIB + 1]).map(lambda n: padded(message(), n)),
    st.sampled_from([b"", b"null", b"[]", b"NaN", b'{"event": Infinity}', b"\xff\xfe{}", b"{" * 10]),
    st.binary(max_size=64),
)
timestamps = st.just(NOW_S) | st.sampled_from(
    [
        NOW_S,
        NOW_S,
        NOW_S,
        "1790000300",
        "1789999700",
        "1789999699",
        "1790000301",
        "0",
        "9999999999999",
        "",
        "abc",
        " 1790000000",
        "１７９００００００００",
        "١٧٩٠٠٠٠٠٠٠",
        None,
    ]
)
secrets = st.sampled_from([SECRETS[1], SECRETS[1], SECRETS[2], "wrong", None])
deliveries = st.one_of(
    st.none(),
    st.uuids().map(lambda u: str(u).encode()),
    st.binary(min_size=1, max_size=40).map(lambda b: bytes(c for c in b if c >= 0x20 and c != 0x7F) or b"x"),
    st.sampled_from([b"\xff\xfe\xfd", b"caf\xc3\xa9", b"a" * 200, b"a" * 201, b"\xed\xb2\x80"]),
)


def signature_header(secret: str | None, ts: str | None, body: bytes, style: str) -> bytes | None:
    if secret is None:
        return None
    value = sign(secret, ts or "", body)
    if style == "upper":
        value = value.upper()
    elif style == "short":
        value = value[:-1]
    elif style == "prefix":
        value = "sha1=" + value[7:]
    return value.encode()


@settings(
    max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow]
)
@given(
    body=bodies,
    ts=timestamps,
    secret=secrets,
    style=st.sampled_from(["plain", "plain", "upper", "short", "prefix"]),
    delivery=deliveries,
    chunked=st.booleans(),
)
async def test_fuzz_statuses_follow_the_table_and_only_good_input_is_written(
    served: Served, body: bytes, ts: str | None, secret: str | None, style: str, delivery: bytes | None, chunked: bool
) -> None:
    served.writer.records.clear()
    raw: list[tuple[bytes, bytes]] = []
    seen: dict[str, str] = {}  # header values as HTTP delivers them (surrounding blanks are not part of them)
    if ts is not None:
        raw.append((b"X-Chatwoot-Timestamp", ts.encode()))
        seen["X-Chatwoot-Timestamp"] = ts.strip(" \t")
    signature = signature_header(secret, ts, body, style)
    if signature is not None:
        raw.append((b"X-Chatwoot-Signature", signature))
        seen["X-Chatwoot-Signature"] = signature.decode()
    if delivery is not None:
        raw.append((b"X-Chatwoot-Delivery", delivery))
    status, text = await raw_post(served.port, raw, body, chunked=chunked)
    event(f"{status} {text[:20]!r}")
    assert status < 500, (status, text)
    prescribed = expected(seen, body)
    if prescribed is not None:
        assert (status, text) == prescribed
        assert served.writer.records == []
        return
    assert (status, text) in {
        (200, b'{"ok":true}'),
        (200, b'{"ok":true,"ignored":true}'),
        (403, b"account does not match the webhook secret"),
    }
    if text != b'{"ok":true}':
        assert served.writer.records == []
        return
    (record,) = served.writer.records
    document = json.loads(body)
    assert record.account_id == signer_of(seen, body) == document["account"]["id"]
    # HTTP drops a header value's leading and trailing spaces and tabs (RFC 9110 §5.5) before the door sees it
    seen_delivery = delivery.decode("utf-8", "surrogateescape").strip(" \t") if delivery is not None else None
    wanted = delivery_id_of(seen_delivery)
    assert record.delivery_id == wanted
    assert wanted is None or (wanted.isascii() and wanted.isprintable() and len(wanted) <= 200)


# --- the two triggers of issue 10 item 6, one by one ----------------------------------------------------------


async def test_lone_surrogate_in_a_status_becomes_a_replacement_character(served: Served) -> None:
    body = json.dumps(STATUS_CHANGE).encode()  # "\udc80 open" as a JSON escape: valid UTF-8 bytes
    headers = [
        (b"X-Chatwoot-Timestamp", NOW_S.encode()),
        (b"X-Chatwoot-Signature", sign(SECRETS[1], NOW_S, body).encode()),
    ]
    assert await raw_post(served.port, [*headers, (b"X-Chatwoot-Delivery", b"d-7")], body, chunked=False) == (
        200,
        b'{"ok":true}',
    )
    (record,) = served.writer.records
    assert record.transition is not None and record.transition.status == "\ufffd open"
    assert record.delivery_id == "d-7"


@pytest.mark.parametrize(
    "delivery", [b"\xff\xfe-not-utf8", b"caf\xc3\xa9", b"tab\there", b"x" * 201], ids=["latin1", "utf8", "tab", "long"]
)
async def test_odd_delivery_id_is_treated_as_absent(served: Served, delivery: bytes) -> None:
    body = message()
    headers = [
        (b"X-Chatwoot-Timestamp", NOW_S.encode()),
        (b"X-Chatwoot-Signature", sign(SECRETS[1], NOW_S, body).encode()),
    ]
    status, text = await raw_post(served.port, [*headers, (b"X-Chatwoot-Delivery", delivery)], body, chunked=False)
    assert (status, text) == (200, b'{"ok":true}')
    assert [r.delivery_id for r in served.writer.records] == [None]
    async with asyncio.timeout(5):  # the door is still healthy: the odd input was not blamed on Kafka
        assert await served.writer.writable()


# --- malformed HTTP: aiohttp's own 400s, our 400 for unreadable bodies, logs without the request's bytes ------

MARKER = b"zq-secret-bytes"


@pytest.mark.parametrize(
    "request_bytes",
    [
        b"POST /chatwoot/agent-bot HTTP/1.1\r\nHost: d\r\nTransfer-Encoding: chunked\r\n\r\nzq-secret-bytes\r\n",
        b"POST /chatwoot/agent-bot HTTP/1.1\r\nHost: d\r\nX-Odd: zq-secret-bytes\x01\r\nContent-Length: 0\r\n\r\n",
        b"POST /chatwoot/agent-bot HTTP/1.1\r\nHost: d\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n",
        b"zq-secret-bytes /chatwoot/agent-bot HTTP/1.1\r\n\r\n",
        b"POST /chatwoot/agent-bot HTTP/1.1\r\nHost: d\r\nContent-Encoding: gzip\r\nContent-Length: 15\r\n\r\n"
        b"zq-secret-bytes",
        b"POST /chatwoot/agent-bot HTTP/1.1\r\nHost: d\r\nContent-Length: zq-secret-bytes\r\n\r\n",
    ],
    ids=["bad-chunk", "control-char", "length-and-chunked", "bad-method", "bad-gzip", "bad-length"],
)
async def test_malformed_requests_get_400_and_logs_never_quote_them(served: Served, request_bytes: bytes) -> None:
    stream = io.StringIO()
    handler = RateLimitedStreamHandler(stream)
    server_log = logging.getLogger("aiohttp.server")
    server_log.addHandler(handler)
    try:
        for _ in range(3):
            reader, writer = await asyncio.open_connection("127.0.0.1", served.port)
            writer.write(request_bytes)
            await writer.drain()
            response = await asyncio.wait_for(reader.read(), 10)
            writer.close()
            assert re.match(rb"HTTP/1\.[01] 400 ", response), response[:60]
    finally:
        server_log.removeHandler(handler)
    assert served.writer.records == []
    lines = [json.loads(line) for line in stream.getvalue().splitlines()]
    assert len(lines) <= 1  # once per cause per interval
    for line in lines:
        assert line["level"] == "warning" and line["message"] == "http request error"
    assert MARKER.decode() not in stream.getvalue()
