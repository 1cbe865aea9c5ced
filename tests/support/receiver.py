"""A stand-in for the router's webhook endpoint, served on loopback for the sandbox's delivery tests."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager

from aiohttp import web

WEBHOOK_PATH = "/chatwoot/agent-bot"


@asynccontextmanager
async def serving(
    handle: Callable[[web.Request], Awaitable[web.StreamResponse]], client_max_size: int = 1024**2
) -> AsyncIterator[str]:
    """Serve `handle` at WEBHOOK_PATH on a free loopback port; yields the URL the sandbox posts to."""
    app = web.Application(client_max_size=client_max_size)
    app.router.add_post(WEBHOOK_PATH, handle)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    try:
        yield f"http://127.0.0.1:{port}{WEBHOOK_PATH}"
    finally:
        await runner.cleanup()
