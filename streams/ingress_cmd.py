"""`chatwoot-router ingress`: serve the webhook door until SIGINT/SIGTERM (DESIGN §3).

Refuses to start on an invalid configuration (exit 2, key path on stderr). Kafka being down at start is not
fatal: the door answers 500 (which Chatwoot retries) until Kafka is back. On a signal it stops accepting
connections, lets requests in flight finish, flushes the producer and exits 0.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
import sys
from collections.abc import Mapping

from aiohttp import web

from handlers.ingress import KafkaWebhookWriter, SettingsFile, create_app
from handlers.logging_setup import configure_logging
from streams.config_cmd import load_or_exit

log = logging.getLogger("chatwoot_router.ingress")

DEFAULT_HOST = "0.0.0.0"
DEFAULT_PORT = 8080
SHUTDOWN_GRACE_S = 10.0


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--host", default=DEFAULT_HOST, help=f"address to listen on (default {DEFAULT_HOST})")
    parser.add_argument(
        "--port", type=int, default=DEFAULT_PORT, help=f"port to listen on, 0 = any (default {DEFAULT_PORT})"
    )
    parser.add_argument("--config", help="configuration file (JSON or YAML); default $ROUTER_CONFIG")


def conversations_topic(environ: Mapping[str, str] | None = None) -> str:
    """`<ROUTER_APP_ID>.conversations`, the topic the door writes to."""
    env = os.environ if environ is None else environ
    return f"{env.get('ROUTER_APP_ID') or 'chatwoot-router'}.conversations"


def _partitions() -> int:
    raw = os.environ.get("ROUTER_PARTITIONS") or "12"
    if not raw.isdigit() or int(raw) < 1:
        print("Invalid environment: ROUTER_PARTITIONS: must be a positive integer", file=sys.stderr)
        raise SystemExit(2)
    return int(raw)


async def serve(args: argparse.Namespace) -> None:
    """Run the app until a stop signal, then shut down in order: listener, requests, producer."""
    writer = KafkaWebhookWriter(
        os.environ.get("KAFKA_BOOTSTRAP_SERVERS") or "localhost:9092", conversations_topic(), _partitions()
    )
    app = create_app(settings=SettingsFile(args.config), writer=writer)
    runner = web.AppRunner(app, access_log=None, shutdown_timeout=SHUTDOWN_GRACE_S)
    await runner.setup()
    site = web.TCPSite(runner, args.host, args.port)
    await site.start()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, stop.set)
    try:
        await writer.connect()
    except Exception as exc:  # not fatal: requests retry the connection
        log.warning("kafka not reachable at start", extra={"error_type": type(exc).__name__})
    port = runner.addresses[0][1] if runner.addresses else args.port
    print(f"ready url=http://{args.host}:{port}", flush=True)
    log.info("ingress listening", extra={"host": args.host, "port": port, "topic": writer.topic})
    await stop.wait()
    log.info("ingress stopping")
    await runner.cleanup()  # stops the listener, waits for handlers, then closes (flushes) the writer
    log.info("ingress stopped")


def run(args: argparse.Namespace) -> int:
    load_or_exit(args.config)
    _partitions()  # refuse to start on an invalid configuration (exit 2)
    configure_logging()
    asyncio.run(serve(args))
    return 0
