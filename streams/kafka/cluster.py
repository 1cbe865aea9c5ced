"""`chatwoot-router kafka --brokers 3`: a local three-node Apache Kafka cluster (KRaft) for failover tests.

Each node is one JVM acting as broker *and* controller; the three controllers form one static quorum
(`controller.quorum.voters`), so the cluster keeps working with any one node down and stops accepting
`acks=all` writes with two down (replication 3, `min.insync.replicas` 2, the broker-wide default here and the
setting of the internal topics). Node *n* (1-based id) serves clients on `port + n - 1` and its controller on a
port chosen on first use and saved in its data dir (`<data-dir>/node-<n>/controller.port`), because the quorum
voters must stay the same across restarts. Everything else is the single node's (`streams.kafka.local`): the
same jars, JVM options and log settings.

The Python API is what the cluster tests use: `start_cluster()` returns a `LocalCluster` whose nodes can be
SIGKILLed, SIGTERMed (controlled shutdown) and restarted one by one on the same ports and data dirs. With
`secure=True` the nodes serve SASL_SSL and enforce ACLs (`streams.kafka.secure`); the certificates, SCRAM users and
client properties files are the cluster's, in its data dir, and the cluster's own probes run as `admin`.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from projections.acls import Role
from streams.kafka.local import (
    READY_TIMEOUT_S,
    KafkaLaunchError,
    _accepts_connections,
    _ensure_dir,
    _format_storage,
    _java_command,
    _saved_cluster_id,
    ensure_jars,
    scram_arguments,
    secure_setup,
)
from streams.kafka.ports import free_port, free_port_run, port_in_use
from streams.kafka.secure import SecureSetup, SecureSetupError, apply_settings, grant_roles, write_server_properties

CLUSTER_SIZE = 3
MIN_INSYNC_REPLICAS = 2
BROKER_SESSION_TIMEOUT_MS = 3000
"""How long the controller waits for a silent broker before it fences it (Kafka's default: 9000). With `acks=all`
every partition a dead broker replicates refuses writes until then, so it is the door's window in a broker's
death (docs/operations.md "Running on your Kafka cluster"); heartbeats every 500 ms keep a live broker well inside."""
BROKER_HEARTBEAT_INTERVAL_MS = 500
STOP_TIMEOUT_S = 30.0


def node_properties(node_id: int, port: int, controller_port: int, voters: str, log_dir: Path) -> str:
    """server.properties of one node of the cluster (broker and controller, replication 3, min ISR 2)."""
    replicas = CLUSTER_SIZE
    return "\n".join(
        [
            "process.roles=broker,controller",
            f"node.id={node_id}",
            f"controller.quorum.voters={voters}",
            f"listeners=PLAINTEXT://127.0.0.1:{port},CONTROLLER://127.0.0.1:{controller_port}",
            f"advertised.listeners=PLAINTEXT://127.0.0.1:{port}",
            "controller.listener.names=CONTROLLER",
            "inter.broker.listener.name=PLAINTEXT",
            "listener.security.protocol.map=CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT",
            f"log.dirs={log_dir}",
            "num.partitions=1",
            f"default.replication.factor={replicas}",
            f"min.insync.replicas={MIN_INSYNC_REPLICAS}",
            f"offsets.topic.replication.factor={replicas}",
            "offsets.topic.num.partitions=12",
            f"transaction.state.log.replication.factor={replicas}",
            f"transaction.state.log.min.isr={MIN_INSYNC_REPLICAS}",
            f"share.coordinator.state.topic.replication.factor={replicas}",
            f"share.coordinator.state.topic.min.isr={MIN_INSYNC_REPLICAS}",
            "unclean.leader.election.enable=false",
            f"broker.session.timeout.ms={BROKER_SESSION_TIMEOUT_MS}",
            f"broker.heartbeat.interval.ms={BROKER_HEARTBEAT_INTERVAL_MS}",
            "group.initial.rebalance.delay.ms=0",
            "auto.create.topics.enable=false",
            "log.retention.hours=-1",
            "log.segment.bytes=67108864",
            "",
        ]
    )


@dataclass
class ClusterNode:
    """One node of a LocalCluster: its id, ports, data dir and (while it runs) its process."""

    node_id: int
    port: int
    controller_port: int
    data_dir: Path
    command: list[str] = field(repr=False)
    process: subprocess.Popen[bytes] | None = field(default=None, repr=False)

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def log_file(self) -> Path:
        return self.data_dir / "broker.log"

    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def spawn(self) -> None:
        with (self.data_dir / "broker.stderr").open("ab") as stderr:
            self.process = subprocess.Popen(
                self.command,
                stdout=subprocess.DEVNULL,
                stderr=stderr,
                start_new_session=True,
            )

    def signal(self, signum: int, timeout: float = STOP_TIMEOUT_S) -> None:
        """Send `signum` and wait for the process to end (SIGKILL after `timeout`)."""
        process = self.process
        if process is None or process.poll() is not None:
            return
        process.send_signal(signum)
        try:
            process.wait(timeout)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


class LocalCluster:
    """A running three-node cluster; nodes are addressed by index (0, 1, 2; node id = index + 1)."""

    def __init__(self, nodes: list[ClusterNode], data_dir: Path, secure: SecureSetup | None = None) -> None:
        self.nodes = nodes
        self.data_dir = data_dir
        self.secure = secure
        self._admin_options = secure.client_options(Role.ADMIN) if secure else {}

    @property
    def bootstrap(self) -> str:
        return ",".join(node.bootstrap for node in self.nodes)

    @property
    def properties_dir(self) -> Path | None:
        """A secured cluster's client properties files and CA (None in plaintext)."""
        return self.secure.properties_dir if self.secure else None

    def grant(self, app_id: str) -> None:
        """Give a secured cluster's role users their ACLs for `app_id` too (from synchronous code: it runs a loop)."""
        if self.secure is None:
            raise KafkaLaunchError("a plaintext cluster has no ACLs: start it with secure=True")
        try:
            grant_roles(self.secure, self.bootstrap, app_id)
        except SecureSetupError as exc:
            raise KafkaLaunchError(str(exc)) from None

    def index_of(self, node_id: int) -> int:
        return next(n for n, node in enumerate(self.nodes) if node.node_id == node_id)

    # --- faults -------------------------------------------------------------------------------------------

    def kill(self, index: int) -> None:
        """SIGKILL one node, as a crash or a lost machine would."""
        self.nodes[index].signal(signal.SIGKILL)

    def terminate(self, index: int, timeout: float = STOP_TIMEOUT_S) -> None:
        """SIGTERM one node: a controlled shutdown (its leaderships move first), SIGKILL after `timeout`."""
        self.nodes[index].signal(signal.SIGTERM, timeout)

    def restart(self, index: int, ready_timeout: float = READY_TIMEOUT_S) -> None:
        """Start a stopped node again on the same ports and data dir; returns once it serves clients."""
        node = self.nodes[index]
        if node.alive():
            raise KafkaLaunchError(f"node {node.node_id} is still running")
        if port_in_use(node.port) or port_in_use(node.controller_port):
            raise KafkaLaunchError(f"node {node.node_id}'s ports ({node.port}, {node.controller_port}) are taken")
        node.spawn()
        self.wait_serving([index], ready_timeout)

    def stop(self, timeout: float = STOP_TIMEOUT_S) -> None:
        """Stop every node: SIGTERM to all at once (one by one, the last ones would wait for a lost quorum)."""
        running = [node for node in self.nodes if node.alive()]
        for node in running:
            assert node.process is not None
            node.process.terminate()
        deadline = time.monotonic() + timeout
        for node in running:
            node.signal(signal.SIGTERM, max(0.1, deadline - time.monotonic()))

    # --- state --------------------------------------------------------------------------------------------

    def wait_serving(self, indexes: list[int] | None = None, timeout: float = READY_TIMEOUT_S) -> None:
        """Until each node (default: all) answers metadata that lists it among the cluster's brokers."""
        wanted = [self.nodes[i] for i in (range(len(self.nodes)) if indexes is None else indexes)]
        deadline = time.monotonic() + timeout
        pending = list(wanted)
        while pending:
            for node in list(pending):
                if not node.alive():
                    code = node.process.returncode if node.process is not None else None
                    raise KafkaLaunchError(
                        f"node {node.node_id} exited with status {code}; see {node.log_file} and "
                        f"{node.data_dir / 'broker.stderr'}"
                    )
                if _accepts_connections(node.port) and node.node_id in registered_brokers(
                    node.bootstrap, 2.0, self._admin_options
                ):
                    pending.remove(node)
            if not pending:
                return
            if time.monotonic() > deadline:
                names = ", ".join(str(node.node_id) for node in pending)
                raise KafkaLaunchError(f"node(s) {names} did not serve within {timeout:.0f} s; see their broker.log")
            time.sleep(0.2)  # readiness poll, bounded by the deadline

    def describe_partitions(self) -> list[dict[str, Any]]:
        """Every partition of every topic as the live nodes see it: topic, partition, leader, replicas, isr."""
        live = ",".join(node.bootstrap for node in self.nodes if node.alive())
        return asyncio.run(_describe_partitions(live, self._admin_options)) if live else []

    def leaders(self, topic: str) -> dict[int, int]:
        """partition -> leader node id (-1 while it has none) of `topic`, from the metadata now."""
        return {p["partition"]: p["leader"] for p in self.describe_partitions() if p["topic"] == topic}

    def under_replicated(self) -> list[tuple[str, int]]:
        """(topic, partition) of every partition whose in-sync replicas are fewer than its replicas."""
        return [(p["topic"], p["partition"]) for p in self.describe_partitions() if set(p["isr"]) != set(p["replicas"])]

    def wait_in_sync(self, timeout: float = 120.0) -> None:
        """Until every node serves and no partition is under-replicated (a rolling restart's next step)."""
        deadline = time.monotonic() + timeout
        self.wait_serving(timeout=timeout)
        while True:
            with contextlib.suppress(Exception):
                if not self.under_replicated():
                    return
            if time.monotonic() > deadline:
                raise KafkaLaunchError(f"partitions still under-replicated after {timeout:.0f} s")
            time.sleep(0.2)  # metadata poll, bounded by the deadline

    def __enter__(self) -> LocalCluster:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def registered_brokers(
    bootstrap: str, timeout: float = 5.0, client_options: Mapping[str, Any] | None = None
) -> set[int]:
    """The ids of the brokers the metadata from `bootstrap` lists (empty when it does not answer)."""
    from aiokafka.admin import AIOKafkaAdminClient

    async def probe() -> set[int]:
        admin = AIOKafkaAdminClient(
            bootstrap_servers=bootstrap, request_timeout_ms=int(timeout * 1000), **(client_options or {})
        )
        try:
            async with asyncio.timeout(timeout):
                await admin.start()
            async with asyncio.timeout(timeout):
                cluster = await admin.describe_cluster()
            return {int(broker["node_id"]) for broker in cluster["brokers"]}
        except Exception:
            return set()
        finally:
            with contextlib.suppress(Exception):
                await admin.close()

    return asyncio.run(probe())


async def _describe_partitions(
    bootstrap: str, client_options: Mapping[str, Any], timeout: float = 15.0
) -> list[dict[str, Any]]:
    from aiokafka.admin import AIOKafkaAdminClient

    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap, request_timeout_ms=5000, **client_options)
    deadline = time.monotonic() + timeout
    try:
        async with asyncio.timeout(timeout):
            await admin.start()
        while True:
            try:  # the admin asks a random known broker, which may be the one just stopped: ask again
                async with asyncio.timeout(5):
                    topics = await admin.describe_topics()
                break
            except Exception:
                if time.monotonic() > deadline:
                    raise
                await asyncio.sleep(0.1)  # retry interval, bounded by the deadline
    finally:
        with contextlib.suppress(Exception):
            await admin.close()
    return [
        {
            "topic": topic["topic"],
            "partition": p["partition"],
            "leader": p["leader"],
            "replicas": list(p["replicas"]),
            "isr": list(p["isr"]),
        }
        for topic in topics
        if topic["error_code"] == 0
        for p in topic["partitions"]
    ]


def _controller_ports(node_dirs: list[Path], taken: set[int]) -> list[int]:
    """Each node's saved controller port, or a new free one (saved): the quorum voters never change."""
    ports: list[int] = []
    for node_dir in node_dirs:
        saved = node_dir / "controller.port"
        if saved.exists():
            port = int(saved.read_text(encoding="utf-8"))
        else:
            port = free_port()
            while port in taken or port in ports:
                port = free_port()
            saved.write_text(str(port), encoding="utf-8")
        ports.append(port)
    return ports


def start_cluster(
    port: int | None = None,
    data_dir: Path | None = None,
    *,
    ready_timeout: float = READY_TIMEOUT_S * 2,
    quiet: bool = True,
    secure: bool = False,
    app_id: str | None = None,
) -> LocalCluster:
    """Start three nodes on client ports `port`, `port + 1`, `port + 2` (formatting their data dirs on first
    use) and return once every node serves clients and lists all three brokers (`secure`: and once every node
    enforces the role users' ACLs for `app_id`)."""
    first = port or free_port_run(CLUSTER_SIZE)
    client_ports = [first + n for n in range(CLUSTER_SIZE)]
    for client_port in client_ports:
        if port_in_use(client_port):
            raise KafkaLaunchError(
                f"port {client_port} is already in use on 127.0.0.1: a cluster needs ports {first}-{client_ports[-1]};"
                " stop what uses it or pass --port with another first port"
            )
    lib = ensure_jars(quiet=quiet)
    root = _ensure_dir(Path(data_dir) if data_dir else Path(tempfile.mkdtemp(prefix="kafka-cluster-")))
    node_dirs = [_ensure_dir(root / f"node-{n + 1}") for n in range(CLUSTER_SIZE)]
    controller_ports = _controller_ports(node_dirs, set(client_ports))
    for controller_port in controller_ports:
        if port_in_use(controller_port):
            raise KafkaLaunchError(f"controller port {controller_port} (saved in {root}) is in use on 127.0.0.1")
    voters = ",".join(f"{n + 1}@127.0.0.1:{p}" for n, p in enumerate(controller_ports))
    # one cluster id for all three: the first formatted node's, else the cluster dir's saved one
    cluster_id = _saved_cluster_id(root, node_dirs[0] / "kraft-logs")
    setup = secure_setup(root, [node_dir / "kraft-logs" for node_dir in node_dirs], secure)
    nodes: list[ClusterNode] = []
    formats: list[tuple[list[str], Path]] = []
    for n, node_dir in enumerate(node_dirs):
        log_dir = _ensure_dir(node_dir / "kraft-logs")
        properties = node_dir / "server.properties"
        text = node_properties(n + 1, client_ports[n], controller_ports[n], voters, log_dir)
        if setup is None:
            properties.write_text(text, encoding="utf-8")
        else:
            write_server_properties(
                properties, apply_settings(text, setup.server_settings(client_ports[n], controller_ports[n]))
            )
        base = _java_command(lib, node_dir, node_dir / "broker.log")
        if not (log_dir / "meta.properties").exists():
            formats.append((base, properties))
        nodes.append(
            ClusterNode(n + 1, client_ports[n], controller_ports[n], node_dir, [*base, "kafka.Kafka", str(properties)])
        )
    # one JVM each: in parallel; the same SCRAM users in every node's bootstrap metadata
    with scram_arguments(setup, bool(formats)) as arguments, ThreadPoolExecutor(max_workers=CLUSTER_SIZE) as pool:
        for done in [pool.submit(_format_storage, base, props, cluster_id, arguments) for base, props in formats]:
            done.result()
    cluster = LocalCluster(nodes, root, setup)
    started = time.monotonic()
    for node in nodes:  # all at once: no node can finish starting before a quorum of controllers runs
        node.spawn()
    try:
        cluster.wait_serving(timeout=ready_timeout)
        if setup is not None and app_id is not None:
            left = max(5.0, ready_timeout - (time.monotonic() - started))
            grant_roles(setup, cluster.bootstrap, app_id, timeout=left)
    except SecureSetupError as exc:
        cluster.stop()
        raise KafkaLaunchError(str(exc)) from None
    except BaseException:
        cluster.stop()
        raise
    return cluster


@contextlib.contextmanager
def running_cluster(
    port: int | None = None, data_dir: Path | None = None, *, secure: bool = False, app_id: str | None = None
) -> Iterator[LocalCluster]:
    """A cluster for the duration of a `with` block."""
    cluster = start_cluster(port, data_dir, secure=secure, app_id=app_id)
    try:
        yield cluster
    finally:
        cluster.stop()
