"""The console's web app (aiohttp): read-only pages over the read model, with optional bearer-token access.

Routes: `GET /` (overview), `GET /api/overview` (its live data and fragments), `GET /conversation?q=A:C` (the
search: redirects to the page), `GET /conversations/{A:C}`, `GET /api/conversations/{A:C}`, `GET /static/…`,
the what-if page's `GET|POST /whatif`, `GET /whatif/{id}` and its APIs (handlers/console/whatif_page.py), and,
with a token, `GET|POST /login`. Nothing here writes to Kafka or to Chatwoot.

With a token every route but `/login` needs `Authorization: Bearer <token>`, or the session cookie that `/login`
sets after the token was typed into its form (an HMAC of the token, not the token). Every answer carries a
Content-Security-Policy that allows only this origin's script, so the pages can load nothing from elsewhere.

The JSON APIs answer at once, whatever the length of the history and whether workers run: they say what the
console has folded so far and, until it has read the log to its end, that it is catching up (`catching_up`,
`progress`: what it is doing, records folded, records to go). A conversation's timeline that is still being read
from the log is answered with 202 and "reading" after `API_WAIT_S` (the page itself waits up to `PAGE_WAIT_S`);
the page's poll gets it when it is read.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import inspect
import time
from collections.abc import Awaitable, Callable
from dataclasses import asdict
from importlib import resources
from typing import Any, Protocol

from aiohttp import web

from handlers.console.live import LiveConsole
from handlers.console.render import (
    conversation_fragments,
    overview_fragments,
    reading_fragment,
    render_conversation,
    render_login,
    render_message,
    render_overview,
)
from handlers.console.status import ConsoleStatus
from handlers.console.whatif_page import MAX_FORM_BYTES, Page, add_whatif_routes
from handlers.console.whatif_runs import WhatifRunner
from projections.console.model import ConsoleModel, ConversationTimeline, Overview, parse_conversation_key

SESSION_COOKIE = "console_session"
CSP = (
    "default-src 'none'; script-src 'self'; connect-src 'self'; style-src 'unsafe-inline'; img-src 'self' data:; "
    "form-action 'self'; frame-ancestors 'none'; base-uri 'none'"
)
ReadModel = ConsoleModel | LiveConsole
API_WAIT_S = 0.5  # how long a JSON answer waits for a conversation's timeline to be read before it says "reading"
PAGE_WAIT_S = 30.0  # how long a conversation's page waits for it before it says the console is still reading
MODEL: web.AppKey[ReadModel] = web.AppKey("model", object)  # type: ignore[arg-type]
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


class StatusSource(Protocol):
    """Where the pages get what is not in the log (`handlers.console.sources.Sources`; a stub in tests)."""

    async def refresh(self) -> ConsoleStatus: ...


def wall_clock_ms() -> int:
    return time.time_ns() // 1_000_000


def session_value(token: str) -> str:
    """The cookie that stands for a signed-in browser: derived from the token, so the token itself is not stored."""
    return hmac.new(token.encode(), b"chatwoot-router console session", hashlib.sha256).hexdigest()


def create_app(
    model: ReadModel,
    sources: StatusSource,
    *,
    token: str | None = None,
    now_ms: Callable[[], int] = wall_clock_ms,
    whatif: WhatifRunner | None = None,
) -> web.Application:
    middlewares: list[Any] = [_headers]
    if token:
        middlewares.append(_bearer(token))
    app = web.Application(middlewares=middlewares, client_max_size=MAX_FORM_BYTES)
    app[MODEL] = model
    static = resources.files("handlers.console") / "static"

    def page(text: str, status: int = 200) -> web.Response:
        return web.Response(text=text, status=status, content_type="text/html", charset="utf-8")

    async def overview(request: web.Request) -> web.Response:
        status = await sources.refresh()
        return page(render_overview(model.overview(now_ms()), status))

    async def overview_api(request: web.Request) -> web.Response:
        status = await sources.refresh()
        data = model.overview(now_ms())
        return web.json_response(
            {
                "version": [model.version, status.tail.records, _status_stamp(status)],
                "catching_up": status.tail.catching_up,
                "progress": status.tail.progress(),
                "data": overview_data(data, status.lag),
                "fragments": overview_fragments(data, status),
            }
        )

    async def search(request: web.Request) -> web.Response:
        query = request.query.get("q", "")
        key = parse_conversation_key(query)
        if key is None:
            hint = f"Give account:conversation, e.g. 1:42 (not {query!r})."
            return page(render_message("Not a conversation", hint), 400)
        raise web.HTTPSeeOther(f"/conversations/{key}")

    async def conversation(request: web.Request) -> web.Response:
        key = parse_conversation_key(request.match_info["key"])
        if key is None:
            return page(render_message("Not a conversation", "Give account:conversation, e.g. 1:42."), 400)
        status = await sources.refresh()
        try:
            async with asyncio.timeout(PAGE_WAIT_S):
                timeline = await _timeline(model, key)
        except TimeoutError:  # its records are still being read (or the log is not there yet): say so
            return page(render_conversation(key, None, status=status, reading=True), 202)
        html = render_conversation(key, timeline, status=status)
        return page(html, 200 if timeline is not None else 404)

    async def conversation_api(request: web.Request) -> web.Response:
        key = parse_conversation_key(request.match_info["key"])
        if key is None:
            return web.json_response({"error": "not a conversation key"}, status=400)
        status = await sources.refresh()
        try:
            async with asyncio.timeout(API_WAIT_S):
                timeline = await _timeline(model, key)
        except TimeoutError:  # still being read from the log: say so now, the next poll has it
            return web.json_response(
                {
                    "version": [-1, status.tail.records, _status_stamp(status)],
                    "reading": True,
                    "catching_up": status.tail.catching_up,
                    "progress": status.tail.progress(),
                    "calls": 0,
                    "fragments": {"live": reading_fragment(key)},
                },
                status=202,
            )
        return web.json_response(
            {
                "version": [timeline.events if timeline else 0, status.tail.records, _status_stamp(status)],
                "reading": False,
                "catching_up": status.tail.catching_up,
                "progress": status.tail.progress(),
                "calls": len(timeline.calls) if timeline else 0,
                "fragments": conversation_fragments(key, timeline, status=status),
            },
            status=200 if timeline is not None else 404,
        )

    async def script(request: web.Request) -> web.Response:
        name = request.match_info["name"]
        if name != "console.js":
            raise web.HTTPNotFound()
        return web.Response(
            text=(static / name).read_text(encoding="utf-8"), content_type="application/javascript", charset="utf-8"
        )

    async def login_form(request: web.Request) -> web.Response:
        return page(render_login())

    async def login(request: web.Request) -> web.Response:
        form = await request.post()
        given = str(form.get("token", ""))
        if not token or not hmac.compare_digest(given.encode(), token.encode()):
            return page(render_login(failed=True), 401)
        response = web.HTTPSeeOther("/")
        response.set_cookie(SESSION_COOKIE, session_value(token), httponly=True, samesite="Strict", path="/")
        raise response

    app.router.add_get("/", overview)
    app.router.add_get("/api/overview", overview_api)
    app.router.add_get("/conversation", search)
    app.router.add_get("/conversations/{key}", conversation)
    app.router.add_get("/api/conversations/{key}", conversation_api)
    app.router.add_get("/static/{name}", script)
    if token:
        app.router.add_get("/login", login_form)
        app.router.add_post("/login", login)
    _add_whatif(app, model, whatif, page)
    return app


def _add_whatif(app: web.Application, model: ReadModel, runner: WhatifRunner | None, page: Page) -> None:
    """The what-if page (handlers/console/whatif_page.py): `runner`, or one over the live console's log."""
    if runner is None and isinstance(model, LiveConsole):
        runner = WhatifRunner(
            model.bootstrap, model.app_id, retry_base_ms=model.retry_base_ms, config=model.config, jobs=model.jobs
        )
    add_whatif_routes(app, runner, page)


async def _timeline(model: ReadModel, key: str) -> ConversationTimeline | None:
    """The model's timeline of `key`: at hand (`ConsoleModel`) or read from the log first (`LiveConsole`)."""
    found = model.timeline(key)
    return await found if inspect.isawaitable(found) else found


def overview_data(o: Overview, lag: dict[str, int] | None) -> dict[str, Any]:
    """The overview's numbers as JSON (the live page uses the fragments; scripts can use these)."""
    return {
        "now_ms": o.now_ms,
        "conversations": o.conversations,
        "records": o.records,
        "undecodable": o.undecodable,
        "endings": o.endings,
        "results": o.results,
        "hours": [{"start_ms": h.start_ms, "counts": h.counts} for h in o.hours if h.counts],
        "handoff_reasons": dict(o.handoff_reasons),
        "replies_sent": o.replies_sent,
        "stuck": o.stuck,
        "lag": lag,
        "recent": [t.model_dump(mode="json") for t in o.recent],
    }


def _status_stamp(status: Any) -> str:
    """Changes whenever anything the fragments show from outside the log changes."""
    return hashlib.sha256(repr(asdict(status)).encode()).hexdigest()[:16]


@web.middleware
async def _headers(request: web.Request, handler: Handler) -> web.StreamResponse:
    try:
        response = await handler(request)
    except web.HTTPException as exc:
        response = exc
    response.headers["Content-Security-Policy"] = CSP
    response.headers["X-Content-Type-Options"] = "nosniff"
    response.headers["Referrer-Policy"] = "no-referrer"
    response.headers["Cache-Control"] = "no-store"
    if isinstance(response, web.HTTPException):
        raise response
    return response


def _bearer(token: str) -> Callable[[web.Request, Handler], Awaitable[web.StreamResponse]]:
    expected = token.encode()
    session = session_value(token).encode()

    @web.middleware
    async def check(request: web.Request, handler: Handler) -> web.StreamResponse:
        if request.path == "/login":
            return await handler(request)
        header = request.headers.get("Authorization", "")
        scheme, _, given = header.partition(" ")
        if scheme.lower() == "bearer" and hmac.compare_digest(given.strip().encode(), expected):
            return await handler(request)
        cookie = request.cookies.get(SESSION_COOKIE, "")
        if cookie and hmac.compare_digest(cookie.encode(), session):
            return await handler(request)
        challenge = {"WWW-Authenticate": 'Bearer realm="chatwoot-router console"'}
        if request.path.startswith("/api/"):
            return web.json_response({"error": "bearer token required"}, status=401, headers=challenge)
        return web.Response(
            text=render_login(), status=401, content_type="text/html", charset="utf-8", headers=challenge
        )

    return check
