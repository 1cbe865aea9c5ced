"""Create the project's topics when they are missing (DESIGN §4), shared by the ingress and the worker.

Creating is idempotent: an existing topic is left as it is (its partition count is not changed, because
re-partitioning would move conversations between partitions and break co-partitioned state).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping

from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.errors import for_code

log = logging.getLogger(__name__)

_NO_ERROR = 0
_TOPIC_ALREADY_EXISTS = 36
_MAX_REPLICATION = 3


# the worker's tables (DESIGN §5); each is backed by a compacted changelog topic named by `changelog_topic`
TABLES = ("conversation_state", "sweep_state", "timers", "effect_attempts", "partition_configs")


def changelog_topic(app_id: str, table: str) -> str:
    """The name Faust gives a table's changelog topic."""
    return f"{app_id}-{table}-changelog"


class TopicCreationError(RuntimeError):
    """The broker refused to create a topic for a reason other than "it already exists"."""


async def ensure_topics(
    bootstrap: str,
    topics: Mapping[str, int],
    *,
    replication_factor: int | None = None,
    request_timeout_ms: int = 10_000,
    configs: Mapping[str, Mapping[str, str]] | None = None,
) -> None:
    """Create each `name -> partitions` topic that does not exist yet.

    The replication factor defaults to min(3, brokers in the cluster), so the same call serves a
    single-node development broker and a production cluster. `configs` gives a topic its topic-level settings
    (e.g. `cleanup.policy=compact` for a table's changelog). Raises on connection failure or refusal.
    """
    if not topics:
        return
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap, request_timeout_ms=request_timeout_ms)
    try:
        await admin.start()
        existing = set(await admin.list_topics())
        missing = {name: partitions for name, partitions in topics.items() if name not in existing}
        if not missing:
            return
        if replication_factor is None:
            cluster = await admin.describe_cluster()
            replication_factor = max(1, min(_MAX_REPLICATION, len(cluster["brokers"])))
        response = await admin.create_topics(
            [
                NewTopic(name, partitions, replication_factor, topic_configs=dict((configs or {}).get(name, {})))
                for name, partitions in missing.items()
            ]
        )
        for name, code, *_ in response.topic_errors:
            if code == _NO_ERROR:
                log.info("topic created", extra={"topic": name, "partitions": missing[name]})
            elif code != _TOPIC_ALREADY_EXISTS:  # lost a race with another process: fine
                raise TopicCreationError(f"cannot create topic {name}: {for_code(code).__name__}")
        await _await_leaders(admin, list(missing), request_timeout_ms / 1000)
    finally:
        await admin.close()


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
