"""`chatwoot-router console` in a real headless browser (Playwright driving Debian's chromium) against the live
stack: the overview counts what the log says (and follows it without a reload), a conversation's page draws every
call the worker issued, its retry and its System One decision, `audit --html` writes the same timeline, and off
loopback the console wants its bearer token.

Screenshots of both pages are saved under the test's tmp dir; with CONSOLE_SCREENSHOTS_DIR set they are also
written there (that is how docs/console-*.png were made).
"""

from __future__ import annotations

import asyncio
import os
import shutil
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from handlers.demo.run import main_outcome
from handlers.kafka.config_store import read_book
from projections.fold import parts_of
from projections.logs.audit import LogReplay
from schemas.codec import decode_conversation_event
from schemas.config import load_config_file
from schemas.records import EffectOutcome
from streams.kafka.local import free_port
from tests.support.kafka import read_all
from tests.support.processes import Process
from tests.support.stack import API_KEY, BILLING, BOT_SECRETS, BOT_TOKENS, USER_TOKEN, Stack
from tests.support.waiting import wait_until

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
pytestmark = [
    pytest.mark.browser,
    pytest.mark.skipif(CHROMIUM is None, reason="no chromium installed (apt-get install chromium)"),
]

BILLING_QUESTION = "I was charged twice on my invoice, please refund the payment"
TOKEN = "e2e-console-token-0123456789"
SECRETS = (USER_TOKEN, API_KEY, *BOT_TOKENS.values(), *BOT_SECRETS.values(), TOKEN)


def _console(stack: Stack, *args: str, env: dict[str, str] | None = None) -> tuple[Process, str]:
    port = free_port()
    name = f"console-{port}"
    process = Process(name, ["console", "--port", str(port), *args], env or stack.env, stack.tmp)
    process.start()
    url = f"http://127.0.0.1:{port}"

    def ready() -> bool:
        assert process.alive(), f"console exited:\n{process.log_tail()}"
        return "ready url=" in process.log_path.read_text(errors="replace")

    wait_until("the console to listen", ready, 60, every_s=0.2)
    return process, url


@pytest.fixture
def console(e2e: Stack) -> Iterator[str]:
    process, url = _console(e2e, "--worker-url", f"http://127.0.0.1:{e2e.web_port}")
    try:
        yield url
    finally:
        process.stop()


async def expected_tiles(stack: Stack) -> dict[str, int]:
    """The overview's counts, from an independent replay of the log (the audit's, not the console's)."""
    bootstrap, app_id = stack.env["KAFKA_BOOTSTRAP_SERVERS"], stack.env["ROUTER_APP_ID"]
    book = await read_book(bootstrap, app_id)
    replay = LogReplay(book=book) if len(book) else LogReplay(load_config_file(stack.config_path))
    for record in await read_all(bootstrap, f"{app_id}.conversations"):
        replay.feed(record.value, record.offset, record.partition)
    endings: Counter[str] = Counter()
    for trail in replay.trails.values():
        main = main_outcome(trail.outcomes)
        if main is not None:
            endings[main.result] += 1
    return {
        "conversations": len(replay.trails),
        "assigned": endings["assigned"],
        "ended": endings["ended"],
        "handed_off": endings["handed_off"],
    }


async def calls_for(stack: Stack, key: str) -> list[EffectOutcome]:
    """Every call made for the conversation, from the log: each has its outcome (a chained read has no command
    record on the effects topic; its outcome is part of a `ChainedOutcomes` event)."""
    records = await read_all(stack.env["KAFKA_BOOTSTRAP_SERVERS"], f"{stack.env['ROUTER_APP_ID']}.conversations")
    mine = [r.value for r in records if r.key == key.encode() and b"_outcome" in r.value]
    events = [decode_conversation_event(value) for value in mine]
    return [part for event in events for part in parts_of(event) if isinstance(part, EffectOutcome)]


async def _tiles(page: Any) -> dict[str, int]:
    counts: dict[str, int] = await page.evaluate(
        """() => Object.fromEntries([...document.querySelectorAll('[data-count]')]
              .map(t => [t.dataset.count, parseInt(t.querySelector('.n').textContent, 10)]))"""
    )
    return counts


def _save(shot: Path) -> None:
    target = os.environ.get("CONSOLE_SCREENSHOTS_DIR")
    if target:
        Path(target).mkdir(parents=True, exist_ok=True)
        shutil.copy(shot, Path(target) / shot.name)


def _play(e2e: Stack) -> dict[str, int]:
    """A billing question from a named contact, spam, and a billing question whose first turn read fails."""
    billing = e2e.new_conversation(contact_name="Ada Lovelace", contact_email="ada@example.org")
    e2e.customer_says(1, billing, BILLING_QUESTION)
    spam = e2e.new_conversation()
    e2e.customer_says(1, spam, "Casino spam advertising: unsolicited marketing offers for you")
    retried = e2e.new_conversation()
    e2e.fault(op="list_messages", mode="fail", status=503, times=1, account_id=1, conversation_id=retried)
    e2e.customer_says(1, retried, BILLING_QUESTION)
    for conversation in (billing, retried):
        e2e.wait_conversation(1, conversation, "assigned", lambda c: c["assignee_id"] == BILLING)
    e2e.wait_conversation(1, spam, "resolved", lambda c: c["status"] == "resolved")
    e2e.control("POST", "/settle", {"timeout_s": 10})
    return {"billing": billing, "spam": spam, "retried": retried}


def test_console_in_a_browser(e2e: Stack, console: str, tmp_path: Path) -> None:
    asyncio.run(_browse(e2e, console, tmp_path))


async def _browse(e2e: Stack, console: str, tmp_path: Path) -> None:
    from playwright.async_api import async_playwright

    async with async_playwright() as playwright:
        browser = await playwright.chromium.launch(executable_path=CHROMIUM, headless=True)
        try:
            context = await browser.new_context(viewport={"width": 1280, "height": 900})
            requested: list[str] = []
            context.on("request", lambda request: requested.append(request.url))
            page = await context.new_page()
            await page.goto(f"{console}/")
            await page.evaluate("window.__sameDocument = true")  # gone if the page ever reloads

            # conversations played while the page is open: the overview must follow without a reload
            played = await asyncio.to_thread(_play, e2e)
            retried, billing = played["retried"], played["billing"]
            # the log may still grow (sweeps, other tests' retries): compare with a fresh replay until they agree
            deadline = asyncio.get_running_loop().time() + 90  # catches a page that stopped following, not a slow one
            while True:
                want = await expected_tiles(e2e)
                tiles = await _tiles(page)
                if {k: tiles.get(k) for k in want} == want or asyncio.get_running_loop().time() > deadline:
                    break
                await asyncio.sleep(0.5)  # polling interval between comparisons, bounded by the deadline
            assert {k: tiles.get(k) for k in want} == want, tiles
            assert want["assigned"] >= 2 and want["ended"] >= 1
            assert await page.evaluate("window.__sameDocument") is True
            recent = await page.inner_text("#recent")
            assert f"1:{retried}" in recent and "assigned to user" in recent
            shot = tmp_path / "console-overview.png"
            await page.screenshot(path=str(shot), full_page=True)
            _save(shot)

            # the conversation page, reached through the search box
            await page.fill("input[name=q]", f"1:{retried}")
            await page.click("header button[type=submit]")
            await page.wait_for_url(f"**/conversations/1:{retried}")
            issued = await calls_for(e2e, f"1:{retried}")
            calls = page.locator("svg.timeline g.call")
            assert await calls.count() == len(issued) >= 8
            ops = [await calls.nth(i).get_attribute("data-op") for i in range(await calls.count())]
            assert Counter(ops) == Counter(c.op for c in issued)
            assert await page.locator('svg.timeline g.call[data-result="failed"][data-op="read_turn"]').count() == 1
            assert await page.locator("svg.timeline g.timer.backoff").count() >= 1
            assert await page.locator('svg.timeline g.call[data-target="System One"]').count() >= 1
            card = page.locator(".decision-card").first
            assert "billing" in await card.inner_text() and "charged twice" in await card.inner_text()
            assert await page.get_attribute("[data-ending]", "data-ending") == "assigned"
            shot = tmp_path / "console-conversation.png"
            await page.screenshot(path=str(shot), full_page=True)
            _save(shot)
            timeline_live = await page.inner_html("#timeline")

            # the page of the conversation with a contact shows no name and no address, and no page a secret
            await page.goto(f"{console}/conversations/1:{billing}")
            text = await page.content()
            assert "Lovelace" not in text and "ada@example.org" not in text and "example.org" in text
            for html in (text, await _html(page, f"{console}/")):
                assert not [s for s in SECRETS if s in html]
            elsewhere = [url for url in requested if not url.startswith(console)]
            assert elsewhere == []  # no CDN, no external asset

            # audit --html writes the same page as a standalone file
            out = tmp_path / "audit.html"
            result = await asyncio.to_thread(e2e.run_cli, "audit", "--conversation", f"1:{retried}", "--html", str(out))
            assert result.returncode == 0, result.stderr
            await page.goto(out.as_uri())
            assert await page.locator("svg.timeline g.call").count() == len(issued)
            assert await page.inner_html("#timeline") == timeline_live
            await page.screenshot(path=str(tmp_path / "audit-standalone.png"), full_page=True)
        finally:
            await browser.close()


async def _html(page: Any, url: str) -> str:
    await page.goto(url)
    content: str = await page.content()
    return content


def test_console_bound_beyond_loopback_requires_the_token(e2e: Stack, tmp_path: Path) -> None:
    env = {**e2e.env, "CONSOLE_TOKEN": TOKEN}
    process, url = _console(e2e, "--host", "0.0.0.0", "--token-env", "CONSOLE_TOKEN", env=env)
    try:
        assert "requires a bearer token (from $CONSOLE_TOKEN)" in process.log_path.read_text()
        asyncio.run(_sign_in(url, tmp_path))
    finally:
        process.stop()


async def _sign_in(url: str, tmp_path: Path) -> None:
    from playwright.async_api import async_playwright

    async with async_playwright() as playwright:
        browser = await playwright.chromium.launch(executable_path=CHROMIUM, headless=True)
        try:
            page = await browser.new_page()
            response = await page.goto(f"{url}/")
            assert response is not None and response.status == 401
            assert "Bearer token required" in await page.inner_text("h1")
            await page.screenshot(path=str(tmp_path / "console-login.png"))
            await page.fill("input[name=token]", "not the token")
            async with page.expect_navigation():
                await page.click(".login button[type=submit]")
            assert "not the one" in await page.inner_text("main")
            await page.fill("input[name=token]", TOKEN)
            async with page.expect_navigation(url=f"{url}/"):
                await page.click(".login button[type=submit]")
            assert "Overview" in await page.inner_text("h1")
            api = await page.request.get(f"{url}/api/overview")  # the session cookie works for the API too
            assert api.status == 200

            with_header = await browser.new_context(extra_http_headers={"Authorization": f"Bearer {TOKEN}"})
            response = await (await with_header.new_page()).goto(f"{url}/")
            assert response is not None and response.status == 200
            bare = await browser.new_context()
            assert (await bare.request.get(f"{url}/api/overview")).status == 401
        finally:
            await browser.close()
