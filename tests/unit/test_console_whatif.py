"""The console's what-if page in-process: the form, a pasted candidate's errors with their key path, a run that is
running while the other pages answer, its report linked to the conversations' pages, and the refusals."""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import AsyncIterator
from typing import Any

import pytest
from aiohttp import ClientSession
from aiohttp.test_utils import TestServer

from handlers.console.server import create_app
from handlers.console.whatif_page import config_text
from handlers.console.whatif_runs import (
    KEPT,
    WAITING,
    FormError,
    RunsBusy,
    WhatifRequest,
    WhatifRun,
    WhatifRunner,
    parse_candidate,
)
from projections.whatif.report import Report
from schemas.config import ConfigError, parse_config
from schemas.configs import ConfigBook, ConfigDocument, FoldSettings
from tests.unit.test_console_server import StubSources, routed_model
from tests.unit.test_fold_driver import T0
from tests.unit.test_whatif import _mixed

CONFIG = {
    "chatwoot": {"baseUrl": "http://127.0.0.1:3000"},
    "routing": {
        "endpoint": "https://systemone.example/v1",
        "botIds": {"1": 5},
        "accounts": {"1": {"billing": {"assignee": 7, "covers": "Invoices and refunds."}}},
        "kinds": {"1": {"spam": {"covers": "Spam.", "status": "resolved"}}},
    },
}


class FakeRunner(WhatifRunner):
    """A runner whose what-if waits for `release` and returns a fixed report; the applied versions are given."""

    def __init__(self, book: ConfigBook, report: Report) -> None:
        super().__init__("127.0.0.1:1", "t", execute=self._execute)
        self._book, self._report = book, report
        self.release = threading.Event()
        self.seen: list[WhatifRun] = []

    async def book(self) -> ConfigBook:
        return self._book

    def _execute(self, run: WhatifRun) -> Report:
        self.seen.append(run)
        run.progress.total = 200
        run.progress(0, 50)
        if not self.release.wait(30):
            raise TimeoutError("the test never released the run")
        return self._report


@pytest.fixture
def runner() -> FakeRunner:
    live = ConfigDocument.of(parse_config(CONFIG), FoldSettings(retry_base_ms=5000), applied_at_ms=T0)
    return FakeRunner(ConfigBook([live]), _mixed()[0])


@pytest.fixture
async def console(runner: FakeRunner) -> AsyncIterator[str]:
    app = create_app(routed_model(), StubSources(), now_ms=lambda: T0 + 1000, whatif=runner)
    server = TestServer(app)
    await server.start_server()
    try:
        yield str(server.make_url("")).rstrip("/")
    finally:
        runner.release.set()
        await server.close()


async def _wait_state(http: ClientSession, url: str, state: str) -> dict[str, Any]:
    async with asyncio.timeout(10):
        while True:
            async with http.get(url) as response:
                data: dict[str, Any] = await response.json()
            if data["state"] == state:
                return data
            await asyncio.sleep(0.02)


async def test_the_form_starts_from_the_applied_version_and_says_ask_is_command_line_only(console: str) -> None:
    async with ClientSession() as http, http.get(f"{console}/whatif") as response:
        page = await response.text()
        assert response.status == 200
    assert 'href="/whatif"' in page  # in the header, next to the overview
    assert "(latest applied)" in page and "Invoices and refunds." in page  # the box holds the version in force
    assert "--ask" in page and "command-line option only" in page


async def test_a_run_is_running_while_the_other_pages_answer_then_shows_the_report(
    console: str, runner: FakeRunner
) -> None:
    candidate = json.dumps({**CONFIG, "routing": {**CONFIG["routing"], "minConfidence": 0.8}})  # type: ignore[dict-item]
    async with ClientSession() as http:
        form = {"candidate": candidate, "since": "7d", "account": "1", "conversation": "", "from": ""}
        async with http.post(f"{console}/whatif", data=form, allow_redirects=False) as response:
            assert response.status == 303
            location = response.headers["Location"]
        run_id = location.rsplit("/", 1)[1]
        running = await _wait_state(http, f"{console}/api/whatif/{run_id}", "running")
        assert running["final"] is False and "50 of 200 records read" in running["fragments"]["run"]
        async with http.get(f"{console}/") as response:  # the overview answers while the what-if runs
            assert response.status == 200
        async with http.get(f"{console}{location}") as response:
            page = await response.text()
        assert f'data-live="/api/whatif/{run_id}"' in page and 'data-whatif-state="running"' in page
        assert "--since 7d --account 1" in page

        runner.release.set()
        done = await _wait_state(http, f"{console}/api/whatif/{run_id}", "done")
        assert done["final"] is True
        async with http.get(f"{console}{location}") as response:
            page = await response.text()
        assert "data-live" not in page  # a finished run is not polled
        assert "turns compared" in page and "Changed turns (2)" in page
        assert '<a href="/conversations/1:10" data-conversation="1:10">1:10</a>' in page
        assert "ended resolved; labels spam" in page  # the live side, next to the candidate's
        assert "routing.kinds.1.spam.status" in page
        async with http.get(f"{console}/api/whatif/{run_id}/report") as response:
            report = await response.json()
        assert report["totals"]["compared"] == 2
        async with http.get(f"{console}/whatif") as response:
            assert f'href="/whatif/{run_id}"' in await response.text()  # among the last runs
    (seen,) = runner.seen
    assert seen.request.selection(T0).account_id == 1 and seen.request.selection(T0).from_ms == T0 - 7 * 86_400_000


@pytest.mark.parametrize(
    ("candidate", "shown"),
    [
        ({**CONFIG, "routing": {**CONFIG["routing"], "minConfidence": 2}}, "Invalid CONFIG: routing.minConfidence: "),
        ("chatwoot: {baseUrl: [x\nrouting: 1\n", "Invalid CONFIG: candidate: line "),
        ({**CONFIG, "routing": {**CONFIG["routing"], "botIds": {"2": 5}}}, "Invalid CONFIG: routing.botIds: "),
    ],
)
async def test_an_invalid_candidate_is_shown_with_its_key_path(console: str, candidate: Any, shown: str) -> None:
    text = candidate if isinstance(candidate, str) else json.dumps(candidate)
    async with ClientSession() as http, http.post(f"{console}/whatif", data={"candidate": text}) as response:
        page = await response.text()
        assert response.status == 400
    assert shown in page and "Traceback" not in page
    assert "minConfidence" not in shown or "2" in page  # the pasted text stays in the box to be fixed


async def test_a_bad_window_and_a_foreign_origin_are_refused(console: str) -> None:
    async with ClientSession() as http:
        form = {"candidate": json.dumps(CONFIG), "since": "7d", "from": "2025-01-01"}
        async with http.post(f"{console}/whatif", data=form) as response:
            assert response.status == 400 and "give one of them, not both" in await response.text()
        form = {"candidate": json.dumps(CONFIG), "conversation": "42"}
        async with http.post(f"{console}/whatif", data=form) as response:
            assert response.status == 400 and "conversation: " in await response.text()
        for headers in ({"Origin": "https://elsewhere.example"}, {"Sec-Fetch-Site": "cross-site", "Origin": "null"}):
            form = {"candidate": json.dumps(CONFIG)}
            async with http.post(f"{console}/whatif", data=form, headers=headers) as answer:
                assert answer.status == 403
        async with http.get(f"{console}/whatif/w999") as response:
            assert response.status == 404


def test_the_candidate_is_read_as_a_configuration_file_is() -> None:
    config = parse_config(CONFIG)
    assert parse_candidate(config_text(config)) == config  # the box's YAML reads back as the same configuration
    with pytest.raises(ConfigError, match=r"^Invalid CONFIG: router\.yaml: line 1, column 1: not UTF-8 text$"):
        parse_candidate(b"\xff\xfe", "router.yaml")
    with pytest.raises(FormError, match="since: "):
        WhatifRequest.of(config, "7 days", "", "", "")
    assert WhatifRequest.of(config, "", "2025-01-31T00:00:00Z", "", "1:42").command() == (
        "chatwoot-router whatif --config CANDIDATE --from 2025-01-31T00:00:00Z --conversation 1:42"
    )


async def test_one_run_at_a_time_a_few_wait_and_the_last_few_are_kept(runner: FakeRunner) -> None:
    request = WhatifRequest.of(parse_config(CONFIG), "", "", "", "")
    first = runner.submit(request)
    async with asyncio.timeout(10):
        while first.state != "running":
            await asyncio.sleep(0.01)
    waiting = [runner.submit(request) for _ in range(WAITING)]
    assert {r.state for r in waiting} == {"queued"}
    with pytest.raises(RunsBusy):
        runner.submit(request)
    runner.release.set()
    async with asyncio.timeout(10):
        while not all(r.finished for r in (first, *waiting)):
            await asyncio.sleep(0.01)
    assert {r.state for r in (first, *waiting)} == {"done"} and len(runner.seen) == 1 + WAITING
    for _ in range(KEPT):
        later = runner.submit(request)
        async with asyncio.timeout(10):
            while not later.finished:
                await asyncio.sleep(0.01)
    assert len(runner.runs) == KEPT and first.id not in runner.runs
