"""A Kafka client of a probe's own (connections of its own, so a long read elsewhere never delays it), started on
first use and kept: the ingress's writability probe and the worker's group-right probe."""

from __future__ import annotations

import contextlib

from aiokafka.client import AIOKafkaClient

from handlers.kafka.security import client_options


class ProbeClient:
    """The probe's own Kafka client (connections of its own), started on first use and kept."""

    def __init__(self, bootstrap: str, *, request_timeout_ms: int = 5000) -> None:
        self.bootstrap = bootstrap
        self._request_timeout_ms = request_timeout_ms
        self._client: AIOKafkaClient | None = None

    async def __call__(self) -> AIOKafkaClient:
        if self._client is None:
            client = AIOKafkaClient(
                bootstrap_servers=self.bootstrap, request_timeout_ms=self._request_timeout_ms, **client_options()
            )
            try:
                await client.bootstrap()
            except BaseException:
                with contextlib.suppress(Exception):
                    await client.close()
                raise
            self._client = client
        return self._client

    async def close(self) -> None:
        client, self._client = self._client, None
        if client is not None:
            with contextlib.suppress(Exception):
                await client.close()
