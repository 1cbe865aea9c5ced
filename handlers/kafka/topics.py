"""Create the project's topics with the settings they need, and check the ones that exist (DESIGN §4).

Which settings each topic gets, and what counts as wrong, is `projections.topic_settings` (pure); this module
talks to the brokers. Creating is idempotent: an existing topic is left as it is (its partition count is not
changed, because re-partitioning would move conversations between partitions and break co-partitioned state).
The ingress, the workers and `replay state` check the existing topics at start (`log_topic_findings`: one log
line per finding, never an exception); `chatwoot-router topics [--fix]` prints and corrects them.

The erasure deadline (`max.compaction.lag.ms` of `<app>.keys`) is ROUTER_ERASURE_DEADLINE_MS: creating, inspecting
and checking read it from the environment unless the caller passes it (`erasure_deadline_ms`), so every process
creates and checks `keys` with the same value without each passing it along.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Mapping
from dataclasses import dataclass

from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.admin.config_resource import ConfigResource, ConfigResourceType
from aiokafka.errors import KafkaError, for_code

from handlers.kafka.alter_configs import set_topic_configs
from handlers.kafka.security import client_options
from handlers.kafka.topic_io import raise_refused
from projections.topic_settings import (
    MAX_COMPACTION_LAG,
    TABLES,
    WORKER_KINDS,
    Finding,
    Kind,
    TopicState,
    app_topics,
    changelog_topic,
    check_topics,
    kind_of,
    leader_topic,
    replication_for,
    topic_configs,
)
from schemas.config import read_env

__all__ = [
    "TABLES",
    "TopicCreationError",
    "TopicReport",
    "app_topic_partitions",
    "changelog_topic",
    "configured_erasure_deadline_ms",
    "ensure_app_topics",
    "ensure_topics",
    "existing_topics",
    "fix_topics",
    "inspect_topics",
    "keys_compaction_lag_ms",
    "log_topic_findings",
]

log = logging.getLogger("chatwoot_router.topics")

_NO_ERROR = 0
_TOPIC_ALREADY_EXISTS = 36
START_CHECK_TIMEOUT_S = 10.0
"""How long a starting process spends on the topic check before it starts without it."""


ERASURE_DEADLINE_VARIABLE = "ROUTER_ERASURE_DEADLINE_MS"


def configured_erasure_deadline_ms(environ: Mapping[str, str] | None = None) -> int:
    """ROUTER_ERASURE_DEADLINE_MS of the environment (os.environ by default), validated as every command validates
    it at start (a bad value is a ConfigError naming the variable); 7 days when unset."""
    env = os.environ if environ is None else environ
    given = env.get(ERASURE_DEADLINE_VARIABLE)
    return read_env({ERASURE_DEADLINE_VARIABLE: given} if given is not None else {}).erasure_deadline_ms


class TopicCreationError(KafkaError):
    """The broker refused to create a topic for a reason other than "it already exists"; `error` is why (a
    KafkaError itself, so every command's Kafka failure line covers it)."""

    def __init__(self, name: str, error: KafkaError) -> None:
        self.error = error
        super().__init__(f"cannot create topic {name}: {type(error).__name__}")


async def ensure_topics(
    bootstrap: str,
    topics: Mapping[str, int],
    *,
    replication_factor: int | None = None,
    request_timeout_ms: int = 10_000,
    configs: Mapping[str, Mapping[str, str]] | None = None,
    log_retention_ms: int | None = None,
    erasure_deadline_ms: int | None = None,
) -> None:
    """Create each `name -> partitions` topic that does not exist yet, with the router's settings for its kind.

    The replication factor defaults to min(3, brokers in the cluster), so the same call serves a single-node
    development broker and a production cluster; `min.insync.replicas` follows it. `log_retention_ms` is
    ROUTER_LOG_RETENTION_MS (None: the event log is kept forever); `erasure_deadline_ms` is ROUTER_ERASURE_DEADLINE_MS
    (None: read from the environment). `configs` adds or overrides topic-level settings per topic. Raises on
    connection failure or refusal.
    """
    if not topics:
        return
    deadline_ms = erasure_deadline_ms if erasure_deadline_ms is not None else configured_erasure_deadline_ms()
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap, request_timeout_ms=request_timeout_ms, **client_options())
    try:
        await admin.start()
        existing = set(await admin.list_topics())
        missing = {name: partitions for name, partitions in topics.items() if name not in existing}
        if not missing:
            return
        if replication_factor is None:
            cluster = await admin.describe_cluster()
            replication_factor = replication_for(len(cluster["brokers"]))
        new = []
        for name, partitions in missing.items():
            settings = topic_configs(kind_of(name), replication_factor, log_retention_ms, deadline_ms)
            settings.update((configs or {}).get(name, {}))
            new.append(NewTopic(name, partitions, replication_factor, topic_configs=settings))
        response = await admin.create_topics(new)
        for name, code, *_ in response.topic_errors:
            if code == _NO_ERROR:
                log.info("topic created", extra={"topic": name, "partitions": missing[name]})
            elif code != _TOPIC_ALREADY_EXISTS:  # lost a race with another process: fine
                raise TopicCreationError(name, for_code(code)())
        await _await_leaders(admin, list(missing), request_timeout_ms / 1000)
    finally:
        await admin.close()


def app_topic_partitions(app_id: str, partitions: int) -> dict[str, int]:
    """Every topic a worker of the app uses, with its partition count (`configs` has one partition), Faust's own
    included: its tables' changelogs and its leader topic (one partition, as Faust declares it). A worker with only
    its role's ACLs (no Create, projections/acls) starts only when all of them exist."""
    counts = {f"{app_id}.{kind.value}": partitions for kind in WORKER_KINDS}
    counts[f"{app_id}.{Kind.CONFIGS.value}"] = 1
    counts.update({changelog_topic(app_id, table): partitions for table in TABLES})
    counts[leader_topic(app_id)] = 1
    return counts


async def ensure_app_topics(
    bootstrap: str, app_id: str, partitions: int, *, log_retention_ms: int | None = None
) -> None:
    """Create whatever the app lacks of its topics, changelogs and Faust's leader topic, exactly as a starting
    worker does (an administrator's `config apply` and `topics --fix` run it, so workers need no Create).

    The changelogs are created here, before Faust starts, because Faust's own creation can lose a race with its
    first assignment ("Ignoring missing topic"), after which every write to that table fails (PartitionsMismatch).
    """
    await ensure_topics(bootstrap, app_topic_partitions(app_id, partitions), log_retention_ms=log_retention_ms)


async def existing_topics(bootstrap: str, names: list[str], *, request_timeout_ms: int = 10_000) -> set[str]:
    """Which of `names` exist (and this client may see: Describe)."""
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap, request_timeout_ms=request_timeout_ms, **client_options())
    try:
        await admin.start()
        return set(await admin.list_topics()) & set(names)
    finally:
        await admin.close()


@dataclass(frozen=True)
class TopicReport:
    """The app's topics as the brokers describe them, and what is wrong with them."""

    app_id: str
    brokers: int
    topics: dict[str, TopicState]
    findings: list[Finding]

    def missing(self) -> list[str]:
        return [name for name in app_topics(self.app_id) if name not in self.topics]


async def inspect_topics(
    bootstrap: str,
    app_id: str,
    log_retention_ms: int | None = None,
    *,
    request_timeout_ms: int = 10_000,
    erasure_deadline_ms: int | None = None,
) -> TopicReport:
    """Describe every topic of the app (partitions, replicas, effective settings) and check it
    (`erasure_deadline_ms` None: ROUTER_ERASURE_DEADLINE_MS of the environment)."""
    deadline_ms = erasure_deadline_ms if erasure_deadline_ms is not None else configured_erasure_deadline_ms()
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap, request_timeout_ms=request_timeout_ms, **client_options())
    try:
        await admin.start()
        brokers = len((await admin.describe_cluster())["brokers"])
        states = await _describe(admin, list(app_topics(app_id)))
    finally:
        await admin.close()
    findings = check_topics(app_id, states, brokers, log_retention_ms, deadline_ms)
    return TopicReport(app_id, brokers, states, findings)


async def fix_topics(
    bootstrap: str, changes: Mapping[str, Mapping[str, str]], *, request_timeout_ms: int = 10_000
) -> dict[str, str]:
    """Set the given settings in place (incremental alter configs); returns topic -> error for refusals."""
    if not changes:
        return {}
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap, request_timeout_ms=request_timeout_ms, **client_options())
    try:
        await admin.start()
        return await set_topic_configs(admin, changes)
    finally:
        await admin.close()


async def log_topic_findings(
    bootstrap: str,
    app_id: str,
    log_retention_ms: int | None = None,
    *,
    timeout_s: float = START_CHECK_TIMEOUT_S,
    logger: logging.Logger = log,
    erasure_deadline_ms: int | None = None,
) -> list[Finding]:
    """The start-up check: one warning per finding (topic, setting, value, fix); never raises, never blocks long.

    A process starts whatever the check finds: the findings are the operator's to fix (`topics --fix`).
    """
    try:
        async with asyncio.timeout(timeout_s):
            report = await inspect_topics(bootstrap, app_id, log_retention_ms, erasure_deadline_ms=erasure_deadline_ms)
    except Exception as exc:  # a broker not reachable yet: the process starts, the next start checks again
        logger.warning("topic settings not checked", extra={"app_id": app_id, "error_type": type(exc).__name__})
        return []
    for finding in report.findings:
        logger.warning(
            "topic setting needs a fix",
            extra={
                "topic": finding.topic,
                "setting": finding.setting,
                "value": finding.value,
                "wanted": finding.wanted,
                "why": finding.why,
                "fix": finding.fix,
                "risk": finding.risk,
            },
        )
    return report.findings


async def keys_compaction_lag_ms(bootstrap: str, app_id: str, *, request_timeout_ms: int = 10_000) -> int | None:
    """The `max.compaction.lag.ms` the brokers apply to `<app>.keys` (None: the topic does not exist or has no
    number there): what bounds, in fact, how long an erased key stays on their disks."""
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap, request_timeout_ms=request_timeout_ms, **client_options())
    try:
        await admin.start()
        states = await _describe(admin, [f"{app_id}.{Kind.KEYS.value}"])
    finally:
        await admin.close()
    for state in states.values():
        try:
            return int(state.configs.get(MAX_COMPACTION_LAG) or "")
        except ValueError:
            return None
    return None


async def _describe(admin: AIOKafkaAdminClient, names: list[str]) -> dict[str, TopicState]:
    """The named topics that exist, with partitions, the fewest replicas of a partition and effective configs."""
    answer = await admin.describe_topics(names)
    raise_refused(answer)  # not "missing": `topics` would report it so, and `--fix` try to create it
    described = {
        topic["topic"]: topic["partitions"]
        for topic in answer
        if topic["error_code"] == _NO_ERROR and topic["partitions"]
    }
    if not described:
        return {}
    resources = [ConfigResource(ConfigResourceType.TOPIC, name) for name in described]
    configs: dict[str, dict[str, str | None]] = {}
    for response in await admin.describe_configs(resources):
        for resource in response.to_object()["resources"]:
            if resource["error_code"] != _NO_ERROR:
                raise for_code(resource["error_code"])(f"describe configs of {resource['resource_name']}")
            configs[resource["resource_name"]] = {
                entry["config_names"]: entry["config_value"] for entry in resource["config_entries"]
            }
    return {
        name: TopicState(
            name=name,
            partitions=len(partitions),
            replication=min(len(p["replicas"]) for p in partitions),
            configs=configs.get(name, {}),
        )
        for name, partitions in described.items()
    }


async def _await_leaders(admin: AIOKafkaAdminClient, names: list[str], timeout_s: float) -> None:
    """Wait until every partition of the new topics has a leader, so first writes do not bounce."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    delay = 0.05
    while True:
        described = await admin.describe_topics(names)
        if len(described) == len(names) and all(
            topic["error_code"] == _NO_ERROR
            and topic["partitions"]
            and all(p["leader"] >= 0 for p in topic["partitions"])
            for topic in described
        ):
            return
        if loop.time() + delay > deadline:
            log.warning("topic leaders not yet elected", extra={"topics": names})
            return
        await asyncio.sleep(delay)  # metadata poll with backoff
        delay = min(delay * 2, 0.5)
