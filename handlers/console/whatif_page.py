"""The console's what-if page (DESIGN §11): a candidate configuration tried on the recorded turns, in the browser.

Routes (added by `add_whatif_routes`):

- `GET /whatif` — the form: start from an applied configuration version (`?version=V`, the latest by default)
  or paste or upload a candidate (JSON or YAML), choose the window (`since`, `from`, `account`, `conversation`,
  as the CLI's options), and the last runs.
- `POST /whatif` — validates the candidate as `config check` does (an error names the key path, or the line and
  column, and the form is shown again with it: 400) and the window, then starts the run and redirects to it.
- `GET /whatif/{id}` — the run: queued or running (records read of the planned total), then the report
  `whatif --html` writes (projections/whatif/render.py), each changed turn linked to its conversation's page.
- `GET /api/whatif/{id}` — the run's live fragment for static/console.js; `GET /api/whatif/{id}/report` — the
  report as `whatif --json` writes it.

The run itself is handlers/console/whatif_runs.py. Nothing here calls Chatwoot or System One: `--ask`, which
spends System One calls, stays a command-line option, and the page says so. A POST from another site (a page
elsewhere making the browser submit) is refused.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import yaml
from aiohttp import web
from markupsafe import Markup

from handlers.console.render import ENV, LIVE_EVERY_MS, render_message
from handlers.console.whatif_runs import (
    FormError,
    RunsBusy,
    WhatifRequest,
    WhatifRun,
    WhatifRunner,
    parse_candidate,
)
from projections.whatif.render import render_html_body
from schemas.config import ConfigError, RouterConfig
from schemas.configs import ConfigBook, ConfigDocument

Page = Callable[[str, int], web.Response]
RUNNER: web.AppKey[WhatifRunner | None] = web.AppKey("whatif", object)  # type: ignore[arg-type]
MAX_CANDIDATE_BYTES = 1024 * 1024  # a pasted or uploaded candidate (a real configuration is a few kilobytes)
MAX_FORM_BYTES = 2 * MAX_CANDIDATE_BYTES + 64 * 1024  # the form's body: the box, a file and the window's fields
BOOK_TIMEOUT_S = 5.0


def config_text(config: RouterConfig) -> str:
    """A configuration as YAML the candidate box starts from (it reads back as the same configuration)."""
    document = config.model_dump(mode="json", by_alias=True, exclude_none=True)
    return yaml.safe_dump(document, sort_keys=False, allow_unicode=True, width=110)


def conversation_href(key: str) -> str:
    return f"/conversations/{key}"


def run_fragment(run: WhatifRun) -> str:
    """The run's state and, once done, its report (rendered once; the report does not change)."""
    if run.state == "done" and run.report is not None and run.report_html is None:
        run.report_html = render_html_body(run.report, conversation_href=conversation_href)
    module: Any = ENV.get_template("whatif_fragments.html").make_module({"standalone": False})
    return str(module.run(run, Markup(run.report_html or "")))


def _versions(book: ConfigBook) -> list[ConfigDocument]:
    latest = book.latest
    documents = book.documents()
    if latest is not None:  # the one in force first
        documents = [latest, *(d for d in documents if d.version != latest.version)]
    return documents


def add_whatif_routes(app: web.Application, runner: WhatifRunner | None, page: Page) -> None:
    app[RUNNER] = runner

    async def form_page(
        *,
        text: str | None = None,
        chosen: str | None = None,
        fields: dict[str, str] | None = None,
        error: str | None = None,
        status: int = 200,
    ) -> web.Response:
        versions: list[ConfigDocument] = []
        book_error = None
        if runner is not None:
            try:
                async with asyncio.timeout(BOOK_TIMEOUT_S):
                    versions = _versions(await runner.book())
            except Exception as exc:  # Kafka away: the form still takes a pasted candidate
                book_error = f"the applied versions cannot be read now ({type(exc).__name__})"
        if text is None:
            start = next((d for d in versions if d.version == chosen), versions[0] if versions else None)
            chosen = start.version if start is not None else None
            text = config_text(start.config) if start is not None else ""
        if text == "" and runner is not None and runner.config is not None and not versions:
            text = config_text(runner.config)
        html = ENV.get_template("whatif.html").render(
            standalone=False,
            available=runner is not None,
            versions=versions,
            chosen=chosen,
            book_error=book_error,
            text=text,
            fields=fields or {},
            error=error,
            runs=list(reversed(runner.runs.values())) if runner is not None else [],
            max_kib=MAX_CANDIDATE_BYTES // 1024,
        )
        return page(html, status)

    async def show_form(request: web.Request) -> web.Response:
        return await form_page(chosen=request.query.get("version") or None)

    async def submit(request: web.Request) -> web.Response:
        if not _same_origin(request):
            return page(render_message("Refused", "A what-if is started only from this console's own page."), 403)
        if request.content_length is not None and request.content_length > MAX_FORM_BYTES:
            return await form_page(text="", error=f"The form is larger than {MAX_FORM_BYTES // 1024} KiB.", status=413)
        try:
            form = await request.post()
        except web.HTTPRequestEntityTooLarge:
            return await form_page(text="", error="The form is too large.", status=413)
        text = str(form.get("candidate", ""))
        fields = {name: str(form.get(name, "")) for name in ("since", "from", "account", "conversation")}
        upload = form.get("file")
        data: str | bytes = text
        name = "candidate"
        if isinstance(upload, web.FileField) and upload.filename:
            data = upload.file.read(MAX_CANDIDATE_BYTES + 1)
            name = upload.filename
            if isinstance(data, bytes):
                text = data.decode("utf-8", errors="replace")
        if runner is None:
            return await form_page(text=text, fields=fields, error="This console has no event log to read.", status=503)
        try:
            if len(data) > MAX_CANDIDATE_BYTES:
                raise ConfigError("CONFIG", name, f"larger than {MAX_CANDIDATE_BYTES // 1024} KiB, this page's limit")
            candidate = parse_candidate(data, name)
            wanted = WhatifRequest.of(
                candidate, fields["since"], fields["from"], fields["account"], fields["conversation"]
            )
            run = runner.submit(wanted)
        except (ConfigError, FormError, RunsBusy) as exc:
            return await form_page(text=text, fields=fields, error=str(exc), status=400)
        raise web.HTTPSeeOther(f"/whatif/{run.id}")

    def found(request: web.Request) -> WhatifRun | None:
        return runner.get(request.match_info["run"]) if runner is not None else None

    async def show_run(request: web.Request) -> web.Response:
        run = found(request)
        if run is None:
            return page(render_message("No such what-if", "It is not one of the last runs this console keeps."), 404)
        context: dict[str, Any] = {"standalone": False, "r": run, "fragment": Markup(run_fragment(run))}
        if not run.finished:
            context.update(live_url=f"/api/whatif/{run.id}", live_every_ms=LIVE_EVERY_MS // 2)
        return page(ENV.get_template("whatif_run.html").render(context), 200)

    async def run_api(request: web.Request) -> web.Response:
        run = found(request)
        if run is None:
            return web.json_response({"error": "no such what-if"}, status=404)
        return web.json_response(
            {
                "version": [run.state, run.progress.done],
                "state": run.state,
                "final": run.finished,
                "fragments": {"run": run_fragment(run)},
            }
        )

    async def report_api(request: web.Request) -> web.Response:
        run = found(request)
        if run is None or run.report is None:
            return web.json_response({"error": "no report (yet)"}, status=404)
        return web.json_response(run.report.as_json())

    app.router.add_get("/whatif", show_form)
    app.router.add_post("/whatif", submit)
    app.router.add_get("/whatif/{run}", show_run)
    app.router.add_get("/api/whatif/{run}", run_api)
    app.router.add_get("/api/whatif/{run}/report", report_api)


def _same_origin(request: web.Request) -> bool:
    """Whether a POST comes from this console's own page. Browsers say where a request comes from in
    `Sec-Fetch-Site`; `Origin` is `null` here (the pages send no referrer), so it counts only when it names one."""
    site = request.headers.get("Sec-Fetch-Site")
    if site is not None and site not in ("same-origin", "none"):
        return False
    origin = request.headers.get("Origin")
    return origin is None or origin == "null" or origin == f"{request.scheme}://{request.host}"
