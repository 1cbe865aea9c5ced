"""KafkaWebhookWriter's producer life, with fake producers (no broker): any failed write retires the producer it
used and the next write gets a fresh one; a producer whose sender died is replaced before it is used; the
health probe answers False while no producer can be made or the topic has partitions without a leader."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any

import pytest
from aiokafka.errors import (
    KafkaConnectionError,
    KafkaTimeoutError,
    OutOfOrderSequenceNumber,
    ProducerClosed,
    ProducerFenced,
    UnknownProducerId,
)

from handlers.ingress import KafkaWebhookWriter

TOPIC = "t.conversations"


@dataclass
class FakeMetadata:
    leaders: dict[int, int]

    def partitions_for_topic(self, topic: str) -> set[int] | None:
        return set(self.leaders) if topic == TOPIC else None

    def available_partitions_for_topic(self, topic: str) -> set[int] | None:
        return {p for p, leader in self.leaders.items() if leader >= 0} if topic == TOPIC else None


@dataclass
class FakeClient:
    metadata: FakeMetadata | None = field(default_factory=lambda: FakeMetadata({0: 1, 1: 1}))
    closed: bool = False

    async def fetch_all_metadata(self) -> FakeMetadata:
        if self.metadata is None:
            raise KafkaConnectionError("down")
        return self.metadata

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


def writer_with(factory: Factory, **kwargs: Any) -> tuple[KafkaWebhookWriter, list[str]]:
    replaced: list[str] = []
    writer = KafkaWebhookWriter(
        "127.0.0.1:1",
        TOPIC,
        2,
        producer_factory=factory,
        create_topic=False,
        retire_grace_s=0.05,
        on_replace=replaced.append,
        **kwargs,
    )
    return writer, replaced


@pytest.mark.parametrize(
    "error",
    [OutOfOrderSequenceNumber(), UnknownProducerId(), ProducerFenced(), ProducerClosed(), KafkaTimeoutError()],
    ids=lambda e: type(e).__name__,
)
async def test_a_failed_write_replaces_the_producer_and_the_next_write_is_acknowledged(error: Exception) -> None:
    broken = FakeProducer(send_error=error)
    factory = Factory(broken)
    writer, replaced = writer_with(factory)
    with pytest.raises(type(error)):
        await writer.write("1:2", b"first")
    await writer.write("1:2", b"second")
    assert replaced == [type(error).__name__]
    assert factory.made[1].sent == [(TOPIC, b"1:2", b"second")]
    await asyncio.sleep(0.1)  # retirement runs in the background, bounded by the grace
    assert broken.client.closed and broken._closed and broken._sender.sender_task.cancelled()
    await writer.close()


async def test_a_write_stuck_past_the_deadline_replaces_the_producer() -> None:
    stuck = FakeProducer()
    stuck.hang = True
    factory = Factory(stuck)
    writer, replaced = writer_with(factory)
    with pytest.raises(TimeoutError):
        async with asyncio.timeout(0.05):  # the door's produce timeout
            await writer.write("1:2", b"stuck")
    assert replaced == ["CancelledError"]
    await writer.write("1:2", b"fresh")
    assert factory.made[1].sent == [(TOPIC, b"1:2", b"fresh")]
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


async def test_writable_follows_writes_and_probes_metadata_after_a_failure() -> None:
    leaderless = FakeProducer(send_error=KafkaTimeoutError())
    factory = Factory(leaderless)
    writer, _ = writer_with(factory, probe_cache_s=0.0)
    assert await writer.writable()  # probe: a producer, and every partition has a leader
    with pytest.raises(KafkaTimeoutError):
        await writer.write("1:2", b"x")
    replacement = FakeProducer()
    replacement.client.metadata = FakeMetadata({0: 1, 1: -1})  # partition 1 has no leader yet
    factory.queue.append(replacement)
    assert not await writer.writable()
    replacement.client.metadata = FakeMetadata({0: 1, 1: 1})
    assert await writer.writable()
    replacement.client.metadata = None  # the broker is gone again
    assert not await writer.writable()
    await writer.write("1:2", b"y")  # a write that succeeds is proof enough, no probe needed
    assert await writer.writable()
    await writer.close()


async def test_writable_is_false_while_no_producer_can_be_made() -> None:
    factory = Factory(*(FakeProducer(start_error=KafkaConnectionError("refused")) for _ in range(3)))
    writer, _ = writer_with(factory, probe_cache_s=0.0)
    assert not await writer.writable()
    assert not await writer.writable()
    await writer.close()
