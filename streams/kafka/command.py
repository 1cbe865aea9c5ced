"""`chatwoot-router kafka [--port P] [--data-dir DIR] [--brokers 1|3] [--fetch-only]`: a local Apache Kafka
(KRaft) for development and tests, one node (`streams/kafka/local.py`) or three (`streams/kafka/cluster.py`);
one `ready bootstrap=…` line when it serves, stopped on Ctrl-C or SIGTERM."""

from __future__ import annotations

import argparse
import signal
import sys
import threading
from pathlib import Path

from streams.kafka.cluster import LocalCluster, start_cluster
from streams.kafka.local import DEFAULT_PORT, KafkaLaunchError, LocalKafka, ensure_jars, start_broker
from streams.kafka.ports import NoFreePort


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
    if args.fetch_only:
        try:
            print(f"kafka jars ready in {ensure_jars(quiet=False)}")
        except KafkaLaunchError as exc:
            print(f"chatwoot-router kafka: {exc}", file=sys.stderr)
            return 1
        return 0
    stop = threading.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: stop.set())
    try:
        served = (start_cluster if args.brokers > 1 else start_broker)(args.port, args.data_dir, quiet=False)
    except (KafkaLaunchError, NoFreePort) as exc:
        print(f"chatwoot-router kafka: {exc}", file=sys.stderr)
        return 1
    print(f"ready bootstrap={served.bootstrap}", flush=True)
    try:
        gone = serve(served, stop)
    finally:
        served.stop()
    if gone:
        print(f"chatwoot-router kafka: {gone}", file=sys.stderr)
        return 1
    return 0


def serve(served: LocalKafka | LocalCluster, stop: threading.Event) -> str | None:
    """Until `stop` is set (None) or nothing is left serving (what exited). A node of the cluster that exits by
    itself is reported once on stderr and the others keep running (a developer may kill one to try failover)."""
    nodes = served.nodes if isinstance(served, LocalCluster) else []
    reported: set[int] = set()
    while not stop.wait(0.2):
        if isinstance(served, LocalKafka) and served.process.poll() is not None:
            return f"the broker exited unexpectedly; see {served.log_file}"
        for node in nodes:
            if not node.alive() and node.node_id not in reported:
                reported.add(node.node_id)
                print(f"chatwoot-router kafka: node {node.node_id} exited; see {node.log_file}", file=sys.stderr)
        if nodes and len(reported) == len(nodes):
            return "every node exited"
    return None
