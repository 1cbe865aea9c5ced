"""`chatwoot-router console`: the read-only operator console (DESIGN §11), served until SIGINT/SIGTERM.

    chatwoot-router console [--host 127.0.0.1] [--port 8090] [--token-env NAME] [--worker-url URL ...]
                            [--snapshot-dir DIR]

It replays `<app>.conversations` (KAFKA_BOOTSTRAP_SERVERS, ROUTER_APP_ID) with the worker's fold, under the
configuration versions applied on `<app>.configs` (a configuration file only for a log without any), and keeps
tailing it, so its pages follow the router live. It listens before it reads anything from Kafka: its pages answer
from the first moment with what it has folded so far, and say that it is catching up until it has read the log to
its end. What it folded is kept in a snapshot on local disk
(`--snapshot-dir`, default `$ROUTER_DATA_DIR/console`): a restart shows the overview at once and reads only what
was written since; without a snapshot it folds the log from the start (and says how far it is). A conversation's
page is read from the log when it is asked for, from the conversation's first record in its own partition.

It binds 127.0.0.1 by default; bound to any other address it requires a bearer token, read from the environment
variable `--token-env` names, and refuses to start (exit 2, one line) without one. It never loads the router's
secrets, and shows customer text only as the router redacted it.
"""

from __future__ import annotations

import argparse
import asyncio
import ipaddress
import logging
import os
import signal
import sys
from collections.abc import Mapping
from pathlib import Path

from aiohttp import web

from handlers.console.live import LiveConsole
from handlers.console.server import create_app
from handlers.console.snapshot import Snapshot, snapshot_path
from handlers.console.sources import LogTail, Sources
from handlers.logging_setup import configure_logging
from schemas.config import RouterConfig, load_config_file
from schemas.configs import ConfigBook
from streams.config_cmd import env_or_exit

log = logging.getLogger("chatwoot_router.console")

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8090
MIN_TOKEN_LENGTH = 16
EXIT_USAGE = 2


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--host", default=DEFAULT_HOST, help=f"address to listen on (default {DEFAULT_HOST})")
    parser.add_argument("--port", type=int, default=DEFAULT_PORT, help=f"port, 0 = any (default {DEFAULT_PORT})")
    parser.add_argument(
        "--token-env",
        metavar="NAME",
        help="environment variable holding the bearer token; required when --host is not a loopback address",
    )
    parser.add_argument(
        "--worker-url",
        action="append",
        default=[],
        metavar="URL",
        help="a worker's web address (e.g. http://127.0.0.1:6066) whose /stuck list to show; repeatable",
    )
    parser.add_argument(
        "--config",
        help="configuration file, only for a log without applied configuration versions (default $ROUTER_CONFIG)",
    )
    parser.add_argument(
        "--snapshot-dir",
        type=Path,
        metavar="DIR",
        help="where the console keeps what it folded of the log (default $ROUTER_DATA_DIR/console)",
    )


def is_loopback(host: str) -> bool:
    if host.strip().lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False  # a name other than localhost may resolve anywhere


def resolve_token(host: str, token_env: str | None, environ: Mapping[str, str]) -> str | None:
    """The bearer token to require (None = none); SystemExit-worthy problems raise ValueError with one line."""
    if token_env is None:
        if is_loopback(host):
            return None
        raise ValueError(
            f"--host {host} is not a loopback address, so the console needs a bearer token: put one in an "
            "environment variable and name it with --token-env NAME"
        )
    token = environ.get(token_env, "").strip()
    if not token:
        raise ValueError(f"--token-env {token_env}: the environment variable {token_env} is not set or empty")
    if len(token) < MIN_TOKEN_LENGTH:
        raise ValueError(f"--token-env {token_env}: the token must be at least {MIN_TOKEN_LENGTH} characters long")
    return token


def url_of(host: str, port: int) -> str:
    shown = f"[{host}]" if ":" in host and not host.startswith("[") else host
    return f"http://{shown}:{port}"


async def serve(args: argparse.Namespace, config: RouterConfig | None, token: str | None) -> None:
    """Listen at once; the tail reads the configuration versions and the log in the background (LogTail)."""
    env = env_or_exit()
    directory = args.snapshot_dir or env.data_dir / "console"
    snapshot = Snapshot(snapshot_path(directory, env.app_id), f"{env.app_id}.conversations")
    # the tail reads the applied versions before the log (the file is only for a log without any)
    model = LiveConsole(
        env.bootstrap, env.app_id, ConfigBook(), snapshot, config=config, retry_base_ms=env.retry_base_ms
    )
    tail = LogTail(env.bootstrap, env.app_id, model)
    sources = Sources(tail, env.bootstrap, env.app_id, args.worker_url)
    app = create_app(model, sources, token=token)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, args.host, args.port)
    await site.start()
    tail.start()
    await sources.refresh()  # starts measuring the workers' lag in the background
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, stop.set)
    port = runner.addresses[0][1] if runner.addresses else args.port
    url = url_of(args.host, port)
    if token:
        print(f"console at {url}/ requires a bearer token (from ${args.token_env})", flush=True)
    else:
        print(f"console at {url}/ (loopback only, no token)", flush=True)
    print(f"ready url={url}", flush=True)
    log.info("console listening", extra={"host": args.host, "port": port, "topic": tail.topic, "auth": bool(token)})
    try:
        await stop.wait()
    finally:
        await tail.stop()
        await runner.cleanup()
        await sources.close()
        snapshot.close()


def run(args: argparse.Namespace) -> int:
    try:
        token = resolve_token(args.host, args.token_env, os.environ)
    except ValueError as exc:
        print(f"chatwoot-router console: {exc}", file=sys.stderr, flush=True)
        return EXIT_USAGE
    env = env_or_exit()
    path = args.config or env.config_path
    # the applied versions are what the workers fold under; the file is only for a log without any (a bad file
    # is still a ConfigError: one line and exit 2)
    config = load_config_file(path) if path else None
    configure_logging()
    asyncio.run(serve(args, config, token))
    return 0
