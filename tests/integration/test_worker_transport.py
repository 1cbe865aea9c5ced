"""The worker's Kafka transport (streams/worker/transport.py) is the one Faust uses, with its long-poll: short while a
partition is left out of the fetch request, long while none is."""

from __future__ import annotations

import struct
from pathlib import Path
from types import SimpleNamespace

from aiokafka import TopicPartition
from aiokafka.protocol.types import Int32
from faust.transport import by_url

from streams.worker.transport import (
    FETCH_MAX_WAIT_MS,
    IDLE_FETCH_MAX_WAIT_MS,
    SCHEME,
    Consumer,
    ConsumerThread,
    LongPoll,
    Transport,
)
from tests.integration.test_consumer_gaps import worker_app


def test_faust_finds_the_transport_by_its_registered_scheme() -> None:
    assert by_url(f"{SCHEME}://127.0.0.1:9092") is Transport


async def test_the_worker_consumer_long_polls_briefly_only_while_a_partition_is_left_out(
    tmp_path: Path, app_id: str
) -> None:
    worker = worker_app(tmp_path, "127.0.0.1:9", app_id)  # nothing connects: the consumer is only built
    consumer = worker.app.consumer
    assert isinstance(worker.app.transport, Transport) and isinstance(consumer, Consumer)
    assert isinstance(consumer._thread, ConsumerThread)
    kafka_consumer = consumer._thread._create_worker_consumer(worker.app.transport)
    try:
        long_poll = kafka_consumer._fetch_max_wait_ms
        assert isinstance(long_poll, LongPoll)
        assert int(long_poll) == FETCH_MAX_WAIT_MS == 50  # not started: the short one (Faust's own is 1500)
        assert kafka_consumer._client._bootstrap_servers == ["127.0.0.1:9"]
        tp = TopicPartition(f"{app_id}.conversations", 0)
        changelog = TopicPartition(f"{app_id}-conversation_state-changelog", 0)
        kafka_consumer._subscription.assign_from_user([tp, changelog])
        kafka_consumer._fetcher = SimpleNamespace(_records={})  # what the fetcher holds, as aiokafka keeps it
        consumer._set_active_tps({tp})  # Faust consumes the source partition, not the changelog (recovered)
        assert int(long_poll) == IDLE_FETCH_MAX_WAIT_MS == 500  # every partition is in the request
        assert Int32.encode(long_poll) == struct.pack(">i", 500)  # as the fetch request packs it when it is sent
        kafka_consumer._fetcher._records[changelog] = object()  # a changelog's records wait there for good
        assert int(long_poll) == IDLE_FETCH_MAX_WAIT_MS
        kafka_consumer._fetcher._records[tp] = object()  # fetched, not consumed yet: left out of the request
        assert int(long_poll) == FETCH_MAX_WAIT_MS
        del kafka_consumer._fetcher._records[tp]
        consumer.on_buffer_full(tp)  # Faust's buffer is full: not active, yet consumed again as it drains
        kafka_consumer.pause(tp)
        assert int(long_poll) == FETCH_MAX_WAIT_MS
        consumer.on_buffer_drop(tp)
        kafka_consumer.resume(tp)
        assert int(long_poll) == IDLE_FETCH_MAX_WAIT_MS
    finally:
        kafka_consumer._fetcher = None
        await kafka_consumer.stop()
