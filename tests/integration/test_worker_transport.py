"""The worker's Kafka transport (streams/worker/transport.py) is the one Faust uses, with its short long-poll."""

from __future__ import annotations

from pathlib import Path

from faust.transport import by_url

from streams.worker.transport import FETCH_MAX_WAIT_MS, SCHEME, Consumer, ConsumerThread, Transport
from tests.integration.test_consumer_gaps import worker_app


def test_faust_finds_the_transport_by_its_registered_scheme() -> None:
    assert by_url(f"{SCHEME}://127.0.0.1:9092") is Transport


async def test_the_worker_consumer_long_polls_for_at_most_fetch_max_wait_ms(tmp_path: Path, app_id: str) -> None:
    worker = worker_app(tmp_path, "127.0.0.1:9", app_id)  # nothing connects: the consumer is only built
    consumer = worker.app.consumer
    assert isinstance(worker.app.transport, Transport) and isinstance(consumer, Consumer)
    assert isinstance(consumer._thread, ConsumerThread)
    kafka_consumer = consumer._thread._create_worker_consumer(worker.app.transport)
    try:
        assert kafka_consumer._fetch_max_wait_ms == FETCH_MAX_WAIT_MS == 50  # Faust's own default is 1500
        assert kafka_consumer._client._bootstrap_servers == ["127.0.0.1:9"]
    finally:
        await kafka_consumer.stop()
