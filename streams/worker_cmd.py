"""`chatwoot-router worker [--web-port P] [--web-host H] [--config FILE]`: run the Faust worker (DESIGN §3).

Refuses to start on an invalid configuration or environment (exit 2, the key path on stderr). Creates the
topics if they are missing, then runs until SIGINT/SIGTERM, when Faust stops the agents, flushes the
producer and commits offsets.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys
import time
from typing import Any

from aiokafka.admin import AIOKafkaAdminClient

from handlers.config_store import apply as apply_config
from handlers.config_store import ensure_configs_topic, read_book
from handlers.kafka_topics import TABLES, changelog_topic, ensure_topics
from schemas.config import ConfigError, Settings
from schemas.configs import ConfigBook, ConfigDocument, FoldSettings
from streams.config_cmd import EXIT_INVALID_CONFIG, load_or_exit
from streams.worker import WorkerEnv, build_worker, read_worker_env

log = logging.getLogger("chatwoot_router.worker")

EXIT_KAFKA_UNAVAILABLE = 1
BROKER_WAIT_S = 60.0  # how long a starting worker waits for an unreachable broker before it gives up
DEFAULT_WEB_PORT = 6066
DEFAULT_WEB_HOST = "127.0.0.1"
TOPICS = ("conversations", "effects", "sweeps", "dlq")
_QUIET_LOGGERS = ("faust", "mode", "aiokafka", "kafka", "rocksdict", "aiohttp.access", "httpx")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--web-port", type=int, default=DEFAULT_WEB_PORT, help="health/metrics port (default 6066)")
    parser.add_argument("--web-host", default=DEFAULT_WEB_HOST, help="health/metrics address (default 127.0.0.1)")
    parser.add_argument("--config", help="configuration file (JSON or YAML); default $ROUTER_CONFIG")
    parser.add_argument("--log-level", default="info", help="log level (default info)")


def env_or_exit() -> WorkerEnv:
    try:
        return read_worker_env()
    except ConfigError as exc:
        print(str(exc), file=sys.stderr)
        raise SystemExit(EXIT_INVALID_CONFIG) from None


def logging_config(level: str) -> dict[str, Any]:
    """JSON logs on stderr for our loggers and Faust's (Faust's own set-up replaces root handlers)."""
    return {
        "version": 1,
        "disable_existing_loggers": False,
        "formatters": {"json": {"()": "handlers.logging_setup.JsonFormatter"}},
        "handlers": {
            "stderr": {
                # library loggers rate-limited, aiohttp's request errors cleaned (handlers/logging_setup.py)
                "class": "handlers.logging_setup.RateLimitedStreamHandler",
                "formatter": "json",
                "stream": "ext://sys.stderr",
            }
        },
        "root": {"level": level.upper(), "handlers": ["stderr"]},
        "loggers": {name: {"level": "WARNING"} for name in _QUIET_LOGGERS},
    }


async def prepare_topics(env: WorkerEnv) -> int:
    """Create the four topics and the tables' changelogs if missing; returns the replication factor for Faust.

    The changelogs are created here, before Faust starts, because Faust's own creation can lose a race with its
    first assignment ("Ignoring missing topic"), after which every write to that table fails (PartitionsMismatch).
    """
    await ensure_topics(env.bootstrap, {env.topic(name): env.partitions for name in TOPICS})
    changelogs = {changelog_topic(env.app_id, table): env.partitions for table in TABLES}
    compacted = {"cleanup.policy": "compact"}
    await ensure_topics(env.bootstrap, changelogs, configs={name: compacted for name in changelogs})
    admin = AIOKafkaAdminClient(bootstrap_servers=env.bootstrap)
    try:
        await admin.start()
        cluster = await admin.describe_cluster()
        return max(1, min(3, len(cluster["brokers"])))
    finally:
        await admin.close()


async def prepare_configuration(settings: Settings, env: WorkerEnv) -> ConfigBook:
    """Make this worker's configuration file an event when it differs from the latest applied (DESIGN §8)."""
    await ensure_configs_topic(env.bootstrap, env.app_id)
    book = await read_book(env.bootstrap, env.app_id)
    own = ConfigDocument.of(settings.config, FoldSettings(retry_base_ms=env.retry_base_ms))
    latest = book.latest
    if latest is None or latest.version != own.version:
        markers = await apply_config(env.bootstrap, env.app_id, own)
        print(f"applied configuration version {own.version} ({markers} partitions marked)", file=sys.stderr)
        book = await read_book(env.bootstrap, env.app_id)
    return book


def run(args: argparse.Namespace) -> int:
    import faust

    settings = load_or_exit(args.config)
    env = env_or_exit()
    deadline = time.monotonic() + BROKER_WAIT_S
    delay = 0.5
    while True:  # a broker restarting (or not up yet) is waited for; one that stays away exits non-zero
        try:
            replication = asyncio.run(prepare_topics(env))
            book = asyncio.run(prepare_configuration(settings, env))
            break
        except Exception as exc:
            if time.monotonic() + delay > deadline:
                print(f"kafka not usable at {env.bootstrap}: {type(exc).__name__}: {exc}", file=sys.stderr)
                return EXIT_KAFKA_UNAVAILABLE
            print(f"waiting for kafka at {env.bootstrap}: {type(exc).__name__}", file=sys.stderr, flush=True)
            time.sleep(delay)  # backoff between connection attempts, bounded by BROKER_WAIT_S
            delay = min(delay * 2, 5.0)
    loop = asyncio.new_event_loop()
    asyncio.set_event_loop(loop)
    worker_app = build_worker(
        settings, env, web_host=args.web_host, web_port=args.web_port, replication_factor=replication, book=book
    )
    worker = faust.Worker(
        worker_app.app,
        loop=loop,
        quiet=True,
        loglevel=args.log_level,
        redirect_stdouts=False,
        logging_config=logging_config(args.log_level),
    )
    worker.execute_from_commandline()  # raises SystemExit when the worker stops
    return 0
