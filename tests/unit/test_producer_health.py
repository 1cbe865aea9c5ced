"""The door's reading of Kafka (handlers/ingress/producer_health.py): which failed writes break the producer, and which
partitions an acks=all write can be acknowledged on, read from aiokafka's own metadata structure."""

from __future__ import annotations

import asyncio

import pytest
from aiokafka.cluster import ClusterMetadata
from aiokafka.errors import (
    KafkaConnectionError,
    KafkaError,
    KafkaTimeoutError,
    LeaderNotAvailableError,
    NotEnoughReplicasAfterAppendError,
    NotEnoughReplicasError,
    NotLeaderForPartitionError,
    OutOfOrderSequenceNumber,
    ProducerClosed,
    ProducerFenced,
    RequestTimedOutError,
    UnknownProducerId,
)
from aiokafka.protocol.metadata import MetadataResponse_v0

from handlers.ingress.producer_health import PartitionState, breaks_producer, partition_states, writable_partitions

BROKEN = [OutOfOrderSequenceNumber(), UnknownProducerId(), ProducerFenced(), ProducerClosed(), KafkaError("sender")]
BUSY = [
    NotLeaderForPartitionError(),
    LeaderNotAvailableError(),
    NotEnoughReplicasError(),
    NotEnoughReplicasAfterAppendError(),
    RequestTimedOutError(),
    KafkaConnectionError("reset"),
    KafkaTimeoutError(),
    TimeoutError(),
    asyncio.CancelledError(),
]


@pytest.mark.parametrize("error", BROKEN, ids=lambda e: type(e).__name__)
def test_errors_that_leave_the_producer_unusable_break_it(error: BaseException) -> None:
    assert breaks_producer(error)


@pytest.mark.parametrize("error", BUSY, ids=lambda e: type(e).__name__)
def test_a_partition_that_cannot_take_a_write_now_does_not_break_the_producer(error: BaseException) -> None:
    assert not breaks_producer(error)


def test_partition_states_read_aiokafkas_cluster_metadata() -> None:
    """The probe reads the in-sync replicas from aiokafka's per-partition table (its public API has none): this
    fails when an aiokafka upgrade moves it."""
    response = MetadataResponse_v0(
        brokers=[(1, "127.0.0.1", 9092), (2, "127.0.0.1", 9093)],
        topics=[(0, "t", [(0, 0, 1, [1, 2], [1, 2]), (0, 1, -1, [1, 2], [2])])],
    )
    metadata = ClusterMetadata()
    metadata.update_metadata(response)
    assert partition_states(metadata, "t") == [
        PartitionState(0, 1, (1, 2), (1, 2)),
        PartitionState(1, -1, (1, 2), (2,)),
    ]
    assert partition_states(metadata, "other") == []


def test_a_partition_is_writable_with_its_leader_and_every_in_sync_replica_reachable() -> None:
    states = [
        PartitionState(0, 1, (1, 2, 3), (1, 2, 3)),
        PartitionState(1, 2, (1, 2, 3), (2, 3)),
        PartitionState(2, 3, (1, 2, 3), (3,)),
        PartitionState(3, -1, (1, 2, 3), (1,)),
    ]
    assert writable_partitions(states, {1, 2, 3}, 2) == {0, 1}  # 2: too few in sync; 3: no leader
    assert writable_partitions(states, {2, 3}, 2) == {1}  # broker 1 dead, still in partition 0's in-sync set
    assert writable_partitions(states, {2, 3}, 1) == {1, 2}
    assert writable_partitions(states, {1, 2, 3}, None) == {0, 1}  # unknown min ISR: min(2, replicas)
    assert writable_partitions(states, set(), 1) == set()
