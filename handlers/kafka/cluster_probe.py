"""Whether the Kafka cluster answers right now, for a worker's `/healthz` (DESIGN §3).

The probe has an admin client of its own: the partition reader's clients are held, under their lock, for as long
as a gap read or an offset lookup takes (up to 30 s while the broker is away), and a probe queued behind them
kept `/healthz` at 503 long after the broker was back. One dead broker of several is not "the cluster is
unreachable": the admin client sends each request to a random known broker, and a broker that was just killed
stays known until the controller fences it, so a failed request is sent again (to another broker) until the
caller's deadline.
"""

from __future__ import annotations

import asyncio
import contextlib

from aiokafka.admin import AIOKafkaAdminClient

from handlers.kafka.security import client_options

RETRY_S = 0.05


class ClusterProbe:
    """`answer()` returns once some broker answered a metadata request; the caller bounds it with a timeout."""

    def __init__(self, bootstrap: str, *, request_timeout_ms: int = 2000) -> None:
        self.bootstrap = bootstrap
        self._request_timeout_ms = request_timeout_ms
        self._admin: AIOKafkaAdminClient | None = None

    async def answer(self) -> None:
        while True:
            try:
                admin = await self._client()
                await admin.describe_cluster()
                return
            except Exception:
                await asyncio.sleep(RETRY_S)  # then another attempt (another broker), bounded by the caller

    async def _client(self) -> AIOKafkaAdminClient:
        if self._admin is None:
            admin = AIOKafkaAdminClient(
                bootstrap_servers=self.bootstrap, request_timeout_ms=self._request_timeout_ms, **client_options()
            )
            try:
                await admin.start()
            except BaseException:
                with contextlib.suppress(Exception):
                    await admin.close()
                raise
            self._admin = admin
        return self._admin

    async def close(self) -> None:
        admin, self._admin = self._admin, None
        if admin is not None:
            with contextlib.suppress(Exception):
                await admin.close()
