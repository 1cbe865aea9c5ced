"""Shorter Kafka fetch long-polls for the worker's consumer (measured: bench/worker_bench.py, docs/benchmarks.md).

faust-streaming 0.15 creates its consumer with a hard-coded `fetch_max_wait_ms=1500`. aiokafka leaves a
partition whose fetched records are not yet consumed out of the next fetch request, so under load a record
produced to such a partition can wait for a long-poll on the *other* partitions to time out: each hop of the
route procedure (command -> outcome -> next command) then took about a second. A short long-poll bounds that
wait; the cost is more (empty) fetch requests while idle. This is the only place that touches Faust's
internals, and it fails loudly if the hook it wraps disappears in another Faust version.
"""

from __future__ import annotations

from functools import wraps
from typing import Any

from faust.transport.drivers.aiokafka import AIOKafkaConsumerThread

FETCH_MAX_WAIT_MS = 50

_original = AIOKafkaConsumerThread._create_worker_consumer


def install(fetch_max_wait_ms: int = FETCH_MAX_WAIT_MS) -> None:
    """Make every Faust worker consumer created from now on use `fetch_max_wait_ms` (idempotent)."""

    @wraps(_original)
    def create(self: Any, *args: Any, **kwargs: Any) -> Any:
        consumer = _original(self, *args, **kwargs)
        if not hasattr(consumer, "_fetch_max_wait_ms"):
            raise RuntimeError("aiokafka consumer has no _fetch_max_wait_ms: revisit streams/worker/fetch_latency.py")
        consumer._fetch_max_wait_ms = fetch_max_wait_ms
        return consumer

    AIOKafkaConsumerThread._create_worker_consumer = create  # type: ignore[method-assign]
