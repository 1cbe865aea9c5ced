"""The commit barrier against Faust as it really behaves (issue 34): the real `ProducerBuffer`, whose flush is not
a barrier, and the futures every write returns."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

import pytest
from faust.transport.producer import ProducerBuffer

from handlers.worker.barrier import Barrier, BarrierBroken


class SlowHandOver(ProducerBuffer):
    """Faust's buffer whose hand-over to aiokafka takes `first_s` for its first record (a full batch whose leader
    is gone blocks `AIOKafkaProducer.send` like this) and then resolves each record's future after `ack_s`."""

    def __init__(self, first_s: float, ack_s: float = 0.0, fail: bool = False) -> None:
        super().__init__()
        self.app = SimpleNamespace(conf=SimpleNamespace(producer_threaded=False))  # type: ignore[assignment]
        self.first_s, self.ack_s, self.fail = first_s, ack_s, fail
        self.handed = 0

    async def _send_pending(self, fut: Any) -> None:
        if self.handed == 0:
            await asyncio.sleep(self.first_s)
        self.handed += 1
        asyncio.get_running_loop().call_later(self.ack_s, self._answer, fut)

    def _answer(self, fut: asyncio.Future[object]) -> None:
        if self.fail:
            fut.set_exception(RuntimeError("NotEnoughReplicas"))
        else:
            fut.set_result("acknowledged")


async def started(buffer: ProducerBuffer) -> ProducerBuffer:
    await buffer.start()
    return buffer


async def writes(buffer: ProducerBuffer, barrier: Barrier, n: int) -> list[asyncio.Future[object]]:
    futures: list[asyncio.Future[object]] = []
    for _ in range(n):
        future: asyncio.Future[object] = asyncio.get_running_loop().create_future()
        buffer.put(future)  # type: ignore[arg-type]
        barrier.add(future)
        futures.append(future)
    return futures


async def test_fausts_flush_returns_with_records_still_buffered() -> None:
    """What the barrier exists for: `ProducerBuffer.flush` gives up after one 0.1 s wait without a hand-over."""
    buffer = await started(SlowHandOver(first_s=0.5))
    try:
        futures = await writes(buffer, Barrier(), 3)
        await buffer.flush()
        assert buffer.size >= 2 and not any(f.done() for f in futures)
        await asyncio.gather(*futures)  # they do leave, later: Faust's stop would refuse a non-empty buffer
    finally:
        await buffer.stop()


async def test_the_barrier_waits_for_every_write_to_be_acknowledged() -> None:
    buffer = await started(SlowHandOver(first_s=0.5, ack_s=0.05))
    barrier = Barrier(timeout_s=10)
    try:
        futures = await writes(buffer, barrier, 3)
        assert await barrier.wait(hand_over=buffer.flush) == 3
        assert all(f.done() and f.result() == "acknowledged" for f in futures)
        assert await barrier.wait() == 0  # what was waited for is not waited for again
    finally:
        await buffer.stop()


async def test_a_failed_write_breaks_the_barrier() -> None:
    buffer = await started(SlowHandOver(first_s=0.0, fail=True))
    barrier = Barrier(timeout_s=10)
    try:
        await writes(buffer, barrier, 2)
        with pytest.raises(BarrierBroken, match="2 of 2 writes failed"):
            await barrier.wait(hand_over=buffer.flush)
    finally:
        await buffer.stop()


async def test_a_write_not_acknowledged_in_time_breaks_the_barrier() -> None:
    buffer = await started(SlowHandOver(first_s=0.0, ack_s=60))
    barrier = Barrier(timeout_s=0.3)
    try:
        await writes(buffer, barrier, 2)
        with pytest.raises(BarrierBroken, match="not acknowledged within"):
            await barrier.wait(hand_over=buffer.flush)
    finally:
        await buffer.stop()


async def test_acknowledged_futures_are_not_kept_forever() -> None:
    barrier = Barrier()
    loop = asyncio.get_running_loop()
    for _ in range(10_000):
        future: asyncio.Future[object] = loop.create_future()
        future.set_result(None)
        barrier.add(future)
    failed: asyncio.Future[object] = loop.create_future()
    failed.set_exception(RuntimeError("lost"))
    barrier.add(failed)
    assert len(barrier._pending) < 5000  # compacted, the failure kept
    with pytest.raises(BarrierBroken):
        await barrier.wait()
