"""`chatwoot-router kafka`: a real single-node Apache Kafka 4.x broker (KRaft) for development and tests.

The broker runs from the official jars, resolved from Maven Central with Maven into a cache directory on first
use; later starts reuse the cache and need no network. Settings suit one node: replication factor 1 for the
internal topics, no initial rebalance delay. The command prints exactly one line
`ready bootstrap=127.0.0.1:<port>` once a client can fetch metadata, then stays in the foreground until
SIGINT/SIGTERM, when it stops the broker cleanly. `--brokers 3` runs a three-node cluster instead
(`streams.kafka.cluster`); `--secure` serves SASL_SSL with ACLs instead of PLAINTEXT (`streams.kafka.secure`).
"""

from __future__ import annotations

import base64
import contextlib
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

from projections.acls import Role
from streams.kafka.ports import free_port, port_in_use
from streams.kafka.secure import (
    SecureSetup,
    SecureSetupError,
    apply_settings,
    grant_roles,
    is_secured,
    prepare,
    write_server_properties,
)

KAFKA_VERSION = "4.1.1"
DEFAULT_PORT = 9092
READY_TIMEOUT_S = 90.0


class KafkaLaunchError(RuntimeError):
    """The broker cannot be started; the message says what to do."""


def cache_root() -> Path:
    """Where resolved jars live: $CHATWOOT_ROUTER_CACHE, else ~/.cache/chatwoot-router."""
    configured = os.environ.get("CHATWOOT_ROUTER_CACHE")
    return Path(configured) if configured else Path.home() / ".cache" / "chatwoot-router"


def _require_tool(name: str, advice: str) -> str:
    path = shutil.which(name)
    if path is None:
        raise KafkaLaunchError(f"{name} was not found on PATH: {advice}")
    return path


def ensure_jars(version: str = KAFKA_VERSION, *, quiet: bool = False) -> Path:
    """Return the directory holding the broker's jars, resolving them with Maven on first use."""
    lib = cache_root() / f"kafka-{version}" / "lib"
    marker = lib / ".complete"
    if marker.exists():
        return lib
    mvn = _require_tool("mvn", "install Maven (e.g. `apt-get install maven`) to fetch the Kafka jars")
    _require_tool("java", "install a Java 17+ runtime (e.g. `apt-get install openjdk-17-jre-headless`)")
    pom_text = resources.files("streams.kafka").joinpath("kafka-broker-pom.xml").read_text(encoding="utf-8")
    staging = Path(tempfile.mkdtemp(prefix="kafka-jars-", dir=_ensure_dir(lib.parent)))
    try:
        (staging / "pom.xml").write_text(pom_text.replace("@KAFKA_VERSION@", version), encoding="utf-8")
        if not quiet:
            print(f"resolving Apache Kafka {version} from Maven Central (first start only)…", file=sys.stderr)
        _run_or_fail(
            [
                mvn,
                "-q",
                "-B",
                "dependency:copy-dependencies",
                "-DincludeScope=runtime",
                f"-DoutputDirectory={staging / 'lib'}",
            ],
            f"Maven could not resolve Apache Kafka {version}",
            cwd=staging,
        )
        if lib.exists():
            shutil.rmtree(lib)
        (staging / "lib").rename(lib)
        marker.write_text(version, encoding="utf-8")
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return lib


def _ensure_dir(path: Path) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    return path


def broker_properties(port: int, controller_port: int, log_dir: Path, advertised_port: int | None = None) -> str:
    """server.properties for one KRaft node acting as broker and controller; `advertised_port` (a proxy in front
    of it, bench/latency_proxy.py) is where clients are told to connect instead of `port`."""
    return "\n".join(
        [
            "process.roles=broker,controller",
            "node.id=1",
            f"controller.quorum.voters=1@127.0.0.1:{controller_port}",
            f"listeners=PLAINTEXT://127.0.0.1:{port},CONTROLLER://127.0.0.1:{controller_port}",
            f"advertised.listeners=PLAINTEXT://127.0.0.1:{advertised_port or port}",
            "controller.listener.names=CONTROLLER",
            "inter.broker.listener.name=PLAINTEXT",
            "listener.security.protocol.map=CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT",
            f"log.dirs={log_dir}",
            "num.partitions=1",
            "default.replication.factor=1",
            "min.insync.replicas=1",
            "offsets.topic.replication.factor=1",
            "offsets.topic.num.partitions=12",
            "transaction.state.log.replication.factor=1",
            "transaction.state.log.min.isr=1",
            "share.coordinator.state.topic.replication.factor=1",
            "share.coordinator.state.topic.min.isr=1",
            "group.initial.rebalance.delay.ms=0",
            "auto.create.topics.enable=false",
            "log.retention.hours=-1",
            "log.segment.bytes=67108864",
            "",
        ]
    )


LOG4J2_PROPERTIES = """\
status = warn
appender.file.type = File
appender.file.name = file
appender.file.fileName = {log_file}
appender.file.layout.type = PatternLayout
appender.file.layout.pattern = [%d] %p %m (%c)%n
rootLogger.level = WARN
rootLogger.appenderRef.file.ref = file
logger.kafka.name = kafka
logger.kafka.level = INFO
"""


@dataclass
class LocalKafka:
    """A running broker process; use `start_broker` to make one."""

    process: subprocess.Popen[bytes]
    port: int
    data_dir: Path
    log_file: Path
    secure: SecureSetup | None = field(default=None, repr=False)

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def properties_dir(self) -> Path | None:
        """A secured broker's client properties files and CA (None in plaintext)."""
        return self.secure.properties_dir if self.secure else None

    def grant(self, app_id: str) -> None:
        """Give a secured broker's role users their ACLs for `app_id` too (from synchronous code: it runs a loop)."""
        if self.secure is None:
            raise KafkaLaunchError("a plaintext broker has no ACLs: start it with secure=True")
        try:
            grant_roles(self.secure, self.bootstrap, app_id)
        except SecureSetupError as exc:
            raise KafkaLaunchError(str(exc)) from None

    def stop(self, timeout: float = 30.0) -> None:
        """Stop the broker cleanly (SIGTERM, then SIGKILL after `timeout`)."""
        if self.process.poll() is not None:
            return
        self.process.terminate()
        try:
            self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()

    def kill(self) -> None:
        """Kill the broker abruptly, as a crash would."""
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait()


def _java_command(lib: Path, config_dir: Path, log_file: Path) -> list[str]:
    java = _require_tool("java", "install a Java 17+ runtime (e.g. `apt-get install openjdk-17-jre-headless`)")
    log4j = config_dir / "log4j2.properties"
    log4j.write_text(LOG4J2_PROPERTIES.format(log_file=log_file), encoding="utf-8")
    return [
        java,
        "-Xms256m",
        "-Xmx1g",
        "-XX:+UseG1GC",
        "-XX:TieredStopAtLevel=1",
        "-Djava.awt.headless=true",
        f"-Dlog4j2.configurationFile={log4j}",
        f"-Dkafka.logs.dir={log_file.parent}",
        "-cp",
        f"{lib}/*",
    ]


def _format_storage(base: list[str], properties: Path, cluster_id: str, arguments: Sequence[str] = ()) -> None:
    """Format the node's storage unless it is; `arguments` are more options (an `@file` of `--add-scram`)."""
    _run_or_fail(
        [
            *base,
            "kafka.tools.StorageTool",
            "format",
            "-t",
            cluster_id,
            "-c",
            str(properties),
            "--ignore-formatted",
            *arguments,
        ],
        "formatting the KRaft storage failed",
    )


def secure_setup(root: Path, log_dirs: Sequence[Path], secure: bool) -> SecureSetup | None:
    """The data dir's secured setup when `secure` (made on first use), after checking that the data dir was
    made the same way: a storage formatted in plaintext has no SCRAM users, and a secured one must not be served
    to clients without authentication."""
    formatted = any((log_dir / "meta.properties").exists() for log_dir in log_dirs)
    if secure and not is_secured(root) and formatted:
        raise KafkaLaunchError(f"{root} was formatted without --secure (it has no SCRAM users): use a new --data-dir")
    if not secure and is_secured(root):
        raise KafkaLaunchError(f"{root} was made with --secure: pass --secure, or use another --data-dir")
    if not secure:
        return None
    try:
        return prepare(root, add_roles=not formatted)  # a formatted storage's SCRAM users are the ones it has
    except (SecureSetupError, ValueError, OSError) as exc:
        raise KafkaLaunchError(str(exc)) from None


@contextlib.contextmanager
def scram_arguments(setup: SecureSetup | None, formatting: bool) -> Iterator[list[str]]:
    """The storage tool's extra arguments: the SCRAM users of a secured data dir that is being formatted, in a
    0600 file that exists only while the tool runs."""
    if setup is None or not formatting:
        yield []
        return
    path = setup.scram_argument_file()
    try:
        yield [f"@{path}"]
    finally:
        path.unlink(missing_ok=True)


def _run_or_fail(command: list[str], failure: str, cwd: Path | None = None) -> None:
    """Run a tool to completion; on failure raise KafkaLaunchError with the tail of its output."""
    result = subprocess.run(command, cwd=cwd, capture_output=True, text=True, check=False)
    if result.returncode != 0:
        tail = "\n".join((result.stdout + result.stderr).strip().splitlines()[-15:])
        raise KafkaLaunchError(f"{failure}:\n{tail}")


def broker_answers(bootstrap: str, timeout: float = 5.0, client_options: Mapping[str, Any] | None = None) -> bool:
    """True when a Kafka client (with `client_options`: a secured broker's administrator) can fetch cluster
    metadata from `bootstrap`."""
    import asyncio

    from aiokafka.admin import AIOKafkaAdminClient

    async def probe() -> bool:
        admin = AIOKafkaAdminClient(
            bootstrap_servers=bootstrap, request_timeout_ms=int(timeout * 1000), **(client_options or {})
        )
        try:
            async with asyncio.timeout(timeout):
                await admin.start()
            async with asyncio.timeout(timeout):
                await admin.describe_cluster()
            return True
        except Exception:
            return False
        finally:
            with contextlib.suppress(Exception):
                await admin.close()

    return asyncio.run(probe())


def start_broker(
    port: int | None = None,
    data_dir: Path | None = None,
    *,
    ready_timeout: float = READY_TIMEOUT_S,
    quiet: bool = True,
    advertised_port: int | None = None,
    secure: bool = False,
    app_id: str | None = None,
    settings: Mapping[str, str] | None = None,
) -> LocalKafka:
    """Start a broker (formatting `data_dir` on first use) and return once clients can connect (through
    `advertised_port` when given: a proxy in front of the broker must be listening there). `settings` are more
    server.properties (replacing the defaults they name), e.g. a log cleaner that runs within a second for a test
    of compaction: `log.cleaner.backoff.ms`, `log.segment.delete.delay.ms`.

    `secure`: SASL_SSL with SCRAM users and ACLs (`streams.kafka.secure`); the role users get their ACLs for
    `app_id` before this returns (more app ids: `LocalKafka.grant`), and `properties_dir` has their files."""
    port = port or free_port()
    if port_in_use(port):
        raise KafkaLaunchError(
            f"port {port} is already in use on 127.0.0.1: stop what uses it or pass --port with another port"
        )
    lib = ensure_jars(quiet=quiet)
    data_dir = _ensure_dir(Path(data_dir) if data_dir else Path(tempfile.mkdtemp(prefix="kafka-data-")))
    log_dir = _ensure_dir(data_dir / "kraft-logs")
    log_file = data_dir / "broker.log"
    properties = data_dir / "server.properties"
    # The controller port must stay the same across restarts of one data dir (it is in the quorum state).
    controller_file = data_dir / "controller.port"
    if controller_file.exists():
        controller_port = int(controller_file.read_text(encoding="utf-8"))
    else:
        controller_port = free_port()
        controller_file.write_text(str(controller_port), encoding="utf-8")
    setup = secure_setup(data_dir, [log_dir], secure)
    text = apply_settings(broker_properties(port, controller_port, log_dir, advertised_port), settings or {})
    if setup is None:
        properties.write_text(text, encoding="utf-8")
    else:
        settings = setup.server_settings(port, controller_port, advertised_port)
        write_server_properties(properties, apply_settings(text, settings))
    base = _java_command(lib, data_dir, log_file)
    cluster_id = _saved_cluster_id(data_dir, log_dir)
    with scram_arguments(setup, not (log_dir / "meta.properties").exists()) as arguments:
        _format_storage(base, properties, cluster_id, arguments)
    with (data_dir / "broker.stderr").open("wb") as stderr:
        process = subprocess.Popen(
            [*base, "kafka.Kafka", str(properties)],
            stdout=subprocess.DEVNULL,
            stderr=stderr,
            start_new_session=True,
        )
    broker = LocalKafka(process=process, port=port, data_dir=data_dir, log_file=log_file, secure=setup)
    admin = setup.client_options(Role.ADMIN) if setup else None
    deadline = time.monotonic() + ready_timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise KafkaLaunchError(
                f"the broker exited with status {process.returncode}; see {log_file} and {data_dir / 'broker.stderr'}"
            )
        if _accepts_connections(port) and broker_answers(broker.bootstrap, timeout=2.0, client_options=admin):
            try:
                if setup is not None and app_id is not None:
                    grant_roles(setup, broker.bootstrap, app_id, timeout=max(5.0, deadline - time.monotonic()))
            except SecureSetupError as exc:
                broker.stop()
                raise KafkaLaunchError(str(exc)) from None
            except BaseException:
                broker.stop()
                raise
            return broker
        time.sleep(0.2)
    broker.stop()
    raise KafkaLaunchError(f"the broker did not become ready within {ready_timeout:.0f} s; see {log_file}")


_CLUSTER_ID = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_-]{21}")


def _cluster_id() -> str:
    """A KRaft cluster id as Kafka's `Uuid.randomUuid()` makes them: 16 random bytes, URL-safe base64 without
    padding (22 characters), drawn again when it starts with '-' (the storage tool would read that as an
    option) — about one draw in 64."""
    while True:
        candidate = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode("ascii").rstrip("=")
        if _CLUSTER_ID.fullmatch(candidate):
            return candidate


def _saved_cluster_id(data_dir: Path, log_dir: Path) -> str:
    """The data dir's cluster id, made on first use and repaired when the saved one is unusable.

    A formatted log dir records its id in meta.properties, and that one wins (the storage must keep its id).
    Otherwise a saved id that starts with '-' or is not 22 base64url characters (earlier versions could
    save such ids, and the storage tool then refused to format the dir) is replaced by a fresh one.
    """
    cluster_file = data_dir / "cluster.id"
    formatted = _formatted_cluster_id(log_dir)
    saved = cluster_file.read_text(encoding="utf-8").strip() if cluster_file.exists() else None
    cluster_id = formatted or (saved if saved and _CLUSTER_ID.fullmatch(saved) else _cluster_id())
    if cluster_id != saved:
        cluster_file.write_text(cluster_id, encoding="utf-8")
    return cluster_id


def _formatted_cluster_id(log_dir: Path) -> str | None:
    meta = log_dir / "meta.properties"
    try:
        lines = meta.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError):
        return None
    for line in lines:
        key, _, value = line.partition("=")
        if key.strip() == "cluster.id" and _CLUSTER_ID.fullmatch(value.strip()):
            return value.strip()
    return None


def _accepts_connections(port: int) -> bool:
    with contextlib.closing(socket.socket(socket.AF_INET, socket.SOCK_STREAM)) as sock:
        sock.settimeout(0.5)
        return sock.connect_ex(("127.0.0.1", port)) == 0


@contextlib.contextmanager
def running_broker(
    port: int | None = None,
    data_dir: Path | None = None,
    *,
    secure: bool = False,
    app_id: str | None = None,
    settings: Mapping[str, str] | None = None,
) -> Iterator[LocalKafka]:
    """A broker for the duration of a `with` block (`settings`: more server.properties, as `start_broker`)."""
    broker = start_broker(port, data_dir, secure=secure, app_id=app_id, settings=settings)
    try:
        yield broker
    finally:
        broker.stop()
