"""What the door makes of Kafka's answers (DESIGN §3 `/healthz`, §9): whether a failed write broke its producer,
and which partitions an `acks=all` write can be acknowledged on right now.

**Broken producer or busy partition.** A write can fail because the producer itself is unusable — an idempotent
producer whose sequence broke (`OutOfOrderSequenceNumber`, `UnknownProducerId`), a fenced or closed one, a sender
that died — or because one partition cannot take a write at the moment: no leader (`NotLeaderForPartition`,
`LeaderNotAvailable`), too few in-sync replicas (`NotEnoughReplicas`), a request that timed out, or simply no ack
within the door's deadline. Only the first kind is cured by a new producer. The second kind is not the
producer's fault, and replacing it costs every partition: a new idempotent producer must first get a producer id
(`InitProducerId`, sent to a random known broker, which may be the dead one) and the retired producer's records
in flight for healthy partitions are dropped. So those keep the producer: aiokafka retries the record (in order,
idempotently) and delivers it once the partition has a leader again.

**Writable partitions.** With `acks=all` a leader acknowledges a record once every replica in its in-sync set
has it, so a partition is writable only while its leader *and* every in-sync replica are reachable and there are
at least `min.insync.replicas` of them. A broker that died stays in the in-sync sets (and in the metadata) until
the controller fences it (`broker.session.timeout.ms`, 9 s by default): until then no partition it replicates
takes an `acks=all` write, whoever leads it.

The probe uses a client of its own: a broker answers the requests of one connection in order, so a metadata
request sent on the producer's connection would queue behind a produce request that waits for a dead replica.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.admin.config_resource import ConfigResource, ConfigResourceType
from aiokafka.errors import KafkaError, KafkaTimeoutError

from handlers.kafka.security import client_options

MIN_ISR = "min.insync.replicas"


def breaks_producer(error: BaseException) -> bool:
    """True when a failed write leaves the producer unusable (replace it); False when it only says that a
    partition cannot take a write right now (keep it)."""
    if isinstance(error, asyncio.CancelledError | TimeoutError):
        return False  # the caller's deadline: the record stays queued in the producer, nothing is known broken
    if isinstance(error, KafkaTimeoutError):
        return False  # aiokafka gave up waiting for metadata or for room in a partition's batch
    if isinstance(error, KafkaError):
        return not error.retriable  # leader moves, too few replicas, timeouts, connections: a partition's state
    return True  # anything else (a bug, a closed client) is not worth trusting the producer with


@dataclass(frozen=True)
class PartitionState:
    """One partition of the topic as the metadata describes it."""

    partition: int
    leader: int
    replicas: tuple[int, ...]
    isr: tuple[int, ...]


def partition_states(metadata: Any, topic: str) -> list[PartitionState]:
    """The topic's partitions from aiokafka's `ClusterMetadata` (its public API has leaders but no ISR)."""
    table = getattr(metadata, "_partitions", {}).get(topic, {})
    return [
        PartitionState(p.partition, p.leader, tuple(p.replicas), tuple(p.isr))
        for p in sorted(table.values(), key=lambda p: p.partition)
    ]


def nodes_involved(states: Iterable[PartitionState]) -> set[int]:
    """Every broker whose reachability decides whether some partition is writable."""
    return {node for state in states for node in (state.leader, *state.isr) if node >= 0}


def writable_partitions(states: Iterable[PartitionState], reachable: set[int], min_isr: int | None) -> set[int]:
    """Partitions an acks=all write can be acknowledged on: a reachable leader, every in-sync replica reachable,
    and at least `min_isr` of them (when unknown: min(2, replicas), the router's own topic setting)."""
    writable = set()
    for state in states:
        required = min_isr if min_isr is not None else min(2, len(state.replicas))
        if (
            state.leader >= 0
            and state.leader in reachable
            and state.leader in state.isr
            and set(state.isr) <= reachable
            and len(state.isr) >= required
        ):
            writable.add(state.partition)
    return writable


async def writable_now(client: Any, topic: str, min_isr: int | None) -> set[int]:
    """The partitions of `topic` writable now, from `client`'s fresh metadata and its reachability of each broker
    involved (aiokafka's `AIOKafkaClient`: `fetch_all_metadata()` and `ready(node_id)`)."""
    states = partition_states(await client.fetch_all_metadata(), topic)
    nodes = sorted(nodes_involved(states))
    answers = await asyncio.gather(*(client.ready(node) for node in nodes))
    return writable_partitions(states, {node for node, ready in zip(nodes, answers, strict=True) if ready}, min_isr)


async def topic_min_isr(bootstrap: str, topic: str, *, request_timeout_ms: int = 5000) -> int | None:
    """The topic's `min.insync.replicas` (its own or the broker default), None when it cannot be read."""
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap, request_timeout_ms=request_timeout_ms, **client_options())
    try:
        await admin.start()
        responses = await admin.describe_configs([ConfigResource(ConfigResourceType.TOPIC, topic, {MIN_ISR: None})])
    except Exception:
        return None
    finally:
        with contextlib.suppress(Exception):
            await admin.close()
    for response in responses:
        for error_code, _, _, name, entries in response.resources:
            if error_code != 0 or name != topic:
                continue
            for entry in entries:
                if entry[0] == MIN_ISR and str(entry[1]).isdigit():
                    return int(entry[1])
    return None
