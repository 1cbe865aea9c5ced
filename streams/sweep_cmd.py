"""`chatwoot-router sweep [--account N]`: request a sweep pass now (DESIGN §3).

Writes one `SweepRequested` per account and status (pending, open) to `<app>.sweeps` with acks=all and an
idempotent producer, and exits 0 only once every record is acknowledged, i.e. durable in Kafka. An account
that is not routed is refused (exit 2); Kafka unreachable exits 1.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time

from handlers.kafka.retry import KafkaUnusable, print_waiting, retrying
from handlers.kafka.topic_io import durable_producer
from handlers.kafka.topics import ensure_app_topics
from schemas.records import SweepRequested
from streams.config_cmd import EXIT_INVALID_CONFIG, load_or_exit
from streams.worker.env import WorkerEnv
from streams.worker_cmd import env_or_exit

SEND_TIMEOUT_S = 30.0


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--account", type=int, help="sweep only this routed account (default: all)")
    parser.add_argument("--config", help="configuration file (JSON or YAML); default $ROUTER_CONFIG")


def requests_for(accounts: list[int], at_ms: int) -> list[SweepRequested]:
    return [SweepRequested(account_id=a, status=s, at_ms=at_ms) for a in accounts for s in ("pending", "open")]


async def produce(env: WorkerEnv, records: list[SweepRequested]) -> None:
    await ensure_app_topics(env.bootstrap, env.app_id, env.partitions, log_retention_ms=env.log_retention_ms)
    async with durable_producer(env.bootstrap) as producer, asyncio.timeout(SEND_TIMEOUT_S):
        for record in records:
            await producer.send_and_wait(
                env.topic("sweeps"), value=record.model_dump_json().encode(), key=record.key.encode()
            )


def run(args: argparse.Namespace) -> int:
    settings = load_or_exit(args.config)
    env = env_or_exit()
    routed = sorted(settings.config.routing.accounts)
    if args.account is not None and args.account not in routed:
        print(f"Invalid argument: --account: account {args.account} is not routed", file=sys.stderr)
        return EXIT_INVALID_CONFIG
    accounts = [args.account] if args.account is not None else routed
    records = requests_for(accounts, time.time_ns() // 1_000_000)
    try:  # transient broker states are waited out (handlers/kafka/retry.py); a repeated request is harmless
        asyncio.run(
            retrying(
                lambda: produce(env, records), bootstrap=env.bootstrap, on_wait=print_waiting("sweep", env.bootstrap)
            )
        )
    except KafkaUnusable as exc:
        print(f"sweep request not durable: {exc}", file=sys.stderr)
        return 1
    except Exception as exc:
        print(f"sweep request not durable: {type(exc).__name__}", file=sys.stderr)
        return 1
    print(f"sweep requested: {len(records)} passes ({', '.join(str(a) for a in accounts)})")
    return 0
