"""`chatwoot-router worker [--web-port P] [--web-host H] [--config FILE]`: run the Faust worker (DESIGN §3).

Refuses to start on an invalid configuration or environment (exit 2, the key path on stderr). Creates the
topics if they are missing (waiting for the broker as long as it takes, one log line per attempt), then runs
until SIGINT/SIGTERM, when Faust stops the agents, flushes the producer and commits offsets. Losing the broker
at any moment is never a reason to exit: a Kafka error that fails Faust's own start (a node of the cluster down
and not fenced yet, addressed by a request that does not try the others) starts the worker again in the same
process (`exec`), after the same pause as the broker wait.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
import sys
import threading
from typing import Any

from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.errors import KafkaError

from handlers.kafka.authorization import refusal_reason, report_once
from handlers.kafka.config_store import apply as apply_config
from handlers.kafka.config_store import ensure_configs_topic, read_book
from handlers.kafka.group_right import check_once as check_group_right
from handlers.kafka.group_right import probe_topic
from handlers.kafka.security import client_options
from handlers.kafka.topics import ensure_app_topics, log_topic_findings
from handlers.logging_setup import configure_logging
from handlers.privacy.kek import require_keks
from handlers.worker.fencing import STARTING_AGAIN
from schemas.config import ConfigError, Settings
from schemas.configs import ConfigBook, ConfigDocument, FoldSettings
from streams.config_cmd import EXIT_INVALID_CONFIG, load_or_exit
from streams.worker import WorkerEnv, build_worker, read_worker_env

log = logging.getLogger("chatwoot_router.worker")

# ends the lines below and the fail-stop line (handlers/worker/fencing.py): what the tests and the kill loop count
STARTING_AGAIN_START = "kafka failed the worker's start" + STARTING_AGAIN
STARTING_AGAIN_RUN = "a kafka error stopped the running worker" + STARTING_AGAIN
BROKER_RETRY_S = 0.5  # between attempts while a starting worker waits for the broker (no cap on the wait)
REFUSED_RETRY_S = 5.0  # ... and while the cluster refuses it a right: an administrator's grant takes a while
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

    The changelogs are created here, before Faust starts (`ensure_app_topics` says why), each topic with the
    settings of DESIGN §4 (projections/topic_settings.py).
    """
    await ensure_app_topics(env.bootstrap, env.app_id, env.partitions, log_retention_ms=env.log_retention_ms)
    admin = AIOKafkaAdminClient(bootstrap_servers=env.bootstrap, **client_options())
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


def wait_for_kafka(settings: Settings, env: WorkerEnv) -> tuple[int, ConfigBook] | None:
    """Check the group right, prepare the topics and the configuration, waiting for the broker as long as it takes.

    A broker that is restarting, not up yet or away for a while is no reason to exit (an orchestrator would
    only restart the worker into the same wait): each failed attempt is one log line, the next comes
    BROKER_RETRY_S later, so the worker starts soon after the broker is back. A right the cluster refuses is one
    line (once, not per attempt), the next attempt REFUSED_RETRY_S later. The group comes first: Faust's consumer
    would wait in silence for a JoinGroup the cluster refuses (handlers/kafka/group_right.py), and a principal that
    may not join the app's group is not this app's worker, whatever topics it may read. Returns the
    replication factor and the configuration book, or None when SIGINT/SIGTERM arrives while it waits.
    """
    stop = threading.Event()
    previous = {signum: signal.getsignal(signum) for signum in (signal.SIGINT, signal.SIGTERM)}
    for signum in previous:
        signal.signal(signum, lambda *_: stop.set())
    try:
        attempt = 0
        while not stop.is_set():
            attempt += 1
            try:
                asyncio.run(check_group_right(env.bootstrap, env.app_id, probe_topic(env.topic(""))))
                replication = asyncio.run(prepare_topics(env))
                book = asyncio.run(prepare_configuration(settings, env))
            except Exception as exc:
                refused = refusal_reason(exc)
                if refused is not None:  # one line per refusal (not per attempt), no traceback, and wait
                    report_once(refused, log)
                    stop.wait(REFUSED_RETRY_S)
                    continue
                log.warning(
                    "waiting for kafka",
                    extra={
                        "bootstrap": env.bootstrap,
                        "attempt": attempt,
                        "error_type": type(exc).__name__,
                        "error": str(exc)[:200],
                    },
                )
                stop.wait(BROKER_RETRY_S)  # the interval between attempts; a stop signal ends it at once
                continue
            return None if stop.is_set() else (replication, book)
        return None
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


def run(args: argparse.Namespace) -> int:
    from streams.worker.faust_worker import RouterWorker  # Faust is imported only by the command that runs it
    from streams.worker.internals import InternalsChanged

    settings = load_or_exit(args.config)
    env = env_or_exit()
    keks = require_keks()  # a worker without a key-encryption key refuses to start, in one line (docs/privacy.md)
    configure_logging(args.log_level.upper())  # JSON lines before Faust takes over logging (the topic check's)
    prepared = wait_for_kafka(settings, env)
    if prepared is None:
        return 0  # stopped while waiting for the broker
    replication, book = prepared
    asyncio.run(log_topic_findings(env.bootstrap, env.app_id, env.log_retention_ms))  # one line per finding
    loop = asyncio.new_event_loop()
    asyncio.set_event_loop(loop)
    try:
        worker_app = build_worker(
            settings,
            env,
            web_host=args.web_host,
            web_port=args.web_port,
            replication_factor=replication,
            book=book,
            keks=keks,
            declare_topics=False,  # wait_for_kafka made every topic: a worker needs no Create (projections/acls)
        )
    except InternalsChanged as exc:  # streams/worker/internals.py: one line, never a worker on unknown internals
        print(f"chatwoot-router worker: {exc}", file=sys.stderr, flush=True)
        return EXIT_INVALID_CONFIG
    worker = RouterWorker(
        worker_app.app,
        loop=loop,
        quiet=True,
        loglevel=args.log_level,
        redirect_stdouts=False,
        logging_config=logging_config(args.log_level),
    )
    try:
        worker.execute_from_commandline()  # raises SystemExit when the worker stops
    except SystemExit as stopped:
        error = worker.start_error or worker.crash_reason
        refused = refusal_reason(error) if error is not None else None
        if refused is not None:
            report_once(refused, log)  # which right, on what, for whom: once, then the worker waits and tries again
        pause = REFUSED_RETRY_S if refused is not None else BROKER_RETRY_S
        if stopped.code and is_broker_fault(error) and not stop_requested(pause):
            start_again(error, while_starting=worker.start_error is not None, quiet=refused is not None)
        raise
    return 0


def is_broker_fault(error: BaseException | None) -> bool:
    """A Kafka error (or a connection failure) while Faust starts: a broker fault, not a fault of this worker."""
    return isinstance(error, KafkaError | ConnectionError | asyncio.TimeoutError)


def stop_requested(seconds: float) -> bool:
    """Wait `seconds`; whether SIGINT/SIGTERM arrived meanwhile (then the worker exits instead of starting again)."""
    stop = threading.Event()
    previous = {signum: signal.getsignal(signum) for signum in (signal.SIGINT, signal.SIGTERM)}
    for signum in previous:
        signal.signal(signum, lambda *_: stop.set())
    try:
        return stop.wait(seconds)
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


def start_again(error: BaseException | None, *, while_starting: bool, quiet: bool = False) -> None:
    """Replace this process by a fresh start of the same command: Faust's app cannot start twice in one process,
    and a supervisor should not see an exit for what is the broker's fault. `quiet`: the refusal line said why."""
    log.log(
        logging.DEBUG if quiet else logging.WARNING,
        STARTING_AGAIN_START if while_starting else STARTING_AGAIN_RUN,
        extra={"error_type": type(error).__name__, "error": str(error)[:200]},
    )
    logging.shutdown()
    os.execv(sys.executable, [sys.executable, *sys.orig_argv[1:]])
