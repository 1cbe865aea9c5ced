"""The console's what-if page in a real headless browser (Playwright driving Debian's chromium) against the live
stack: a pasted candidate that snoozes spam instead of resolving it is run over the event log, the page shows the
totals and the changed turn with both sides, links it to the conversation's timeline, and an invalid candidate is
shown with its key path. The page says `--ask` is a command-line option and loads nothing from elsewhere.

The screenshot of the report is saved under the test's tmp dir; with CONSOLE_SCREENSHOTS_DIR set it is also
written there (that is how docs/console-whatif.png was made).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.test_console_e2e import CHROMIUM, _console, _save
from tests.support.stack import Stack, router_config
from tests.support.waiting import wait_until

pytestmark = [
    pytest.mark.browser,
    pytest.mark.skipif(CHROMIUM is None, reason="no chromium installed (apt-get install chromium)"),
]

SPAM = "Casino spam advertising: unsolicited marketing offers for you"


@pytest.fixture
def console(e2e: Stack) -> Iterator[str]:
    process, url = _console(e2e)
    try:
        yield url
    finally:
        process.stop()


def _candidate(stack: Stack, change: Any = None) -> str:
    config = router_config(stack.sandbox_url)
    if change is not None:
        change(config["routing"])
    return json.dumps(config, indent=2)


def _spam_recorded(e2e: Stack, tmp_path: Path) -> str:
    """A spam conversation routed live (resolved), its decided turn on the log (as `whatif` sees it)."""
    spam = e2e.new_conversation()
    e2e.customer_says(1, spam, SPAM)
    e2e.wait_conversation(1, spam, "resolved", lambda c: c["status"] == "resolved")
    key = f"1:{spam}"
    identity = tmp_path / "identity.json"
    identity.write_text(_candidate(e2e))
    out = tmp_path / "probe.json"

    def recorded() -> bool:
        result = e2e.run_cli("whatif", "--config", str(identity), "--conversation", key, "--json", str(out))
        return result.returncode == 0 and json.loads(out.read_text())["totals"]["compared"] == 1

    wait_until("the spam turn's ending to be on the log", recorded, deadline_s=90, every_s=1)
    return key


def test_the_whatif_page_in_a_browser(e2e: Stack, console: str, tmp_path: Path) -> None:
    key = _spam_recorded(e2e, tmp_path)
    asyncio.run(_browse(e2e, console, key, tmp_path))


async def _browse(e2e: Stack, console: str, key: str, tmp_path: Path) -> None:
    from playwright.async_api import async_playwright

    async with async_playwright() as playwright:
        browser = await playwright.chromium.launch(executable_path=CHROMIUM, headless=True)
        try:
            context = await browser.new_context(viewport={"width": 1280, "height": 900})
            requested: list[str] = []
            context.on("request", lambda request: requested.append(request.url))
            page = await context.new_page()

            # reached from the header; the box starts from the applied version, and --ask is not offered here
            await page.goto(f"{console}/")
            async with page.expect_navigation(url=f"{console}/whatif"):
                await page.click("header a[href='/whatif']")
            assert "(latest applied)" in await page.inner_text("select[name=version]")
            assert "routing:" in await page.input_value("textarea[name=candidate]")
            assert "command-line option only" in await page.inner_text("[data-ask-note]")

            # an invalid candidate: the form again, with the key path (as `config check` names it)
            invalid = _candidate(e2e, lambda r: r.update(minConfidence=2))
            await page.fill("textarea[name=candidate]", invalid)
            async with page.expect_navigation() as navigation:
                await page.click("button.primary")
            response = await navigation.value
            assert response is not None and response.status == 400
            error = await page.inner_text("[data-error]")
            assert error.startswith("Invalid CONFIG: routing.minConfidence: "), error
            assert "Traceback" not in await page.content()
            assert '"minConfidence": 2' in await page.input_value("textarea[name=candidate]")  # kept, to be fixed

            # a candidate that snoozes spam instead of resolving it, over every recorded turn
            snoozed = _candidate(e2e, lambda r: r["kinds"]["1"]["spam"].update(status="snoozed"))
            await page.fill("textarea[name=candidate]", snoozed)
            async with page.expect_navigation(url="**/whatif/w*"):
                await page.click("button.primary")
            await page.wait_for_selector('[data-whatif-state="done"]', timeout=120_000)  # swapped in, no reload
            totals = await page.inner_text(".whatif-report .totals")
            assert "turns compared" in totals and "changed" in totals
            changed = _count(totals, "changed")
            assert changed >= 1, totals
            row = page.locator(".whatif-report tr", has=page.locator(f'a[data-conversation="{key}"]'))
            assert await row.count() == 1
            cells = await row.inner_text()
            assert "ended resolved; labels spam" in cells and "ended snoozed; labels spam" in cells  # both sides
            report = await page.inner_text(".whatif-report")
            assert "routing.kinds.1.spam.status" in report and "nothing was sent to Chatwoot" in report
            assert "--ask" in await page.inner_text("#run")
            shot = tmp_path / "console-whatif.png"
            await page.screenshot(path=str(shot), full_page=True)
            _save(shot)

            # the changed turn's conversation: its timeline, as the console shows it
            async with page.expect_navigation(url=f"**/conversations/{key}"):
                await page.click(f'a[data-conversation="{key}"]')
            assert await page.get_attribute("[data-ending]", "data-ending") == "ended"
            assert await page.locator("svg.timeline g.call").count() >= 1

            elsewhere = [url for url in requested if not url.startswith(console)]
            assert elsewhere == []  # no CDN, no external asset
        finally:
            await browser.close()


def _count(totals: str, label: str) -> int:
    """The number next to `label` in the totals table's text (one `label<TAB>n` line per row)."""
    for line in totals.splitlines():
        name, _, number = line.strip().partition("\t")
        if name.strip() == label:
            return int(number)
    raise AssertionError(f"no {label!r} row in {totals!r}")
