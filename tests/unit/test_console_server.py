"""The console's web app in-process: pages, live JSON, the token, and the command's refusal to start unguarded."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from aiohttp import ClientSession, CookieJar
from aiohttp.test_utils import TestServer

from handlers.console.render import render_conversation
from handlers.console.server import SESSION_COOKIE, create_app
from handlers.console.status import ConsoleStatus, TailStatus, WorkerStuck
from projections.console.model import ConsoleModel, ConversationTimeline
from streams.console_cmd import is_loopback, resolve_token
from tests.unit.test_fold_driver import T0, Driver, decision, incoming

ROOT = Path(__file__).resolve().parents[2]
TOKEN = "a-console-token-of-some-length"


class StubSources:
    def __init__(self) -> None:
        self.status = ConsoleStatus(
            tail=TailStatus(topic="t.conversations", records=12, behind=0, caught_up=True),
            group="t",
            lag={"conversations": 0, "effects": 2},
            workers=[
                WorkerStuck(
                    "http://127.0.0.1:1",
                    stuck={"1:9": "foreign_bot"},
                    throttle={"per_minute": 1200, "throttled": 3, "waited_s": 42.4, "paused_for_s": 0.0},
                )
            ],
        )

    async def refresh(self) -> ConsoleStatus:
        return self.status


def routed_model() -> ConsoleModel:
    driver = Driver()
    driver.chatwoot.messages = [incoming(1, "I was charged twice for my invoice")]
    driver.chatwoot.decision = decision("billing", 0.92, topic="invoices", topic_confidence=0.8)
    driver.webhook()
    model = ConsoleModel(driver.config, retry_base_ms=driver.retry_base_ms)
    for offset, event in driver.log:
        model.feed(event.model_dump_json().encode(), offset)
    return model


async def _serve(token: str | None) -> AsyncIterator[str]:
    server = TestServer(create_app(routed_model(), StubSources(), token=token, now_ms=lambda: T0 + 1000))
    await server.start_server()
    try:
        yield str(server.make_url("")).rstrip("/")
    finally:
        await server.close()


@pytest.fixture
async def open_console() -> AsyncIterator[str]:
    async for url in _serve(None):
        yield url


@pytest.fixture
async def guarded_console() -> AsyncIterator[str]:
    async for url in _serve(TOKEN):
        yield url


async def test_overview_conversation_and_live_json(open_console: str) -> None:
    async with ClientSession() as http:
        async with http.get(f"{open_console}/") as response:
            page = await response.text()
            assert response.status == 200
            assert "script-src 'self'" in response.headers["Content-Security-Policy"]
        assert 'data-count="assigned"><div class="n">1<' in page
        assert "1:9" in page and "another account" in page  # the worker's stuck list, with its cause
        # what Chatwoot's rate limit cost the worker, in one line (issue 30)
        assert "3 requests refused (429), requests waited 42 s in all" in page and "budget 1200 a minute" in page
        async with http.get(f"{open_console}/api/overview") as response:
            data = await response.json()
        assert data["data"]["endings"] == {"assigned": 1} and set(data["fragments"]) >= {"tiles", "recent", "stuck"}
        async with http.get(f"{open_console}/conversation?q=1/2", allow_redirects=False) as response:
            assert response.status == 303 and response.headers["Location"] == "/conversations/1:2"
        async with http.get(f"{open_console}/conversations/1:2") as response:
            page = await response.text()
        assert page.count('<g class="call ') >= 5 and 'class="card decision-card"' in page
        assert "charged twice" in page  # the redacted input Jev saw
        async with http.get(f"{open_console}/api/conversations/1:2") as response:
            assert (await response.json())["calls"] >= 5
        async with http.get(f"{open_console}/conversations/7:7") as response:
            assert response.status == 404 and "No events" in await response.text()
        async with http.get(f"{open_console}/conversation?q=nonsense") as response:
            assert response.status == 400
        async with http.get(f"{open_console}/static/console.js") as response:
            assert response.status == 200 and "fetch(" in await response.text()
        async with http.get(f"{open_console}/static/../server.py") as response:
            assert response.status == 404


async def test_the_token_is_required_by_every_page_and_the_api(guarded_console: str) -> None:
    async with ClientSession() as http:
        for path in ("/", "/api/overview", "/conversations/1:2", "/static/console.js"):
            async with http.get(f"{guarded_console}{path}") as response:
                assert response.status == 401, path
                assert response.headers["WWW-Authenticate"].startswith("Bearer")
        async with http.get(f"{guarded_console}/", headers={"Authorization": "Bearer wrong"}) as response:
            assert response.status == 401
        async with http.get(f"{guarded_console}/", headers={"Authorization": f"Bearer {TOKEN}"}) as response:
            assert response.status == 200
        async with http.post(f"{guarded_console}/login", data={"token": "wrong"}) as response:
            assert response.status == 401
    async with ClientSession(cookie_jar=CookieJar(unsafe=True)) as browser:  # IP hosts, as browsers allow
        async with browser.post(f"{guarded_console}/login", data={"token": TOKEN}, allow_redirects=False) as response:
            assert response.status == 303
            cookie = response.cookies[SESSION_COOKIE]
            assert cookie.value != TOKEN and cookie["httponly"]
        async with browser.get(f"{guarded_console}/api/overview") as response:
            assert response.status == 200


def test_the_standalone_page_needs_no_server() -> None:
    model = routed_model()
    page = render_conversation("1:2", model.timeline("1:2"), standalone=True)
    assert "<script" not in page and "/static/" not in page and 'href="/' not in page and "http" not in page
    assert page.count('<g class="call ') == len(model.timelines["1:2"].calls)


def test_tokens_off_loopback() -> None:
    assert is_loopback("127.0.0.1") and is_loopback("localhost") and is_loopback("::1") and is_loopback("127.5.0.1")
    assert not is_loopback("0.0.0.0") and not is_loopback("console.example.org")
    assert resolve_token("127.0.0.1", None, {}) is None
    assert resolve_token("0.0.0.0", "CONSOLE_TOKEN", {"CONSOLE_TOKEN": TOKEN}) == TOKEN
    for host, name, env in (("0.0.0.0", None, {}), ("0.0.0.0", "T", {}), ("0.0.0.0", "T", {"T": "short"})):
        with pytest.raises(ValueError):
            resolve_token(host, name, env)


def test_the_command_refuses_to_bind_beyond_loopback_without_a_token() -> None:
    env = {"PATH": "/usr/bin:/bin", "CONSOLE_TOKEN": ""}
    for extra in ([], ["--token-env", "CONSOLE_TOKEN"]):
        result = subprocess.run(
            [sys.executable, "-m", "streams.cli", "console", "--host", "0.0.0.0", "--port", "0", *extra],
            capture_output=True,
            text=True,
            cwd=ROOT,
            env=env,
            timeout=60,
            check=False,
        )
        assert result.returncode == 2, result.stderr
        assert len(result.stderr.strip().splitlines()) == 1 and "token" in result.stderr


async def test_the_api_answers_at_once_while_the_console_catches_up(monkeypatch: pytest.MonkeyPatch) -> None:
    """Nothing the API answers waits for the log: while the console catches up it says so with its progress, and a
    timeline still being read is answered 202 "reading" (the page's poll gets it once it is read)."""
    import handlers.console.server

    monkeypatch.setattr(handlers.console.server, "API_WAIT_S", 0.05)
    model = routed_model()
    read = asyncio.Event()
    at_hand = model.timeline

    async def reading(key: str) -> ConversationTimeline | None:  # a long history being read from the log
        await read.wait()
        return at_hand(key)

    monkeypatch.setattr(model, "timeline", reading)
    sources = StubSources()
    sources.status.tail = TailStatus(topic="t.conversations", records=40, behind=960, step="reading the log")
    server = TestServer(create_app(model, sources, now_ms=lambda: T0 + 1000))
    await server.start_server()
    url = str(server.make_url("")).rstrip("/")
    try:
        async with ClientSession() as http:
            async with http.get(f"{url}/api/overview") as response:
                overview = await response.json()
            assert response.status == 200 and overview["catching_up"] is True
            assert overview["progress"] == {
                "catching_up": True,
                "step": "reading the log",
                "records": 40,
                "behind": 960,
                "error": None,
            }
            assert overview["fragments"]["live"] == "catching up (reading the log) … 40 records, 960 to go"
            async with http.get(f"{url}/api/conversations/1:2") as response:
                answer = await response.json()
            assert response.status == 202 and answer["reading"] is True and answer["catching_up"] is True
            assert answer["fragments"] == {"live": "reading 1:2's records from the log …"}
            read.set()
            async with http.get(f"{url}/api/conversations/1:2") as response:
                answer = await response.json()
            assert response.status == 200 and answer["reading"] is False and answer["calls"] >= 5
    finally:
        await server.close()
