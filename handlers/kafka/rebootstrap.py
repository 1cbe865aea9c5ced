"""Kafka clients that go back to the bootstrap servers when no broker they know answers (KIP-899's "rebootstrap").

aiokafka (0.14) updates its cluster metadata only from the brokers the last metadata response listed; it drops
its bootstrap connection once it has them, and never asks the bootstrap servers again (aio-libs/aiokafka#459).
A client whose last response listed a subset of the cluster — a response taken while the other brokers were
restarting or fenced — is stuck for good once that subset dies, although the rest of the cluster serves: seen on
three nodes, a rolling restart then one more node killed left the ingress answering 500 and a worker's clients
retrying the dead node for minutes. The Java client has recovered from this since Kafka 3.5
(`metadata.recovery.strategy=rebootstrap`, the default in 4.0); `install` gives every aiokafka client of this
process (the ingress's producer, Faust's consumer and producer, the admin clients) the same recovery: when a
metadata update fails from every known broker, it is asked of each bootstrap server in turn.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Iterable
from typing import Any

from aiokafka.client import AIOKafkaClient
from aiokafka.conn import create_conn
from aiokafka.errors import KafkaError
from aiokafka.protocol.metadata import MetadataRequest

log = logging.getLogger("chatwoot_router.kafka")

MetadataUpdate = Callable[[AIOKafkaClient, Any, Iterable[str]], Awaitable[bool]]
_original: MetadataUpdate | None = None


def install() -> None:
    """Patch `AIOKafkaClient._metadata_update` once per process (idempotent)."""
    global _original
    if _original is not None:
        return
    _original = AIOKafkaClient._metadata_update
    AIOKafkaClient._metadata_update = _metadata_update_or_rebootstrap


def installed() -> bool:
    return _original is not None


async def _metadata_update_or_rebootstrap(client: AIOKafkaClient, cluster_metadata: Any, topics: Iterable[str]) -> bool:
    assert _original is not None
    if await _original(client, cluster_metadata, topics):
        return True
    return await rebootstrap(client, cluster_metadata, topics)


async def rebootstrap(client: AIOKafkaClient, cluster_metadata: Any, topics: Iterable[str]) -> bool:
    """Ask each bootstrap server for the cluster's metadata; True once one answered with brokers."""
    wanted = list(topics)
    for host, port, _ in client.hosts:
        try:
            conn = await create_conn(
                host,
                port,
                client_id=client._client_id,
                request_timeout_ms=client._request_timeout_ms,
                ssl_context=client._ssl_context,
                security_protocol=client._security_protocol,
                max_idle_ms=client._connections_max_idle_ms,
                sasl_mechanism=client._sasl_mechanism,
                sasl_plain_username=client._sasl_plain_username,
                sasl_plain_password=client._sasl_plain_password,
                sasl_kerberos_service_name=client._sasl_kerberos_service_name,
                sasl_kerberos_domain_name=client._sasl_kerberos_domain_name,
                sasl_oauth_token_provider=client._sasl_oauth_token_provider,
            )
        except (TimeoutError, OSError, KafkaError):
            continue
        try:
            metadata = await conn.send(MetadataRequest(wanted or None))
        except (TimeoutError, KafkaError):
            continue
        finally:
            conn.close()
        if not metadata.brokers:
            continue
        cluster_metadata.update_metadata(metadata)
        log.warning(
            "kafka metadata taken from a bootstrap server: no broker this client knew answered",
            extra={"bootstrap": f"{host}:{port}", "brokers": len(metadata.brokers)},
        )
        return True
    return False
