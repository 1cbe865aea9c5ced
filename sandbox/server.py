"""The sandbox process: one aiohttp server for Chatwoot, System One and the control API.

`run_sandbox` serves a `core.Sandbox` on a port; the routes of each API are in their own module.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from aiohttp import web

from sandbox import chatwoot_api, control
from sandbox.core import SANDBOX, SYSTEMONE_PATH, Sandbox
from sandbox.realism import Realism
from sandbox.systemone import answer


async def _systemone(request: web.Request) -> web.StreamResponse:
    """System One's decision endpoint (behavior.md §7.1) answered by the keyword classifier."""
    sandbox = request.app[SANDBOX]
    entry: dict[str, Any] = {"status": None, "body": None}
    entry["at"] = time.time()
    sandbox.systemone_calls.append(entry)
    key = sandbox.systemone_api_key
    if key is not None and request.headers.get("authorization") != f"Bearer {key}":
        entry["status"] = 401
        return web.json_response({"error": "unauthorized"}, status=401)
    fault = sandbox.faults.take("systemone")
    try:
        body = json.loads(await request.read())
    except ValueError:
        body = None
    entry["body"] = body
    answers = answer(body)

    async def apply() -> web.StreamResponse:
        if answers is None:
            return web.json_response({"error": "invalid request"}, status=400)
        return web.json_response(answers)

    response = await chatwoot_api.apply_faults(request, fault, apply)
    entry["status"] = response.status
    entry["answer"] = answers
    return response


def build_app(sandbox: Sandbox) -> web.Application:
    app = web.Application(middlewares=[chatwoot_api.rate_limit])
    app[SANDBOX] = sandbox
    chatwoot_api.add_routes(app)
    control.add_routes(app)
    app.router.add_post(SYSTEMONE_PATH, _systemone)
    return app


@asynccontextmanager
async def run_sandbox(
    host: str = "127.0.0.1",
    port: int = 0,
    *,
    scenario: dict[str, Any] | None = None,
    webhook_url: str | None = None,
    retry_delay_s: float = 3.0,
    webhook_timeout_s: float = 5.0,
    activity_delay_s: float = 0.0,
    realism: Realism | None = None,
) -> AsyncIterator[Sandbox]:
    """Serve a sandbox on host:port (0 = any free port); `sandbox.url` is its base URL. `realism` switches on a
    real Chatwoot's rough edges (realism.py; default: none)."""
    sandbox = Sandbox(
        scenario,
        webhook_url=webhook_url,
        retry_delay_s=retry_delay_s,
        webhook_timeout_s=webhook_timeout_s,
        activity_delay_s=activity_delay_s,
        realism=realism,
    )
    runner = web.AppRunner(build_app(sandbox), access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, host, port)
    await site.start()
    await sandbox.dispatcher.start()
    bound = site._server.sockets[0].getsockname()  # type: ignore[union-attr]
    sandbox.url = f"http://{host}:{bound[1]}"
    try:
        yield sandbox
    finally:
        await sandbox.dispatcher.close()
        await runner.cleanup()
        await asyncio.sleep(0)
