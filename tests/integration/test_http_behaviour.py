"""What the router's HTTP clients promise, whatever carries their bytes (issue 16 part 1).

Redirects are never followed (a token must not reach another host), the per-call limit covers the whole
response body, the transport's own read timeout applies, at most 100 connections are open and at most 20 idle
ones are kept (5 s), a request is sent once (never silently re-sent on a reused connection), failures keep
their class (a dropped connection or a broken answer is a network error, not a timeout), and the requests carry
the same headers. Each test talks real HTTP on loopback to a server of its own that can misbehave on cue.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import httpx
import pytest
from aiohttp import web

from handlers.clients.chatwoot import ChatwootClient, ChatwootError, ChatwootNetworkError, ChatwootTimeout
from handlers.clients.systemone import JevHTTPError, JevNetworkError, JevTimeout, SystemOneClient
from handlers.privacy.keyring import memory_keyring
from handlers.worker.effects import EffectExecutor
from sandbox import Sandbox, run_sandbox
from sandbox.scenario import SAMPLE
from schemas.config import Secrets, Settings, parse_config
from schemas.records import EffectCommand, ListAgents

USER, BOT = "user-1", "bot-5"
AGENTS = "/api/v1/accounts/1/agents"
MAX_CONNECTIONS, MAX_IDLE = 100, 20  # httpx's defaults, which the router has always run with

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


@dataclass
class Peer:
    """A loopback HTTP server that records what it receives; `handler` decides the answer."""

    handler: Handler
    url: str = ""
    hits: list[dict[str, Any]] = field(default_factory=list)

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        peer = request.transport.get_extra_info("peername") if request.transport else None
        self.hits.append({"path": request.path, "port": peer[1] if peer else None, "headers": dict(request.headers)})
        return await self.handler(request)


@contextlib.asynccontextmanager
async def serve(handler: Handler) -> AsyncIterator[Peer]:
    peer = Peer(handler)
    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", peer._handle)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    peer.url = f"http://127.0.0.1:{port}"
    try:
        yield peer
    finally:
        await runner.cleanup()


async def empty_list(request: web.Request) -> web.StreamResponse:
    return web.json_response([])


def settings(base_url: str) -> Settings:
    config = parse_config(
        {
            "chatwoot": {"baseUrl": base_url},
            "routing": {
                "endpoint": f"{base_url}/v1/systemone",
                "botIds": {"1": 5},
                "accounts": {"1": {"billing": {"assignee": 2, "covers": "Invoices and refunds"}}},
            },
        }
    )
    secrets = Secrets(
        chatwoot_token=USER, agent_bot_tokens={1: BOT}, agent_bot_secrets={1: "s"}, typesafe_api_key="jev-key"
    )
    return Settings(config=config, secrets=secrets)


def list_agents(n: int = 0) -> EffectCommand:
    return EffectCommand(at_ms=1, key="1:1", account_id=1, command_id=f"1:1:{n}:list_agents", params=ListAgents())


# --- redirects ------------------------------------------------------------------------------------------


@pytest.fixture
async def elsewhere() -> AsyncIterator[Peer]:
    """Another host that answers everything: it must never be reached through a redirect."""
    async with serve(empty_list) as peer:
        yield peer


def redirecting(status: int, target: Peer) -> Handler:
    async def handle(request: web.Request) -> web.StreamResponse:
        return web.Response(status=status, headers={"Location": target.url + request.path})

    return handle


@pytest.mark.parametrize("status", [301, 302, 303, 307, 308])
async def test_chatwoot_redirects_to_a_live_host_are_not_followed(elsewhere: Peer, status: int) -> None:
    async with serve(redirecting(status, elsewhere)) as origin, ChatwootClient(origin.url, USER, {1: BOT}) as client:
        with pytest.raises(ChatwootError) as caught:
            await client.list_agents(1)
        assert (caught.value.status, client.requests, len(origin.hits), elsewhere.hits) == (status, 1, 1, [])


@pytest.mark.parametrize("status", [302, 307, 308])
async def test_system_one_redirects_are_not_followed(elsewhere: Peer, status: int) -> None:
    async with serve(redirecting(status, elsewhere)) as origin, SystemOneClient(origin.url, "jev-key") as jev:
        with pytest.raises(JevHTTPError, match=f"HTTP {status}$"):
            await jev.post({"question": 1})
        assert (jev.requests, len(origin.hits), elsewhere.hits) == (1, 1, [])


async def test_the_executors_own_client_does_not_follow_redirects(elsewhere: Peer) -> None:
    async with (
        serve(redirecting(302, elsewhere)) as origin,
        EffectExecutor(settings(origin.url), keyring=memory_keyring()) as executor,
    ):
        outcome = await executor.execute(list_agents())
    assert outcome.error is not None and (outcome.error.kind, outcome.error.status) == ("failed", 302)
    assert (outcome.requests, elsewhere.hits) == (1, [])


# --- timeouts -------------------------------------------------------------------------------------------


async def trickle(request: web.Request) -> web.StreamResponse:
    """Headers at once, then one byte of the body every 50 ms: no single read ever waits long."""
    response = web.StreamResponse(headers={"Content-Type": "application/json", "Content-Length": "600"})
    await response.prepare(request)
    for _ in range(600):
        await response.write(b" ")
        await asyncio.sleep(0.05)
    return response


async def test_the_chatwoot_limit_covers_the_whole_body() -> None:
    async with serve(trickle) as peer, ChatwootClient(peer.url, USER, {}, timeout_s=0.5) as client:
        with pytest.raises(ChatwootTimeout):
            await client.list_agents(1)


async def test_the_system_one_limit_covers_the_whole_body() -> None:
    async with serve(trickle) as peer, SystemOneClient(peer.url, "k", timeout_s=0.5) as jev:
        with pytest.raises(JevTimeout):
            await jev.post({})


@pytest.mark.parametrize("where", ["before the headers", "inside the body"])
async def test_the_transports_read_timeout_applies(where: str) -> None:
    """The client's own read timeout, without the per-call limit around it."""
    released = asyncio.Event()

    async def stall(request: web.Request) -> web.StreamResponse:
        if where == "before the headers":
            await released.wait()
        response = web.StreamResponse(headers={"Content-Length": "10"})
        await response.prepare(request)
        await response.write(b"[")
        await released.wait()
        return response

    async with serve(stall) as peer, ChatwootClient(peer.url, USER, {}) as client:
        try:
            with pytest.raises(httpx.ReadTimeout):
                await client._http.get(peer.url + AGENTS, timeout=httpx.Timeout(60, read=0.3))
        finally:
            released.set()


# --- connections ----------------------------------------------------------------------------------------


class Barrier:
    """Holds every request until `size` are in flight at once; records the most ever in flight."""

    def __init__(self, size: int) -> None:
        self.size = size
        self.in_flight = 0
        self.most = 0
        self.full = asyncio.Event()

    async def handle(self, request: web.Request) -> web.StreamResponse:
        self.in_flight += 1
        self.most = max(self.most, self.in_flight)
        if self.in_flight >= self.size:
            self.full.set()
        try:
            await asyncio.wait_for(self.full.wait(), 30)
        finally:
            self.in_flight -= 1
        return web.json_response([])


async def _through_client(url: str, n: int) -> None:
    async with ChatwootClient(url, USER, {1: BOT}) as client:
        await asyncio.gather(*(client.metered().list_agents(1) for _ in range(n)))


async def _through_executor(url: str, n: int) -> None:
    async with EffectExecutor(settings(url), keyring=memory_keyring()) as executor:
        outcomes = await asyncio.gather(*(executor.execute(list_agents(i)) for i in range(n)))
    assert [o.error for o in outcomes] == [None] * n


@pytest.mark.parametrize("send", [_through_client, _through_executor], ids=["client", "executor"])
async def test_at_most_100_connections_are_open(send: Callable[[str, int], Awaitable[None]]) -> None:
    barrier = Barrier(MAX_CONNECTIONS)
    async with serve(barrier.handle) as peer:
        await send(peer.url, MAX_CONNECTIONS + 20)
    assert barrier.most == MAX_CONNECTIONS
    assert len({hit["port"] for hit in peer.hits}) >= MAX_CONNECTIONS


async def test_at_most_20_idle_connections_are_kept_for_the_next_requests() -> None:
    barriers = [Barrier(30), Barrier(30)]

    async def handle(request: web.Request) -> web.StreamResponse:
        return await barriers[0].handle(request)

    async with serve(handle) as peer, ChatwootClient(peer.url, USER, {}) as client:
        await asyncio.gather(*(client.list_agents(1) for _ in range(30)))
        first = {hit["port"] for hit in peer.hits}
        barriers.pop(0)
        await asyncio.gather(*(client.list_agents(1) for _ in range(30)))
        second = {hit["port"] for hit in peer.hits[30:]}
    assert (len(first), len(second), len(first & second)) == (30, 30, MAX_IDLE)


async def test_idle_connections_are_reused_then_expire_after_5_s() -> None:
    async with serve(empty_list) as peer, ChatwootClient(peer.url, USER, {}) as client:
        await client.list_agents(1)
        await client.list_agents(1)
        await asyncio.sleep(5.5)  # past the keep-alive expiry (5 s), which is what is tested
        await client.list_agents(1)
    first, second, third = (hit["port"] for hit in peer.hits)
    assert first == second != third


@pytest.fixture
async def sandbox() -> AsyncIterator[Sandbox]:
    async with run_sandbox(scenario=copy.deepcopy(SAMPLE)) as running:
        yield running


async def test_a_read_dropped_on_a_reused_connection_is_not_sent_again(sandbox: Sandbox) -> None:
    conversation = sandbox.create_conversation(1, 7)
    async with ChatwootClient(sandbox.url, USER, {1: BOT}) as client:
        await client.get_conversation(1, conversation.id)  # leaves an idle connection in the pool
        sandbox.add_fault(op="get_conversation", mode="apply_then_drop")
        with pytest.raises(ChatwootNetworkError) as caught:
            await client.get_conversation(1, conversation.id)
        assert not isinstance(caught.value, ChatwootTimeout)
        assert client.requests == 2
    assert [c["op"] for c in sandbox.calls] == ["get_conversation", "get_conversation"]


# --- broken answers -------------------------------------------------------------------------------------


@contextlib.asynccontextmanager
async def raw_server(answer: bytes) -> AsyncIterator[str]:
    """A TCP server that reads the request head and answers `answer`, then closes: not HTTP at all."""

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(ConnectionError):
            await reader.readuntil(b"\r\n\r\n")
            writer.write(answer)
            await writer.drain()
        writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    try:
        yield f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"
    finally:
        server.close()
        await server.wait_closed()


@pytest.mark.parametrize(
    "answer",
    [b"NOT HTTP AT ALL\r\n\r\n", b"", b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n[1, 2"],
    ids=["garbage", "closed", "short-body"],
)
async def test_a_broken_answer_is_a_network_error_not_a_timeout(answer: bytes) -> None:
    async with raw_server(answer) as url:
        async with ChatwootClient(url, USER, {}) as client:
            with pytest.raises(ChatwootNetworkError) as caught:
                await client.list_agents(1)
            assert not isinstance(caught.value, ChatwootTimeout)
        async with SystemOneClient(url, "k") as jev:
            with pytest.raises(JevNetworkError) as jev_caught:
                await jev.post({})
            assert not isinstance(jev_caught.value, JevTimeout)


# --- what the other side sees ---------------------------------------------------------------------------


async def test_cookies_are_never_kept_nor_sent() -> None:
    """The clients authenticate by token, one client for every account: a cookie one account's answer sets must
    never ride on another account's request (nor cost a cookie-jar pass per response)."""

    async def set_cookie(request: web.Request) -> web.StreamResponse:
        response = web.json_response([])
        response.set_cookie("session", "abc")
        return response

    async with serve(set_cookie) as peer:
        by_name = peer.url.replace("127.0.0.1", "localhost")  # cookie jars may refuse cookies of IP addresses
        async with ChatwootClient(by_name, USER, {}) as client:
            await client.list_agents(1)
            await client.list_agents(1)
    assert [hit["headers"].get("Cookie") for hit in peer.hits] == [None, None]


async def test_the_request_headers_are_unchanged() -> None:
    async with serve(empty_list) as peer:
        async with ChatwootClient(peer.url, USER, {1: BOT}) as client:
            await client.list_agents(1)
            await client.set_labels(1, 9, ["a"])
        async with SystemOneClient(peer.url + "/v1/systemone", "jev-key") as jev:
            await jev.post({"q": 1})
    names = [sorted(name.lower() for name in hit["headers"]) for hit in peer.hits]
    # the token as `Api-Access-Token`: Chatwoot reads it as well as `api_access_token`, and a default nginx in
    # front of Chatwoot drops header names with underscores (chatwoot.md §8)
    assert names == [
        ["accept", "accept-encoding", "api-access-token", "connection", "host", "user-agent"],
        ["accept", "accept-encoding", "api-access-token", "connection", "content-length", "content-type", "host",
         "user-agent"],
        ["accept", "accept-encoding", "authorization", "connection", "content-length", "content-type", "host",
         "user-agent"],
    ]  # fmt: skip
    get, post, jev_post = (hit["headers"] for hit in peer.hits)
    assert (get["Accept"], get["Connection"], get["User-Agent"]) == (
        "application/json",
        "keep-alive",
        f"python-httpx/{httpx.__version__}",
    )
    assert (post["Content-Type"], post["Content-Length"]) == ("application/json", str(len(b'{"labels":["a"]}')))
    assert jev_post["Accept"] == "*/*" and jev_post["Content-Type"] == "application/json"
