"""`chatwoot-router kafka [--port P] [--data-dir DIR] [--brokers 1|3] [--secure] [--fetch-only]`: a local Apache
Kafka (KRaft) for development and tests, one node (`streams/kafka/local.py`) or three (`streams/kafka/cluster.py`);
one `ready bootstrap=…` line when it serves, stopped on Ctrl-C or SIGTERM.

`--secure` serves SASL_SSL (SCRAM-SHA-512) with ACLs instead of PLAINTEXT (`streams/kafka/secure.py`): one user per
role with that role's ACLs for ROUTER_APP_ID, and the ready line names the directory of their client properties
files, `ready bootstrap=… properties=DIR`. No password is printed: they are in those files (mode 0600)."""

from __future__ import annotations

import argparse
import signal
import sys
import threading
from pathlib import Path

from schemas.config import ConfigError, read_env
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
        "--secure",
        action="store_true",
        help="serve SASL_SSL (SCRAM-SHA-512, a CA made in the data dir) with ACLs: users admin (super user), "
        "ingress, worker, reader and privacy (forget), each with its role's ACLs for ROUTER_APP_ID (default "
        "chatwoot-router); the ready line adds properties=DIR, the directory of <role>.properties and ca.pem",
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
    app_id = None
    if args.secure:
        try:
            app_id = read_env().app_id
        except ConfigError as exc:  # names the variable, never its value
            print(f"chatwoot-router kafka: {exc}", file=sys.stderr)
            return 2
    stop = threading.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: stop.set())
    start = start_cluster if args.brokers > 1 else start_broker
    try:
        served = start(args.port, args.data_dir, quiet=False, secure=args.secure, app_id=app_id)
    except (KafkaLaunchError, NoFreePort) as exc:
        print(f"chatwoot-router kafka: {exc}", file=sys.stderr)
        return 1
    print(ready_line(served), flush=True)
    try:
        gone = serve(served, stop)
    finally:
        served.stop()
    if gone:
        print(f"chatwoot-router kafka: {gone}", file=sys.stderr)
        return 1
    return 0


def ready_line(served: LocalKafka | LocalCluster) -> str:
    """`ready bootstrap=h:p[,h:p,h:p]`, and ` properties=DIR` when secured: what scripts and tests wait for."""
    line = f"ready bootstrap={served.bootstrap}"
    return f"{line} properties={served.properties_dir}" if served.properties_dir else line


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
