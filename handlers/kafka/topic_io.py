"""Kafka I/O outside the worker's Faust app: the durable producer and the topic reader every command uses.

- `durable_producer`: acks from all in-sync replicas and idempotence, so a record a command reports as written is
  written once (config apply, sweep, replay, rebuilds, tests).
- `group_members`: who is in a consumer group and what each member owns (`replay state` refuses to rebuild in
  place while workers run; tests check which worker owns a partition).
- `read_topic`: a topic from its beginning up to its end offsets as of the start, for small topics (`configs`)
  and tests. It never joins a consumer group and never commits: readers must not disturb the running workers.
  The readers of the event log use `handlers/logs/reader.py` (partition by partition, bounded memory).

The ingress keeps a producer of its own (handlers/ingress/door.py): its timeouts are part of the door's answer.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Callable, Collection
from contextlib import asynccontextmanager
from typing import Any

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, ConsumerRecord, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.errors import TopicAuthorizationFailedError

from handlers.kafka.security import client_options

Progress = Callable[[int, float], None]


@asynccontextmanager
async def durable_producer(bootstrap: str, **options: Any) -> AsyncIterator[AIOKafkaProducer]:
    """A started producer that waits for all in-sync replicas and never duplicates a retried send."""
    producer = AIOKafkaProducer(
        bootstrap_servers=bootstrap, acks="all", enable_idempotence=True, **client_options(), **options
    )
    await producer.start()
    try:
        yield producer
    finally:
        await producer.stop()


def raise_refused(described: Collection[dict[str, Any]]) -> None:
    """Raise the authorizer's refusal of a topic a metadata answer (`describe_topics`) holds: a topic this principal
    may not describe is not a topic that does not exist (a reader would report it empty, and `audit --verify` its
    conversations as differences); the CLI says the refusal in one line (handlers/kafka/authorization.py)."""
    refused = {d["topic"] for d in described if d["error_code"] == TopicAuthorizationFailedError.errno}
    if refused:
        raise TopicAuthorizationFailedError(refused)


async def topic_partitions(bootstrap: str, topic: str) -> list[TopicPartition]:
    """The topic's partitions, from the brokers' metadata; LookupError when the topic does not exist,
    TopicAuthorizationFailedError when this principal may not see it."""
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap, **client_options())
    await admin.start()
    try:
        described = await admin.describe_topics([topic])
    finally:
        await admin.close()
    raise_refused(described)
    partitions = [p["partition"] for d in described if d["error_code"] == 0 for p in d["partitions"]]
    if not partitions:
        raise LookupError(f"topic {topic} does not exist")
    return [TopicPartition(topic, p) for p in sorted(partitions)]


async def group_members(bootstrap: str, group: str) -> dict[str, set[tuple[str, int]]]:
    """Each member of a consumer group now and the (topic, partition)s assigned to it, keyed by its member id
    (which starts with its client id); empty when the group has no member or does not exist."""
    from aiokafka.coordinator.protocol import ConsumerProtocolMemberAssignment

    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap, **client_options())
    await admin.start()
    try:
        responses = await admin.describe_consumer_groups([group])
    finally:
        await admin.close()
    members: dict[str, set[tuple[str, int]]] = {}
    for response in responses:
        for described in response.to_object()["groups"]:
            for member in described["members"]:
                raw = member["member_assignment"]
                assigned = ConsumerProtocolMemberAssignment.decode(raw).partitions() if raw else []
                members[member["member_id"]] = {(tp.topic, tp.partition) for tp in assigned}
    return members


async def read_topic(
    bootstrap: str,
    topic: str,
    on_record: Callable[[ConsumerRecord[bytes, bytes]], None],
    *,
    progress: Progress | None = None,
    progress_every: int = 10_000,
    partitions: Collection[int] | None = None,
) -> int:
    """Feed every record of `topic` (as of now; of `partitions` only, when given) to `on_record`, partition by
    partition in offset order."""
    every = await topic_partitions(bootstrap, topic)
    assigned = [tp for tp in every if partitions is None or tp.partition in partitions]
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False, **client_options())
    await consumer.start()
    try:
        # the ends first, and only partitions with records assigned: asked after the assignment, the question waits
        # behind a fetch's long poll (half a second per read of an empty partition, such as a new app's keys)
        ends = await consumer.end_offsets(assigned)
        remaining = {tp for tp, end in ends.items() if end > 0}
        started, count = time.monotonic(), 0
        if not remaining:
            return 0
        consumer.assign(sorted(remaining))
        await consumer.seek_to_beginning(*remaining)
        while remaining:
            batches = await consumer.getmany(*remaining, timeout_ms=500)
            for tp, records in batches.items():
                for record in records:
                    if record.offset >= ends[tp]:
                        remaining.discard(tp)
                        break
                    on_record(record)
                    count += 1
                    if progress is not None and count % progress_every == 0:
                        progress(count, count / max(time.monotonic() - started, 1e-6))
                    if record.offset + 1 >= ends[tp]:
                        remaining.discard(tp)
            for tp in list(remaining):
                if await consumer.position(tp) >= ends[tp]:
                    remaining.discard(tp)
        if progress is not None:
            progress(count, count / max(time.monotonic() - started, 1e-6))
        return count
    finally:
        await consumer.stop()
