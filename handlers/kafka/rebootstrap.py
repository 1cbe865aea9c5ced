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

import inspect
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


SUPPORTED_AIOKAFKA = ("0.14.",)
"""The aiokafka releases whose private parts below were read and tested (pyproject.toml pins one of them)."""
CLIENT_ATTRIBUTES = (
    "hosts",
    "_client_id",
    "_request_timeout_ms",
    "_ssl_context",
    "_security_protocol",
    "_connections_max_idle_ms",
    "_sasl_mechanism",
    "_sasl_plain_username",
    "_sasl_plain_password",
    "_sasl_kerberos_service_name",
    "_sasl_kerberos_domain_name",
    "_sasl_oauth_token_provider",
)
CONN_PARAMETERS = ("client_id", "request_timeout_ms", "ssl_context", "security_protocol", "max_idle_ms")


class InternalsChanged(RuntimeError):
    """The installed aiokafka is not the one this patch was written against: one line says what differs."""


def verify() -> None:
    """Check that the installed aiokafka has what the patch reads and replaces (its version, the method and its
    parameters, the client's private attributes, `create_conn`'s parameters); raise `InternalsChanged` otherwise."""
    import aiokafka

    version = getattr(aiokafka, "__version__", "?")
    if not version.startswith(SUPPORTED_AIOKAFKA):
        raise InternalsChanged(f"aiokafka {version} is installed; the rebootstrap patch supports {SUPPORTED_AIOKAFKA}")
    method = _original or getattr(AIOKafkaClient, "_metadata_update", None)  # aiokafka's own, patched or not
    if method is None or list(inspect.signature(method).parameters)[1:] != ["cluster_metadata", "topics"]:
        raise InternalsChanged("aiokafka's AIOKafkaClient._metadata_update is not (self, cluster_metadata, topics)")
    missing = [p for p in CONN_PARAMETERS if p not in inspect.signature(create_conn).parameters]
    if missing:
        raise InternalsChanged(f"aiokafka's create_conn takes no {', '.join(missing)}")
    source = inspect.getsource(AIOKafkaClient)  # a client needs a running loop to exist: read what it sets
    missing = [n for n in CLIENT_ATTRIBUTES if not hasattr(AIOKafkaClient, n) and f"self.{n} =" not in source]
    if missing:
        raise InternalsChanged(f"aiokafka's AIOKafkaClient has no {', '.join(missing)}")


def install() -> None:
    """Check the installed aiokafka (`verify`), then patch `AIOKafkaClient._metadata_update` once per process
    (idempotent)."""
    global _original
    if _original is not None:
        return
    verify()
    _original = AIOKafkaClient._metadata_update
    AIOKafkaClient._metadata_update = _metadata_update_or_rebootstrap


def installed() -> bool:
    return _original is not None


async def _metadata_update_or_rebootstrap(client: AIOKafkaClient, cluster_metadata: Any, topics: Iterable[str]) -> bool:
    assert _original is not None
    if await _original(client, cluster_metadata, topics):
        return True
    try:
        return await rebootstrap(client, cluster_metadata, topics)
    except Exception as exc:  # this runs inside aiokafka's metadata task: an escape would end that task for good
        log.warning("rebootstrap failed", extra={"error_type": type(exc).__name__})
        return False


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
