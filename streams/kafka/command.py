"""`chatwoot-router kafka [--port P] [--data-dir DIR] [--brokers 1|3] [--fetch-only]`: a local Apache Kafka
(KRaft) for development and tests, one node (`streams/kafka/local.py`) or three (`streams/kafka/cluster.py`);
one `ready bootstrap=…` line when it serves, stopped on Ctrl-C or SIGTERM."""

from __future__ import annotations

import argparse
import signal
import sys
import time
from pathlib import Path

from streams.kafka.cluster import run_cluster
from streams.kafka.local import DEFAULT_PORT, KafkaLaunchError, ensure_jars, start_broker


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--port",
        type=int,
        default=DEFAULT_PORT,
        help=f"client port (default {DEFAULT_PORT}); with --brokers 3 the first of three consecutive ports",
    )
    parser.add_argument(
        "--data-dir",
        type=Path,
        default=None,
        help="where the broker keeps its data (default: a new temporary directory); with --brokers 3 each node "
        "has its own node-N directory under it",
    )
    parser.add_argument(
        "--brokers",
        type=int,
        choices=(1, 3),
        default=1,
        help="1 (default): one node; 3: three KRaft nodes, each a broker and a controller in one controller "
        "quorum of three, with replication 3 and min.insync.replicas 2 (tests of failover and rolling restarts)",
    )
    parser.add_argument(
        "--fetch-only",
        action="store_true",
        help="resolve the broker's jars into the cache and exit (for images and CI)",
    )


def run(args: argparse.Namespace) -> int:
    stop_requested = False

    def request_stop(signum: int, frame: object) -> None:
        nonlocal stop_requested
        stop_requested = True

    if args.fetch_only:
        try:
            print(f"kafka jars ready in {ensure_jars(quiet=False)}")
        except KafkaLaunchError as exc:
            print(f"chatwoot-router kafka: {exc}", file=sys.stderr)
            return 1
        return 0
    if args.brokers > 1:
        return run_cluster(args.port, args.data_dir)
    signal.signal(signal.SIGTERM, request_stop)
    signal.signal(signal.SIGINT, request_stop)
    try:
        broker = start_broker(args.port, args.data_dir, quiet=False)
    except KafkaLaunchError as exc:
        print(f"chatwoot-router kafka: {exc}", file=sys.stderr)
        return 1
    print(f"ready bootstrap={broker.bootstrap}", flush=True)
    try:
        while not stop_requested and broker.process.poll() is None:
            time.sleep(0.2)
    finally:
        broker.stop()
    if not stop_requested:
        print(f"chatwoot-router kafka: the broker exited unexpectedly; see {broker.log_file}", file=sys.stderr)
        return 1
    return 0
