"""The HTTP client of the Chatwoot and System One calls: httpx's API, aiohttp underneath (issue 16 part 1).

httpcore and anyio cost the worker more CPU per request than the request itself (measured: a failed `import
sniffio` per call, every pooled connection checked on every request), so the bytes go through aiohttp via the
`httpx-aiohttp` transport while callers keep `httpx.AsyncClient`, its exceptions and its `Response`.

The transport as published does not behave like httpx's own, so this module pins down what the router relied on:

- **Limits.** The pool keeps httpx's defaults: at most 100 connections, at most 20 idle ones kept for reuse
  (aiohttp keeps every released connection, so the connector closes those beyond 20), idle ones dropped after
  5 s; no per-host limit.
- **A request is sent once.** aiohttp re-sends a GET (any idempotent method) once when a reused connection
  fails; the session's retry is switched off, so the server sees exactly the requests the caller counted.
- **Failures keep their class.** The transport maps every `aiohttp.ClientConnectionError` to
  `httpx.ConnectTimeout` (a refused or dropped connection would count as a timeout) and lets protocol errors
  through as aiohttp exceptions; here they are mapped as httpcore did: connect / read timeouts, connect errors,
  read errors, remote protocol errors.
- **Timeouts.** httpx's connect and read timeouts become aiohttp's `sock_connect` and `sock_read`; its pool
  timeout becomes aiohttp's `connect` (waiting for a slot plus connecting). aiohttp has no write timeout. The
  router's clients put their whole call, body included, under one `asyncio.timeout` of the same length, so
  the limit a call gets is unchanged.
- **Redirects** are never followed (httpx's `follow_redirects=False`, and the transport passes
  `allow_redirects=False`); **cookies** are never kept nor sent: both APIs authenticate by token, one client
  serves every account (a cookie one account's answer set would ride on the next account's requests), and
  httpx's jar pass on every response cost 2.7 % of the worker's CPU (docs/benchmarks.md, issue 23); environment
  proxies are honoured as httpx honours them (its proxy mounts get this transport too).
- **Headers** are httpx's; aiohttp adds none of its own because httpx always sets them. Response heads may be
  as large as httpcore accepted (16 KiB a line instead of aiohttp's 8 KiB).
"""

from __future__ import annotations

import ssl
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import httpx
from aiohttp.client_proto import ResponseHandler
from aiohttp.client_reqrep import ConnectionKey
from httpx_aiohttp import AiohttpTransport

LIMITS = httpx.Limits(max_connections=100, max_keepalive_connections=20, keepalive_expiry=5.0)
MAX_HEAD_LINE = 16 * 1024  # h11 (httpcore) accepts response heads up to 16 KiB
MAX_HEADERS = 1024  # h11 has no count limit; aiohttp's default is 128

_TRANSPORT_FAILURES = (httpx.TransportError, aiohttp.ClientError, TimeoutError)


def _as_httpx_error(exc: BaseException, request: httpx.Request) -> httpx.TransportError:
    """The httpx exception httpcore would have raised for this aiohttp failure."""
    cause = exc.__cause__ if isinstance(exc, httpx.TransportError) and exc.__cause__ is not None else exc
    message = str(cause) or type(cause).__name__
    error: type[httpx.TransportError]
    if isinstance(cause, aiohttp.ConnectionTimeoutError):
        error = httpx.ConnectTimeout
    elif isinstance(cause, aiohttp.SocketTimeoutError):
        error = httpx.ReadTimeout
    elif isinstance(cause, aiohttp.ServerTimeoutError | TimeoutError):
        error = httpx.TimeoutException
    elif isinstance(cause, aiohttp.ClientHttpProxyError):
        error = httpx.ProxyError
    elif isinstance(cause, aiohttp.ClientConnectorError):  # refused, DNS, TLS handshake, proxy unreachable
        error = httpx.ConnectError
    elif isinstance(cause, aiohttp.InvalidURL):
        error = httpx.UnsupportedProtocol
    elif isinstance(cause, aiohttp.ClientPayloadError | aiohttp.ClientOSError):
        error = httpx.ReadError
    elif isinstance(cause, aiohttp.ClientError):  # disconnected without an answer, an answer that is not HTTP
        error = httpx.RemoteProtocolError
    elif isinstance(exc, httpx.TransportError):
        return exc
    else:
        error = httpx.TransportError
    return error(message, request=request)


class _Body(httpx.AsyncByteStream):
    """The response body, with the same exception mapping as the request."""

    def __init__(self, inner: httpx.AsyncByteStream, request: httpx.Request) -> None:
        self._inner = inner
        self._request = request

    async def __aiter__(self) -> AsyncIterator[bytes]:
        try:
            async for chunk in self._inner:
                yield chunk
        except _TRANSPORT_FAILURES as exc:
            raise _as_httpx_error(exc, self._request) from exc

    async def aclose(self) -> None:
        try:
            await self._inner.aclose()
        except _TRANSPORT_FAILURES as exc:
            raise _as_httpx_error(exc, self._request) from exc


class _IdleCappedConnector(aiohttp.TCPConnector):
    """A TCP connector that keeps at most `max_idle` idle connections, like httpcore's pool."""

    def __init__(self, *, max_idle: int | None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._max_idle = max_idle

    def _release(self, key: ConnectionKey, protocol: ResponseHandler, *, should_close: bool = False) -> None:
        if self._max_idle is not None and sum(len(idle) for idle in self._conns.values()) >= self._max_idle:
            should_close = True
        super()._release(key, protocol, should_close=should_close)


class RouterTransport(AiohttpTransport):
    """`httpx_aiohttp.AiohttpTransport` with httpx's pool limits, no re-sends and httpcore's exceptions."""

    def __init__(
        self,
        *,
        verify: ssl.SSLContext | str | bool = True,
        cert: Any = None,
        trust_env: bool = True,
        limits: httpx.Limits = LIMITS,
        proxy: httpx.Proxy | None = None,
    ) -> None:
        super().__init__(verify=verify, cert=cert, trust_env=trust_env, limits=limits, proxy=proxy)
        self.client = self._new_session  # created on first use, inside the running event loop

    def _new_session(self) -> aiohttp.ClientSession:
        connector = _IdleCappedConnector(
            max_idle=self.limits.max_keepalive_connections,
            limit=self.limits.max_connections or 0,  # 0: no limit, like httpx's None
            limit_per_host=0,
            keepalive_timeout=self.limits.keepalive_expiry,
            ssl=self.ssl_context,
            use_dns_cache=False,  # httpcore resolved every new connection
        )
        session = aiohttp.ClientSession(
            connector=connector,
            cookie_jar=aiohttp.DummyCookieJar(),
            timeout=aiohttp.ClientTimeout(),  # no session-wide limit: each request brings httpx's timeouts
            auto_decompress=False,
            max_line_size=MAX_HEAD_LINE,
            max_field_size=MAX_HEAD_LINE,
            max_headers=MAX_HEADERS,
        )
        # aiohttp re-sends an idempotent request once when a reused connection fails (RFC 9112 §9.3.1.1);
        # httpcore never did, and the router counts every request against a budget. There is no public switch.
        session._retry_connection = False
        return session

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        try:
            response = await super().handle_async_request(request)
        except _TRANSPORT_FAILURES as exc:
            raise _as_httpx_error(exc, request) from exc
        assert isinstance(response.stream, httpx.AsyncByteStream)
        response.stream = _Body(response.stream, request)
        return response


class _NoCookies(httpx.Cookies):
    """A cookie store that keeps nothing: responses' `Set-Cookie` headers are ignored, so no request has any."""

    def extract_cookies(self, response: httpx.Response) -> None:
        return None


class RouterHTTPClient(httpx.AsyncClient):
    """`httpx.AsyncClient` whose default transport (and proxy transports) is `RouterTransport`, and which keeps no
    cookies."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._cookies = _NoCookies()  # the `cookies` setter would copy it into a plain `Cookies`

    def _init_transport(
        self,
        verify: ssl.SSLContext | str | bool = True,
        cert: Any = None,
        trust_env: bool = True,
        http1: bool = True,
        http2: bool = False,
        limits: httpx.Limits = LIMITS,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> httpx.AsyncBaseTransport:
        if transport is not None:
            return transport
        return RouterTransport(verify=verify, cert=cert, trust_env=trust_env, limits=limits)

    def _init_proxy_transport(
        self,
        proxy: httpx.Proxy,
        verify: ssl.SSLContext | str | bool = True,
        cert: Any = None,
        trust_env: bool = True,
        http1: bool = True,
        http2: bool = False,
        limits: httpx.Limits = LIMITS,
    ) -> httpx.AsyncBaseTransport:
        return RouterTransport(verify=verify, cert=cert, trust_env=trust_env, limits=limits, proxy=proxy)


def new_http_client(transport: httpx.AsyncBaseTransport | None = None) -> httpx.AsyncClient:
    """The client for Chatwoot and System One: never follows redirects; `transport` replaces aiohttp (tests)."""
    return RouterHTTPClient(follow_redirects=False, limits=LIMITS, transport=transport)
