"""Which errors make a stopped worker start again in its own process (a broker fault) and which make it exit."""

from __future__ import annotations

import errno

import pytest
from aiokafka.errors import KafkaConnectionError, KafkaTimeoutError, NodeNotReadyError, NotLeaderForPartitionError

from streams.worker_cmd import is_broker_fault


@pytest.mark.parametrize(
    "error",
    [
        NodeNotReadyError("node 3"),
        KafkaTimeoutError(),
        KafkaConnectionError("closed"),
        NotLeaderForPartitionError(),
        ConnectionRefusedError(errno.ECONNREFUSED, "refused"),
        TimeoutError(),
    ],
)
def test_a_kafka_or_connection_error_is_the_brokers_fault(error: BaseException) -> None:
    assert is_broker_fault(error)


@pytest.mark.parametrize(
    "error",
    [
        None,  # stopped without an error
        OSError(errno.EADDRINUSE, "address already in use"),  # the web port: the operator's to fix, so an exit
        ValueError("a bug"),
        PermissionError(errno.EACCES, "the data dir"),
    ],
)
def test_anything_else_makes_the_worker_exit(error: BaseException | None) -> None:
    assert not is_broker_fault(error)
