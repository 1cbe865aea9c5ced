"""KafkaWebhookWriter's producer life, with fake producers (no broker): a write that fails because the producer is
broken retires it and the next write gets a fresh one, while a write that fails because its partition cannot take
it now (no ack in time, no leader, too few replicas) keeps it; a producer whose sender died is replaced before it
is used; the health probe answers False while no producer can be made, no partition of the topic has a reachable
leader with enough reachable in-sync replicas, or every write has been failing for a while."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from typing import Any

import pytest
from aiokafka.errors import (
    KafkaConnectionError,
    KafkaError,
    KafkaTimeoutError,
    LeaderNotAvailableError,
    NotEnoughReplicasError,
    NotLeaderForPartitionError,
    OutOfOrderSequenceNumber,
    ProducerClosed,
    ProducerFenced,
    RequestTimedOutError,
    UnknownProducerId,
)
from aiokafka.structs import PartitionMetadata

from handlers.ingress import door as door_module
from handlers.ingress.door import KafkaWebhookWriter
from tests.support.waiting import within

TOPIC = "t.conversations"


class FakeMetadata:
    """aiokafka's ClusterMetadata as far as the probe reads it: partition -> (leader, in-sync replicas), each
    partition replicated on brokers 1, 2 and 3."""

    def __init__(self, partitions: dict[int, tuple[int, tuple[int, ...]]]) -> None:
        self._partitions = {
            TOPIC: {
                p: PartitionMetadata(TOPIC, p, leader, [1, 2, 3], list(isr), None)
                for p, (leader, isr) in partitions.items()
            }
        }


def healthy() -> FakeMetadata:
    return FakeMetadata({0: (1, (1, 2)), 1: (2, (2, 1))})


@dataclass
class FakeClient:
    metadata: FakeMetadata | None = field(default_factory=healthy)
    reachable: set[int] = field(default_factory=lambda: {1, 2})
    closed: bool = False

    async def fetch_all_metadata(self) -> FakeMetadata:
        if self.metadata is None:
            raise KafkaConnectionError("down")
        return self.metadata

    async def ready(self, node_id: int) -> bool:
        return node_id in self.reachable

    async def close(self) -> None:
        self.closed = True


class FakeSender:
    def __init__(self) -> None:
        self.sender_task: asyncio.Future[None] = asyncio.get_running_loop().create_future()


class FakeProducer:
    """Does what it is told: `start_error`, `send_error`, or `hang` on send; records what was acknowledged."""

    def __init__(self, start_error: BaseException | None = None, send_error: BaseException | None = None) -> None:
        self.start_error = start_error
        self.send_error = send_error
        self.hang = False
        self.sent: list[tuple[str, bytes, bytes]] = []
        self.client = FakeClient()
        self._sender = FakeSender()
        self._closed = False

    async def start(self) -> None:
        if self.start_error is not None:
            raise self.start_error

    async def send_and_wait(self, topic: str, value: bytes, key: bytes) -> None:
        if self.hang:
            await asyncio.Event().wait()
        if self.send_error is not None:
            raise self.send_error
        self.sent.append((topic, key, value))

    async def flush(self) -> None:
        return None

    async def stop(self) -> None:
        self._closed = True


class Factory:
    def __init__(self, *producers: FakeProducer) -> None:
        self.queue = list(producers)
        self.made: list[FakeProducer] = []

    def __call__(self) -> Any:
        producer = self.queue.pop(0) if self.queue else FakeProducer()
        self.made.append(producer)
        return producer


async def no_min_isr() -> None:
    return None  # unknown: the probe requires min(2, replicas) in-sync replicas


def writer_with(factory: Factory, **kwargs: Any) -> tuple[KafkaWebhookWriter, list[str]]:
    """A writer on fake producers; its probe reads the latest producer's fake client (metadata, reachability)."""
    replaced: list[str] = []

    async def probe_client() -> FakeClient:
        return factory.made[-1].client

    writer = KafkaWebhookWriter(
        "127.0.0.1:1",
        TOPIC,
        2,
        producer_factory=factory,
        create_topic=False,
        retire_grace_s=0.05,
        on_replace=replaced.append,
        **{"read_min_isr": no_min_isr, "probe_client": probe_client, **kwargs},
    )
    return writer, replaced


@pytest.mark.parametrize(
    "error",
    [OutOfOrderSequenceNumber(), UnknownProducerId(), ProducerFenced(), ProducerClosed(), KafkaError("sender")],
    ids=lambda e: type(e).__name__,
)
async def test_a_write_the_producer_broke_replaces_it_and_the_next_write_is_acknowledged(error: Exception) -> None:
    broken = FakeProducer(send_error=error)
    factory = Factory(broken)
    writer, replaced = writer_with(factory)
    with pytest.raises(type(error)):
        await writer.write("1:2", b"first")
    await writer.write("1:2", b"second")
    assert replaced == [type(error).__name__]
    assert factory.made[1].sent == [(TOPIC, b"1:2", b"second")]
    async with within(10, "the broken producer closed in the background (its grace is 50 ms)"):
        while not (broken.client.closed and broken._closed and broken._sender.sender_task.cancelled()):
            await asyncio.sleep(0.01)  # polling interval, bounded by the deadline
    await writer.close()


@pytest.mark.parametrize(
    "error",
    [
        NotLeaderForPartitionError(),
        LeaderNotAvailableError(),
        NotEnoughReplicasError(),
        RequestTimedOutError(),
        KafkaConnectionError("reset"),
        KafkaTimeoutError(),
    ],
    ids=lambda e: type(e).__name__,
)
async def test_a_write_its_partition_could_not_take_keeps_the_producer(error: Exception) -> None:
    """A leader moving or too few replicas is the partition's state, not the producer's: a new producer would
    only make every other partition wait for its producer id."""
    busy = FakeProducer(send_error=error)
    factory = Factory(busy)
    writer, replaced = writer_with(factory)
    with pytest.raises(type(error)):
        await writer.write("1:2", b"first")
    busy.send_error = None  # the partition has a leader again
    await writer.write("1:3", b"second")
    assert replaced == [] and len(factory.made) == 1
    assert busy.sent == [(TOPIC, b"1:3", b"second")]
    await writer.close()


async def test_a_write_stuck_past_the_deadline_keeps_the_producer() -> None:
    """No ack within the door's deadline says nothing about the producer: the record stays queued in it, and the
    next webhook (another partition, or this one once its leader answers) is written by the same producer."""
    stuck = FakeProducer()
    stuck.hang = True
    factory = Factory(stuck)
    writer, replaced = writer_with(factory)
    with pytest.raises(TimeoutError):
        async with asyncio.timeout(0.05):  # the door's produce timeout
            await writer.write("1:2", b"stuck")
    stuck.hang = False
    await writer.write("1:3", b"next")
    assert replaced == [] and len(factory.made) == 1
    assert stuck.sent == [(TOPIC, b"1:3", b"next")]
    await writer.close()


async def test_a_producer_whose_sender_died_is_replaced_before_it_is_used() -> None:
    first = FakeProducer()
    factory = Factory(first)
    writer, replaced = writer_with(factory)
    await writer.write("1:2", b"a")
    first._sender.sender_task.set_exception(OutOfOrderSequenceNumber())  # aiokafka's sender gave up
    first._sender.sender_task.exception()  # retrieved, as aiokafka's own callback does
    await writer.write("1:2", b"b")
    assert [p.sent for p in factory.made] == [[(TOPIC, b"1:2", b"a")], [(TOPIC, b"1:2", b"b")]]
    assert replaced == ["KafkaError"]
    await writer.close()


async def test_concurrent_failures_on_one_producer_replace_it_once() -> None:
    broken = FakeProducer(send_error=OutOfOrderSequenceNumber())
    writer, replaced = writer_with(Factory(broken))
    results = await asyncio.gather(*(writer.write("1:2", b"x") for _ in range(5)), return_exceptions=True)
    assert all(isinstance(r, OutOfOrderSequenceNumber) for r in results)
    assert replaced == ["OutOfOrderSequenceNumber"]
    await writer.close()


async def test_an_unreachable_broker_fails_the_write_at_once_and_the_first_write_after_it_succeeds() -> None:
    factory = Factory(FakeProducer(start_error=KafkaConnectionError("refused")))
    writer, _ = writer_with(factory)
    with pytest.raises(KafkaConnectionError):
        await writer.write("1:2", b"down")
    await writer.write("1:2", b"back")  # no backoff by default: the broker is back, the door is open
    assert factory.made[1].sent == [(TOPIC, b"1:2", b"back")]
    await writer.close()


async def test_reconnect_backoff_fails_requests_in_between_at_once() -> None:
    factory = Factory(FakeProducer(start_error=KafkaConnectionError("refused")))
    writer, _ = writer_with(factory, reconnect_backoff_s=60.0)
    with pytest.raises(KafkaConnectionError):
        await writer.write("1:2", b"down")
    with pytest.raises(ConnectionError, match="backing off"):
        await writer.write("1:2", b"still down")
    assert len(factory.made) == 1
    await writer.close()


async def test_writable_while_some_partition_has_a_reachable_leader_and_in_sync_replicas() -> None:
    producer = FakeProducer()
    writer, _ = writer_with(Factory(producer), probe_cache_s=0.0, fresh_s=0.0)
    assert await writer.writable() and writer.writable_partitions == 2
    producer.client.metadata = FakeMetadata({0: (1, (1, 2)), 1: (-1, (2,))})  # partition 1 has no leader
    assert await writer.writable() and writer.writable_partitions == 1  # the door narrowed, it is not shut
    producer.client.reachable = {1}  # broker 2 died: still in partition 0's in-sync replicas until it is fenced
    assert not await writer.writable() and writer.writable_partitions == 0
    producer.client.metadata = FakeMetadata({0: (1, (1,)), 1: (1, (1,))})  # fenced, but one replica is too few
    assert not await writer.writable()
    producer.client.metadata = FakeMetadata({0: (1, (1, 3)), 1: (3, (3, 1))})  # moved to brokers 1 and 3
    producer.client.reachable = {1, 3}
    assert await writer.writable() and writer.writable_partitions == 2
    producer.client.metadata = None  # every broker is gone
    assert not await writer.writable()
    await writer.close()


async def test_writable_uses_the_topic_min_isr_when_it_can_read_it() -> None:
    producer = FakeProducer()
    producer.client.metadata = FakeMetadata({0: (1, (1,)), 1: (2, (2,))})

    async def min_isr_one() -> int:
        return 1

    writer, _ = writer_with(Factory(producer), probe_cache_s=0.0, read_min_isr=min_isr_one)
    assert await writer.writable()  # a single in-sync replica is enough for a topic with min.insync.replicas=1
    await writer.close()


class DoorClock:
    """The `time` module as the door sees it, with a monotonic clock the test moves (everything else is real)."""

    def __init__(self) -> None:
        self.now = 1000.0

    def monotonic(self) -> float:
        return self.now

    def __getattr__(self, name: str) -> Any:
        return getattr(time, name)


async def test_writable_is_false_while_every_write_keeps_failing(monkeypatch: pytest.MonkeyPatch) -> None:
    """A cluster that lost its controller quorum keeps listing every broker as leader and in sync; the writes say
    otherwise. The time the failures span is the door's clock, moved by the test: no real wait, whatever the
    machine's speed."""
    clock = DoorClock()
    monkeypatch.setattr(door_module, "time", clock)
    producer = FakeProducer(send_error=RequestTimedOutError())
    writer, _ = writer_with(Factory(producer), probe_cache_s=0.0, shut_after_s=1.0)
    assert await writer.writable()
    for step in range(3):
        with pytest.raises(RequestTimedOutError):
            await writer.write("1:2", b"x")
        clock.now += 0.4  # writes keep failing, 0.4 s apart
        if step == 0:
            assert await writer.writable()  # one failed write (0.4 s ago) does not shut the door
    assert not await writer.writable()  # every write has failed for 1.2 s, the last one 0.4 s ago
    producer.send_error = None
    await writer.write("1:2", b"y")  # an acknowledged write opens the door again at once
    assert await writer.writable()
    await writer.close()


async def test_writable_is_false_while_no_producer_can_be_made() -> None:
    factory = Factory(*(FakeProducer(start_error=KafkaConnectionError("refused")) for _ in range(3)))
    writer, _ = writer_with(factory, probe_cache_s=0.0)
    assert not await writer.writable()
    assert not await writer.writable()
    await writer.close()
