"""Slow and half-open clients (issue 10 item 5), against the door served through its ConnectionGuard.

A few connections send half a request and stall; each is answered 408 and closed by the read deadline (head
or body), an idle connection is closed by the keep-alive timeout, and the connection cap evicts stalled
connections before it refuses a new one. Bounded: every wait has a deadline of a few seconds.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass

import pytest
from aiohttp import ClientSession

from handlers.ingress.connections import ConnectionGuard, ConnectionLimits
from handlers.ingress.door import IngressMetrics, create_app, serve
from projections.webhook import sign
from tests.support.waiting import within
from tests.unit.test_webhook_app import NOW_MS, NOW_S, SECRETS, SETTINGS, MemoryWriter, message

READ_TIMEOUT_S = 0.6
KEEPALIVE_S = 0.8
SLACK_S = 1.5  # scheduling on a busy 2-core machine


@dataclass
class Door:
    port: int
    writer: MemoryWriter
    guard: ConnectionGuard
    metrics: IngressMetrics

    def closed(self, reason: str) -> float:
        return self.metrics.connections_closed.labels(reason=reason)._value.get()


DoorFactory = Callable[..., Awaitable[Door]]


@pytest.fixture
async def door_factory() -> AsyncIterator[DoorFactory]:
    runners = []

    async def make(max_connections: int = 16, produce_timeout_s: float = 1.0) -> Door:
        writer = MemoryWriter()
        metrics = IngressMetrics()
        limits = ConnectionLimits(READ_TIMEOUT_S, KEEPALIVE_S, max_connections)
        guard = ConnectionGuard(limits, on_close=metrics.closed)
        app = create_app(
            settings=lambda: SETTINGS,
            writer=writer,
            clock_ms=lambda: NOW_MS,
            produce_timeout_s=produce_timeout_s,
            read_timeout_s=READ_TIMEOUT_S,
            metrics=metrics,
            guard=guard,
        )
        runner = await serve(app, "127.0.0.1", 0)
        runners.append(runner)
        return Door(runner.addresses[0][1], writer, guard, metrics)

    yield make
    for runner in runners:
        await runner.cleanup()


def signed_request(body: bytes) -> bytes:
    head = (
        f"POST /chatwoot/agent-bot HTTP/1.1\r\nHost: door\r\nContent-Length: {len(body)}\r\n"
        f"X-Chatwoot-Timestamp: {NOW_S}\r\nX-Chatwoot-Signature: {sign(SECRETS[1], NOW_S, body)}\r\n\r\n"
    )
    return head.encode() + body


async def held(port: int, data: bytes) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    if data:
        writer.write(data)
        await writer.drain()
    return reader, writer


async def closed_within(reader: asyncio.StreamReader, deadline_s: float) -> bytes:
    """Everything the door sends until it closes the connection, which it must do within `deadline_s`."""
    return await asyncio.wait_for(reader.read(), deadline_s)


async def test_half_sent_heads_and_bodies_get_408_and_are_closed_by_the_deadline(door_factory: DoorFactory) -> None:
    door: Door = await door_factory()
    body = message()
    request = signed_request(body)
    head_only = request[: request.index(b"\r\n\r\n") // 2]  # stops in the middle of the headers
    half_body = request[: len(request) - len(body) // 2]  # the head, then half the body
    async with within(READ_TIMEOUT_S + SLACK_S, "every stalled request answered 408 and closed"):
        clients = [await held(door.port, part) for part in (head_only, head_only, half_body, half_body)]
        reads = [asyncio.ensure_future(reader.read()) for reader, _ in clients]
        early, _ = await asyncio.wait(reads, timeout=READ_TIMEOUT_S * 0.8)
        assert not early, "answered or closed before the read deadline"
        answers = await asyncio.gather(*reads)
    for data in answers:
        assert data.startswith(b"HTTP/1.1 408 Request Timeout") and data.endswith(b"request timeout"), data[:60]
    for _, writer in clients:
        writer.close()
    assert door.writer.records == []
    assert door.closed("read_timeout") == 2  # the head-phase ones; the body-phase ones are the handler's 408
    await asyncio.sleep(0)
    assert door.guard.open_connections == 0


async def test_a_trickling_client_is_closed_at_the_deadline_not_kept_alive_by_each_byte(
    door_factory: DoorFactory,
) -> None:
    door: Door = await door_factory()
    reader, writer = await held(door.port, b"POST /chatwoot/agent-bot HTTP/1.1\r\n")

    async def trickle() -> None:
        with_bytes = b"X-Slow: " + b"a" * 100
        for byte in with_bytes:
            writer.write(bytes([byte]))
            await asyncio.sleep(0.05)

    trickling = asyncio.create_task(trickle())
    data = await closed_within(reader, READ_TIMEOUT_S + SLACK_S)  # the trickle alone would take 5 s
    trickling.cancel()
    assert data.startswith(b"HTTP/1.1 408 ")
    writer.close()


async def test_idle_connections_are_closed_by_the_keepalive_timeout(door_factory: DoorFactory) -> None:
    door: Door = await door_factory()
    fresh_reader, fresh_writer = await held(door.port, b"")  # connects, never sends a byte
    async with ClientSession() as session:  # a kept-alive connection after one good request
        body = message()
        headers = {"X-Chatwoot-Timestamp": NOW_S, "X-Chatwoot-Signature": sign(SECRETS[1], NOW_S, body)}
        async with session.post(f"http://127.0.0.1:{door.port}/chatwoot/agent-bot", data=body, headers=headers) as r:
            assert r.status == 200
        assert door.guard.open_connections == 2
        data = await closed_within(fresh_reader, KEEPALIVE_S + SLACK_S)
        assert data == b""
        deadline = time.monotonic() + KEEPALIVE_S + SLACK_S
        while door.guard.open_connections and time.monotonic() < deadline:
            await asyncio.sleep(0.02)  # poll: the kept-alive connection closes at its own timeout
        assert door.guard.open_connections == 0
    fresh_writer.close()


async def test_the_cap_evicts_stalled_connections_so_a_good_webhook_still_gets_in(door_factory: DoorFactory) -> None:
    door: Door = await door_factory(max_connections=3)
    stalled = [await held(door.port, b"POST /chatwoot/agent-bot HTTP/1.1\r\nHost: x\r\n") for _ in range(3)]
    assert door.guard.open_connections == 3
    reader, writer = await held(door.port, signed_request(message()))
    data = await asyncio.wait_for(reader.readuntil(b'{"ok":true}'), 5)
    assert data.startswith(b"HTTP/1.1 200 OK")
    writer.close()
    evicted = await closed_within(stalled[0][0], 2)  # the oldest stalled one made room
    assert evicted.startswith(b"HTTP/1.1 408 ")
    assert door.closed("evicted") == 1
    assert len(door.writer.records) == 1
    for _, stalled_writer in stalled:
        stalled_writer.close()


async def test_the_cap_refuses_a_new_connection_when_every_one_is_busy(door_factory: DoorFactory) -> None:
    door: Door = await door_factory(max_connections=2, produce_timeout_s=2.0)
    door.writer.hang = True  # Kafka does not answer: both requests sit in their handlers
    busy = [await held(door.port, signed_request(message())) for _ in range(2)]
    async with within(10, "both busy connections open in the door"):
        while door.guard.open_connections < 2:
            await asyncio.sleep(0.01)  # polling interval, bounded by the deadline
    reader, writer = await held(door.port, b"")
    data = await closed_within(reader, 2)
    assert data.startswith(b"HTTP/1.1 503 Service Unavailable")
    assert door.closed("refused") == 1
    for busy_reader, busy_writer in busy:  # the busy ones still get their (500) answer
        answer = await asyncio.wait_for(busy_reader.readuntil(b"internal error"), 5)
        assert answer.startswith(b"HTTP/1.1 500 ")
        busy_writer.close()
    writer.close()
