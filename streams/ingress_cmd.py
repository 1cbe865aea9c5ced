"""`chatwoot-router ingress`: serve the webhook door until SIGINT/SIGTERM (DESIGN §3).

Refuses to start on an invalid configuration or environment (exit 2, one line naming the key path or variable
on stderr). Kafka being down at start is not fatal: the door answers 500 (which Chatwoot retries) and /healthz
503 until Kafka is back, and recovers by itself. On a signal it stops accepting connections, lets requests in
flight finish, flushes the producer and exits 0.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import signal
import sys
from collections.abc import Mapping

from handlers.ingress.connections import ConnectionGuard, ConnectionLimits
from handlers.ingress.door import IngressMetrics, KafkaWebhookWriter, SettingsFile, create_app, serve
from handlers.kafka.topics import ensure_topics, log_topic_findings
from handlers.logging_setup import configure_logging
from schemas.config import RouterEnv, read_env
from streams.config_cmd import env_or_exit, load_or_exit

log = logging.getLogger("chatwoot_router.ingress")

DEFAULT_HOST = "0.0.0.0"
DEFAULT_PORT = 8080
SHUTDOWN_GRACE_S = 10.0
EXIT_CANNOT_LISTEN = 1


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--host", default=DEFAULT_HOST, help=f"address to listen on (default {DEFAULT_HOST})")
    parser.add_argument(
        "--port", type=int, default=DEFAULT_PORT, help=f"port to listen on, 0 = any (default {DEFAULT_PORT})"
    )
    parser.add_argument("--config", help="configuration file (JSON or YAML); default $ROUTER_CONFIG")


def conversations_topic(environ: Mapping[str, str] | None = None) -> str:
    """`<ROUTER_APP_ID>.conversations`, the topic the door writes to."""
    return read_env(environ).topic("conversations")


async def serve_until_stopped(args: argparse.Namespace, env: RouterEnv) -> int:
    """Run the app until a stop signal, then shut down in order: listener, requests, producer."""
    metrics = IngressMetrics()
    produce_timeout_s = env.produce_timeout_ms / 1000
    writer = KafkaWebhookWriter(
        env.bootstrap,
        env.topic("conversations"),
        env.partitions,
        request_timeout_ms=max(5000, 2 * env.produce_timeout_ms),
        retire_grace_s=produce_timeout_s,
        on_replace=metrics.replaced,
    )
    guard = ConnectionGuard(
        ConnectionLimits(
            read_timeout_s=env.read_timeout_s,
            keepalive_timeout_s=env.keepalive_timeout_s,
            max_connections=env.max_connections,
        ),
        on_close=metrics.closed,
    )
    app = create_app(
        settings=SettingsFile(args.config, env),
        writer=writer,
        produce_timeout_s=produce_timeout_s,
        read_timeout_s=env.read_timeout_s,
        metrics=metrics,
        guard=guard,
    )
    try:
        runner = await serve(app, args.host, args.port, shutdown_timeout_s=SHUTDOWN_GRACE_S)
    except OSError as exc:
        print(f"chatwoot-router ingress: cannot listen on {args.host}:{args.port}: {exc.strerror}", file=sys.stderr)
        await writer.close()
        return EXIT_CANNOT_LISTEN
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, stop.set)
    try:
        async with asyncio.timeout(produce_timeout_s + 5):
            # the door may be the first to run: its topic gets ROUTER_LOG_RETENTION_MS (the writer's own
            # creation, on a later reconnect, gives it the default settings of projections/topic_settings.py)
            with contextlib.suppress(Exception):  # an unreachable broker is the writer's to report, just below
                await ensure_topics(
                    env.bootstrap, {writer.topic: env.partitions}, log_retention_ms=env.log_retention_ms
                )
            await writer.connect()
    except Exception as exc:  # not fatal: requests retry the connection
        log.warning("kafka not reachable at start", extra={"error_type": type(exc).__name__})
    # one log line per finding, in the background so the door's readiness never waits for it (never raises)
    check = asyncio.create_task(log_topic_findings(env.bootstrap, env.app_id, env.log_retention_ms))
    port = runner.addresses[0][1] if runner.addresses else args.port
    print(f"ready url=http://{args.host}:{port}", flush=True)
    log.info(
        "ingress listening",
        extra={
            "host": args.host,
            "port": port,
            "topic": writer.topic,
            "produce_timeout_ms": env.produce_timeout_ms,
            "read_timeout_s": env.read_timeout_s,
            "keepalive_timeout_s": env.keepalive_timeout_s,
            "max_connections": env.max_connections,
        },
    )
    await stop.wait()
    check.cancel()
    log.info("ingress stopping")
    await runner.cleanup()  # stops the listener, waits for handlers, then closes (flushes) the writer
    log.info("ingress stopped")
    return 0


def run(args: argparse.Namespace) -> int:
    env = env_or_exit()
    load_or_exit(args.config, env)  # refuse to start on an invalid configuration (exit 2)
    handler = configure_logging()
    try:
        return asyncio.run(serve_until_stopped(args, env))
    finally:
        handler.close()  # reports lines still counted as suppressed
