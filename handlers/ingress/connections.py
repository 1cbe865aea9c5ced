"""Connection limits for the webhook door: a read deadline per request, an idle timeout, a connection cap.

aiohttp alone holds a connection that sends half a request and stalls for as long as the client likes. The
ingress listens through `GuardedSite`, which wraps aiohttp's protocol per connection:

- **Read deadline** (`read_timeout_s`, default 10 s): from the first byte of a request until its body is read.
  If the head is not complete by then the connection gets a bare `408 request timeout` and is closed; the
  webhook handler reads the body under the same deadline (`request_deadline`) and answers 408 when it passes.
- **Idle keep-alive timeout** (`keepalive_timeout_s`, default 15 s): aiohttp closes a connection that has been
  idle (no request started) that long, including a new connection that never sends anything.
- **Connection cap** (`max_connections`, default 512): a new connection beyond the cap first evicts the oldest
  connection that is not running a handler (idle, or still sending its request); when every connection is
  busy in a handler the new one gets `503` and is closed.
"""

from __future__ import annotations

import asyncio
import enum
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from aiohttp import web
from aiohttp.web_runner import BaseRunner, BaseSite

DEFAULT_READ_TIMEOUT_S = 10.0
DEFAULT_KEEPALIVE_TIMEOUT_S = 15.0
DEFAULT_MAX_CONNECTIONS = 512

_TIMEOUT_RESPONSE = (
    b"HTTP/1.1 408 Request Timeout\r\nContent-Type: text/plain; charset=utf-8\r\nContent-Length: 15\r\n"
    b"Connection: close\r\n\r\nrequest timeout"
)
_BUSY_RESPONSE = (
    b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: text/plain; charset=utf-8\r\nContent-Length: 4\r\n"
    b"Connection: close\r\n\r\nbusy"
)


@dataclass(frozen=True)
class ConnectionLimits:
    read_timeout_s: float = DEFAULT_READ_TIMEOUT_S
    keepalive_timeout_s: float = DEFAULT_KEEPALIVE_TIMEOUT_S
    max_connections: int = DEFAULT_MAX_CONNECTIONS


class _State(enum.Enum):
    IDLE = "idle"  # no request bytes since the last response (or since the connection opened)
    READING = "reading"  # a request has started arriving; its handler has not started yet
    HANDLING = "handling"  # a handler runs (it reads the body itself, under the request's deadline)


class ConnectionGuard:
    """Tracks the door's connections; `on_close(reason)` is told about each connection it closes."""

    def __init__(
        self,
        limits: ConnectionLimits | None = None,
        *,
        on_close: Callable[[str], None] | None = None,
    ) -> None:
        self.limits = limits or ConnectionLimits()
        self._on_close = on_close
        self._connections: dict[Any, _GuardedProtocol] = {}  # transport -> protocol, oldest first

    @property
    def open_connections(self) -> int:
        return len(self._connections)

    def protocol_factory(self, inner: Callable[[], asyncio.Protocol]) -> Callable[[], asyncio.Protocol]:
        return lambda: _GuardedProtocol(self, inner())

    def request_started(self, transport: Any) -> float | None:
        """Called as a handler starts: stops the head deadline; returns the request's loop-time deadline."""
        protocol = self._connections.get(transport)
        if protocol is None:
            return None
        return protocol.handler_started()

    def request_finished(self, transport: Any) -> None:
        protocol = self._connections.get(transport)
        if protocol is not None:
            protocol.handler_finished()

    # --- used by the protocols --------------------------------------------------------------------------

    def _admit(self, protocol: _GuardedProtocol) -> bool:
        if len(self._connections) >= self.limits.max_connections:
            victim = next((p for p in self._connections.values() if p.state is not _State.HANDLING), None)
            if victim is None:
                self._closed("refused")
                return False
            victim.close_for("evicted")
        self._connections[protocol.transport] = protocol
        return True

    def _forget(self, protocol: _GuardedProtocol) -> None:
        if self._connections.get(protocol.transport) is protocol:
            del self._connections[protocol.transport]

    def _touched(self, protocol: _GuardedProtocol) -> None:
        """Move a connection to the young end (eviction takes the one longest without progress)."""
        if self._connections.pop(protocol.transport, None) is protocol:
            self._connections[protocol.transport] = protocol

    def _closed(self, reason: str) -> None:
        if self._on_close is not None:
            self._on_close(reason)


class _GuardedProtocol(asyncio.Protocol):
    """Delegates everything to aiohttp's protocol; adds the head deadline and the bookkeeping of the cap."""

    def __init__(self, guard: ConnectionGuard, inner: asyncio.Protocol) -> None:
        self._guard = guard
        self._inner = inner
        self.transport: Any = None
        self.state = _State.IDLE
        self._deadline = 0.0
        self._timer: asyncio.TimerHandle | None = None
        self._loop = asyncio.get_running_loop()

    # asyncio.Protocol ----------------------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport
        if not self._guard._admit(self):
            if isinstance(transport, asyncio.WriteTransport):
                transport.write(_BUSY_RESPONSE)
            transport.close()
            self.transport = None
            return
        self._inner.connection_made(transport)

    def data_received(self, data: bytes) -> None:
        if self.transport is None:
            return
        if self.state is _State.IDLE and data:
            self.state = _State.READING
            self._deadline = self._loop.time() + self._guard.limits.read_timeout_s
            self._arm()
            self._guard._touched(self)
        self._inner.data_received(data)

    def eof_received(self) -> bool | None:
        return self._inner.eof_received() if self.transport is not None else None

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        if self.transport is None:
            return  # refused: aiohttp never saw it
        self._guard._forget(self)
        self.transport = None
        self._inner.connection_lost(exc)

    def pause_writing(self) -> None:
        self._inner.pause_writing()

    def resume_writing(self) -> None:
        self._inner.resume_writing()

    # the request's life --------------------------------------------------------------------------------

    def handler_started(self) -> float:
        self._disarm()
        if self.state is not _State.READING:  # pipelined: its bytes came while the previous one was handled
            self._deadline = self._loop.time() + self._guard.limits.read_timeout_s
        self.state = _State.HANDLING
        return self._deadline

    def handler_finished(self) -> None:
        self.state = _State.IDLE
        self._guard._touched(self)

    def close_for(self, reason: str) -> None:
        """Close this connection (a 408 first when a request is half-way in); aiohttp cleans up in connection_lost."""
        transport = self.transport
        if transport is None:
            return
        self._disarm()
        if self.state is _State.READING and not transport.is_closing():
            transport.write(_TIMEOUT_RESPONSE)
        self._guard._closed(reason)
        transport.close()

    def _arm(self) -> None:
        self._disarm()
        self._timer = self._loop.call_at(self._deadline, self._expired)

    def _disarm(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _expired(self) -> None:
        self._timer = None
        if self.state is _State.READING:
            self.close_for("read_timeout")


class GuardedSite(BaseSite):
    """A TCP site whose connections go through a `ConnectionGuard`."""

    __slots__ = ("_guard", "_host", "_port")

    def __init__(self, runner: BaseRunner, host: str, port: int, guard: ConnectionGuard, *, backlog: int = 128) -> None:
        super().__init__(runner, backlog=backlog)
        self._host = host
        self._port = port
        self._guard = guard

    @property
    def name(self) -> str:
        return f"http://{self._host}:{self._port}"

    async def start(self) -> None:
        await super().start()
        server = self._runner.server
        assert server is not None
        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(
            self._guard.protocol_factory(server),
            self._host,
            self._port,
            backlog=self._backlog,
            reuse_address=True,
        )


async def start_guarded(
    app: web.Application,
    host: str,
    port: int,
    guard: ConnectionGuard,
    *,
    shutdown_timeout: float = 10.0,
    lingering_time: float = 2.0,
) -> web.AppRunner:
    """Set up `app` and listen on host:port through `guard`; returns the runner (call `cleanup()` to stop)."""
    runner = web.AppRunner(
        app,
        access_log=None,
        shutdown_timeout=shutdown_timeout,
        keepalive_timeout=guard.limits.keepalive_timeout_s,
        lingering_time=lingering_time,
    )
    await runner.setup()
    site = GuardedSite(runner, host, port, guard)
    try:
        await site.start()
    except BaseException:
        await runner.cleanup()
        raise
    return runner
