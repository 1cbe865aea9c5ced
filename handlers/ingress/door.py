"""The webhook door: aiohttp app for `POST /chatwoot/agent-bot`, `GET /healthz`, `GET /metrics` (DESIGN §3).

The pure decision is `projections.webhook.evaluate`; this module adds the HTTP order of behavior.md §3.2
(body limit first, then settings), and makes an accepted event durable in Kafka before answering 200
(Decisions 6). When Kafka cannot take the record within `produce_timeout_s` (ROUTER_PRODUCE_TIMEOUT_MS,
default 1 s) the answer is 500, which Chatwoot retries with the same delivery id. A record whose write was
still in flight when we gave up may land later; the router's job merge makes that duplicate harmless.

Odd but signed input is the request's problem, never the broker's: a delivery id that is not printable ASCII
of at most 200 characters is treated as absent, lone surrogates in any text of the record become U+FFFD, and
a record that still cannot be serialised is a 400. Connection limits (read deadline, idle timeout, cap) are in
`handlers.ingress.connections`; operations are described in docs/operations.md.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import re
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, Protocol

from aiohttp import web
from aiokafka import AIOKafkaProducer
from aiokafka.errors import KafkaError
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from handlers.ingress.connections import DEFAULT_READ_TIMEOUT_S, ConnectionGuard, start_guarded
from handlers.ingress.producer_health import breaks_producer, topic_min_isr, writable_now
from handlers.kafka.authorization import refusal_reason
from handlers.kafka.probe_client import ProbeClient
from handlers.kafka.security import auth_reason, client_options
from handlers.kafka.topics import ensure_topics
from handlers.logging_setup import log_line
from projections.acls import Operation
from projections.webhook import (
    MAX_BODY_BYTES,
    TIMESTAMP_TOLERANCE_S,
    Outcome,
    conversation_of,
    evaluate,
    parse_json,
    signing_account,
)
from schemas.config import ConfigError, RouterEnv, Settings, load_settings, read_env
from schemas.records import WebhookReceived

log = logging.getLogger("chatwoot_router.ingress")

WEBHOOK_PATH = "/chatwoot/agent-bot"
DEFAULT_PRODUCE_TIMEOUT_S = 1.0
"""ROUTER_PRODUCE_TIMEOUT_MS's default: a webhook Kafka cannot take gets 500 within a second."""

# outcome label -> (status, body); JSON bodies are compact, exactly as the earlier router wrote them
_RESPONSES: dict[str, tuple[int, str]] = {
    Outcome.ACCEPTED: (200, '{"ok":true}'),
    Outcome.IGNORED: (200, '{"ok":true,"ignored":true}'),
    Outcome.STALE_TIMESTAMP: (401, "invalid or stale timestamp"),
    Outcome.BAD_SIGNATURE: (401, "invalid signature"),
    Outcome.BAD_REQUEST: (400, "bad request"),
    Outcome.FORBIDDEN: (403, "account does not match the webhook secret"),
    "payload_too_large": (413, "payload too large"),
    "read_timeout": (408, "request timeout"),
    "unreadable_body": (400, "bad request"),
    "settings_error": (500, "internal error"),
    "not_durable": (500, "internal error"),
    "not_found": (404, "not found"),
}


def wall_clock_ms() -> int:
    return time.time_ns() // 1_000_000


class WebhookWriter(Protocol):
    """Makes one record durable; raises when it cannot. `writable()` feeds /healthz."""

    async def write(self, key: str, value: bytes) -> None: ...

    async def writable(self) -> bool: ...

    async def close(self) -> None: ...


class KafkaUnavailable(ConnectionError):
    """No producer could be made just now (the broker is unreachable, or a reconnect is backing off)."""


class KafkaWebhookWriter:
    """Idempotent, acks=all producer to the conversations topic, connected lazily and replaced when it breaks.

    Kafka may be down when the ingress starts or at any time later, or lose one broker of several. A write that
    fails because the producer is unusable (`handlers.ingress.producer_health.breaks_producer`: a broken idempotent
    sequence such as `OutOfOrderSequenceNumber` or `UnknownProducerId`, a fenced or closed producer) retires
    it: the producer is closed in the background (its in-flight records get `retire_grace_s` to land, then it
    is aborted) and the next write creates a fresh idempotent producer, which has none of that state; so does a
    producer whose sender task died. A write that fails because its partition cannot take it right now (no
    ack within the caller's deadline, no leader, too few in-sync replicas) keeps the producer: that webhook
    gets its 500 and the others, on partitions whose leaders answer, go on being acknowledged.
    While the broker is unreachable each request tries to connect (concurrent requests share one attempt; a
    refused connection fails at once), so the first request after the broker is back gets a 200;
    `reconnect_backoff_s` can space attempts out, failing requests in between at once (500).
    """

    def __init__(
        self,
        bootstrap: str,
        topic: str,
        partitions: int,
        *,
        request_timeout_ms: int = 5000,
        connect_timeout_s: float = 5.0,
        retire_grace_s: float = 1.0,
        reconnect_backoff_s: float = 0.0,
        probe_timeout_s: float = 1.0,
        probe_cache_s: float = 0.25,
        fresh_s: float = 0.25,
        shut_after_s: float = 1.0,
        min_isr_max_age_s: float = 60.0,
        on_replace: Callable[[str], None] | None = None,
        producer_factory: Callable[[], AIOKafkaProducer] | None = None,
        create_topic: bool = True,
        read_min_isr: Callable[[], Awaitable[int | None]] | None = None,
        probe_client: Callable[[], Awaitable[Any]] | None = None,
    ) -> None:
        self.bootstrap = bootstrap
        self.topic = topic
        self.partitions = partitions
        self._request_timeout_ms = request_timeout_ms
        self._connect_timeout_s = connect_timeout_s
        self._retire_grace_s = retire_grace_s
        self._reconnect_backoff_s = reconnect_backoff_s
        self._probe_timeout_s = probe_timeout_s
        self._probe_cache_s = probe_cache_s
        self._fresh_s = fresh_s
        self._shut_after_s = shut_after_s
        self._min_isr_max_age_s = min_isr_max_age_s
        self._on_replace = on_replace
        self._producer_factory = producer_factory or self._new_producer
        self._read_min_isr = read_min_isr or (
            lambda: topic_min_isr(self.bootstrap, self.topic, request_timeout_ms=self._request_timeout_ms)
        )
        self._own_probe_client = ProbeClient(bootstrap, request_timeout_ms=request_timeout_ms)
        self._probe_client = probe_client or self._own_probe_client
        self._producer: AIOKafkaProducer | None = None
        self._connecting: asyncio.Task[AIOKafkaProducer] | None = None
        self._connect_failed_at: float | None = None
        self._topic_ready = not create_topic
        self._last_success: float | None = None
        self._last_failure: float | None = None
        self._failing_since: float | None = None  # the first failed write since the last acknowledged one
        self._min_isr: tuple[float, int | None] | None = None  # (read at, the topic's min.insync.replicas)
        self._probe: asyncio.Task[bool] | None = None
        self._probe_result: tuple[float, bool] | None = None
        self._retiring: set[asyncio.Task[None]] = set()
        self._unavailable_logged = False
        self.replacements = 0
        self.writable_partitions: int | None = None  # how many partitions the last probe found writable
        self.refusal: str | None = None  # the authorizer's last refusal (handlers/kafka/authorization.py), one line

    async def connect(self) -> None:
        """Create the topic if missing and start the producer (also done lazily by `write`)."""
        await self._ready_producer()

    async def write(self, key: str, value: bytes) -> None:
        """Returns once the broker acknowledged the record with acks=all; raises otherwise."""
        producer: AIOKafkaProducer | None = None
        try:
            producer = await self._ready_producer()
            await producer.send_and_wait(self.topic, value=value, key=key.encode())
        except BaseException as exc:  # including cancellation by the caller's deadline
            now, previous = time.monotonic(), self._last_failure
            if self._failing_since is None or previous is None or now - previous >= 2 * self._shut_after_s:
                self._failing_since = now  # a new run of failures (an old one, long quiet, does not count)
            self._last_failure = now
            self._note_refusal(exc)
            if producer is not None and breaks_producer(exc):
                self._replace(producer, exc)
            raise
        self._last_success = time.monotonic()
        self._failing_since = None
        self.refusal = None
        if self._unavailable_logged:
            self._unavailable_logged = False
            log.info("kafka writes resumed", extra={"topic": self.topic})

    async def writable(self) -> bool:
        """True while the door can write to some partition of the topic (/healthz).

        False while every write has failed for `shut_after_s` (and the last failure is recent); else True when a
        write was acknowledged within `fresh_s` and none failed since; else a probe decides within
        `probe_timeout_s` (results reused for `probe_cache_s`): fresh metadata, and at least one partition whose
        leader and every in-sync replica are reachable and number at least the topic's min.insync.replicas
        (`handlers.ingress.producer_health.writable_partitions`)."""
        now = time.monotonic()
        if self._every_write_failing(now):
            return False
        last_ok, last_bad = self._last_success, self._last_failure
        if (
            self._producer is not None
            and last_ok is not None
            and (last_bad is None or last_ok > last_bad)
            and now - last_ok < self._fresh_s
        ):
            return True
        cached = self._probe_result
        if cached is not None and now - cached[0] < self._probe_cache_s:
            return cached[1]
        if self._probe is None or self._probe.done():
            self._probe = asyncio.create_task(self._run_probe())
        return await asyncio.shield(self._probe)

    def _every_write_failing(self, now: float) -> bool:
        """Writes have failed for `shut_after_s` with none acknowledged, and one failed just now: whatever the
        metadata says (e.g. a cluster that lost its controller quorum still lists every broker), the door is
        shut."""
        failing, last_bad = self._failing_since, self._last_failure
        return (
            failing is not None
            and last_bad is not None
            and now - failing >= self._shut_after_s
            and now - last_bad < 2 * self._shut_after_s
        )

    async def close(self) -> None:
        """Flush what is in flight (up to the retire grace) and stop (graceful shutdown)."""
        if self._connecting is not None and not self._connecting.done():
            self._connecting.cancel()
            with contextlib.suppress(BaseException):
                await self._connecting
        if self._probe is not None and not self._probe.done():
            self._probe.cancel()
        await self._own_probe_client.close()
        producer, self._producer = self._producer, None
        if producer is not None:
            self._retire(producer, grace_s=max(self._retire_grace_s, 5.0))
        if self._retiring:
            await asyncio.gather(*self._retiring, return_exceptions=True)

    # --- producer life ------------------------------------------------------------------------------------

    async def _ready_producer(self) -> AIOKafkaProducer:
        producer = self._producer
        if producer is not None:
            if _producer_alive(producer):
                return producer
            self._replace(producer, KafkaError("producer sender stopped"))
        if self._connecting is None or self._connecting.done():
            failed_at = self._connect_failed_at
            if failed_at is not None and time.monotonic() - failed_at < self._reconnect_backoff_s:
                raise KafkaUnavailable("kafka unavailable (reconnect backing off)")
            self._connecting = asyncio.create_task(self._connect())
            self._connecting.add_done_callback(self._connect_done)
        # shielded: a request that gives up must not cancel a connection other requests are waiting for
        return await asyncio.shield(self._connecting)

    async def _connect(self) -> AIOKafkaProducer:
        async with asyncio.timeout(self._connect_timeout_s):
            if not self._topic_ready:
                await ensure_topics(
                    self.bootstrap, {self.topic: self.partitions}, request_timeout_ms=self._request_timeout_ms
                )
                self._topic_ready = True
            producer = self._producer_factory()
            try:
                await producer.start()
            except BaseException:
                with contextlib.suppress(Exception):
                    async with asyncio.timeout(1.0):
                        await producer.stop()
                raise
        self._producer = producer
        log.info("kafka producer connected", extra={"topic": self.topic})
        return producer

    def _new_producer(self) -> AIOKafkaProducer:
        return AIOKafkaProducer(
            bootstrap_servers=self.bootstrap,
            acks="all",
            enable_idempotence=True,
            request_timeout_ms=self._request_timeout_ms,
            linger_ms=0,
            **client_options(),
        )

    def _connect_done(self, task: asyncio.Task[AIOKafkaProducer]) -> None:
        if task.cancelled():
            return
        error = task.exception()
        if error is None:
            self._connect_failed_at = None
            return
        self._connect_failed_at = time.monotonic()
        self._last_failure = self._connect_failed_at
        if self._note_refusal(error):
            return
        if not self._unavailable_logged:  # once per outage, not once per attempt
            self._unavailable_logged = True
            log.warning("kafka unavailable", extra={"topic": self.topic, "error_type": type(error).__name__})

    def _note_refusal(self, error: BaseException) -> bool:
        """Whether `error` is the authorizer refusing a right; its line is logged once (again when it changes)
        and served on /healthz as `kafka_reason`, while the door keeps trying."""
        line = refusal_reason(error, topic_operation=Operation.WRITE)
        if line is not None and line != self.refusal:
            log.error(line)
        if line is not None:
            self.refusal = line
        return line is not None

    def _replace(self, producer: AIOKafkaProducer, error: BaseException) -> None:
        """Retire `producer` unless another failure already did; the next write makes a fresh one."""
        if producer is not self._producer:
            return
        self._producer = None
        self.replacements += 1
        cause = type(error).__name__
        log.warning("kafka producer replaced", extra={"topic": self.topic, "error_type": cause})
        if self._on_replace is not None:
            self._on_replace(cause)
        self._retire(producer, grace_s=self._retire_grace_s)

    def _retire(self, producer: AIOKafkaProducer, *, grace_s: float) -> None:
        task = asyncio.create_task(_retire_producer(producer, grace_s))
        self._retiring.add(task)
        task.add_done_callback(self._retiring.discard)

    async def _run_probe(self) -> bool:
        writable: set[int] = set()
        try:
            async with asyncio.timeout(self._probe_timeout_s):
                await self._ready_producer()  # a door that cannot make a producer cannot write
                client = await self._probe_client()  # its own connections (handlers/ingress/producer_health.py)
                writable = await writable_now(client, self.topic, await self._topic_min_isr())
        except Exception:
            writable = set()
        self.writable_partitions = len(writable)
        ok = bool(writable)
        self._probe_result = (time.monotonic(), ok)
        return ok

    async def _topic_min_isr(self) -> int | None:
        """The topic's min.insync.replicas, read at most every `min_isr_max_age_s` (an operator may fix it)."""
        now = time.monotonic()
        cached = self._min_isr
        if cached is not None and now - cached[0] < self._min_isr_max_age_s:
            return cached[1]
        value = await self._read_min_isr()
        if value is not None or cached is None:
            self._min_isr = (now, value)
        return value if value is not None else (cached[1] if cached is not None else None)


def _producer_alive(producer: AIOKafkaProducer) -> bool:
    """False when the producer can no longer deliver: closed, or its sender task has ended (e.g. after
    OutOfOrderSequenceNumber), which would leave every later record waiting forever."""
    if getattr(producer, "_closed", False):
        return False
    sender = getattr(producer, "_sender", None)
    task = getattr(sender, "sender_task", None)
    return task is None or not task.done()


async def _retire_producer(producer: AIOKafkaProducer, grace_s: float) -> None:
    """Close a producer that is no longer used: what it has in flight gets `grace_s` to be acknowledged, then
    it is aborted — its sender task cancelled and its connections closed — so a producer whose broker is gone
    neither waits for it forever (idempotent batches never expire) nor keeps reconnecting in the background.
    Records still in flight then are dropped: their requests were, or will be, answered 500."""
    flush = asyncio.ensure_future(producer.flush())
    await asyncio.wait([flush], timeout=grace_s)
    flush.cancel()  # stops waiting only: asyncio.wait inside flush() never cancels the batches themselves
    with contextlib.suppress(BaseException):
        await flush
    sender = getattr(producer, "_sender", None)
    task = getattr(sender, "sender_task", None)
    if task is not None and not task.done():
        task.cancel()
    try:
        async with asyncio.timeout(5.0):
            await producer.client.close()
        if task is not None:
            await asyncio.wait([task], timeout=5.0)
    except Exception as exc:
        log.warning("retired kafka producer did not stop cleanly", extra={"error_type": type(exc).__name__})
    producer._closed = True  # stopped by hand above; tells aiokafka not to warn about an unclosed producer


class SettingsFile:
    """Settings from the configuration file and the environment, reloaded when the file changes.

    The webhook path reads settings on every request (§3.2 step 1); a `stat` per request keeps that cheap
    and lets an operator fix or extend the configuration without restarting the door. The environment is
    read once (it does not change under a running process).
    """

    def __init__(self, path: str | None = None, environ: Mapping[str, str] | RouterEnv | None = None) -> None:
        self._path = path
        self._environ = environ
        self._env: RouterEnv | None = environ if isinstance(environ, RouterEnv) else None
        self._cached: tuple[tuple[int, int, int], Settings] | None = None

    def _router_env(self) -> RouterEnv:
        if self._env is None:
            environ = self._environ
            self._env = read_env(os.environ if environ is None else environ)  # type: ignore[arg-type]
        return self._env

    def __call__(self) -> Settings:
        env = self._router_env()
        path = self._path or env.config_path
        if not path:
            return load_settings(None, env)  # raises the "no configuration file" ConfigError
        try:
            info = os.stat(path)
        except (OSError, ValueError):
            return load_settings(path, env)  # raises ConfigError naming the unreadable file
        stamp = (info.st_mtime_ns, info.st_size, info.st_ino)
        if self._cached is not None and self._cached[0] == stamp:
            return self._cached[1]
        settings = load_settings(path, env)
        self._cached = (stamp, settings)
        return settings


class IngressMetrics:
    """Prometheus metrics of the door, in a registry of their own (served at /metrics)."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        self.requests = Counter(
            "chatwoot_router_ingress_requests",
            "Webhook and other requests at the ingress, by outcome",
            ["outcome"],
            registry=self.registry,
        )
        self.produce_seconds = Histogram(
            "chatwoot_router_ingress_produce_seconds",
            "Time from handing an accepted webhook to Kafka until the broker's ack (or giving up)",
            buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.0, 5.0),
            registry=self.registry,
        )
        self.producer_replacements = Counter(
            "chatwoot_router_ingress_producer_replacements",
            "Kafka producers retired after a failed write and replaced by a fresh one, by error type",
            ["error_type"],
            registry=self.registry,
        )
        self.connections_closed = Counter(
            "chatwoot_router_ingress_connections_closed",
            "Connections the door closed itself: read_timeout, evicted (cap reached), refused (cap reached, all busy)",
            ["reason"],
            registry=self.registry,
        )
        self.open_connections = Gauge(
            "chatwoot_router_ingress_open_connections",
            "Client connections open now",
            registry=self.registry,
        )
        self.kafka_writable = Gauge(
            "chatwoot_router_ingress_kafka_writable",
            "1 when the last /healthz found the door able to write to Kafka, else 0",
            registry=self.registry,
        )
        self.writable_partitions = Gauge(
            "chatwoot_router_ingress_writable_partitions",
            "Partitions of the conversations topic the last Kafka probe found writable (leader and every in-sync "
            "replica reachable); fewer than the topic has while a broker is down",
            registry=self.registry,
        )

    def replaced(self, error_type: str) -> None:
        self.producer_replacements.labels(error_type=error_type).inc()

    def closed(self, reason: str) -> None:
        self.connections_closed.labels(reason=reason).inc()


SETTINGS: web.AppKey[Callable[[], Settings]] = web.AppKey("settings")
WRITER: web.AppKey[WebhookWriter] = web.AppKey("writer", WebhookWriter)
METRICS: web.AppKey[IngressMetrics] = web.AppKey("metrics", IngressMetrics)
CLOCK_MS: web.AppKey[Callable[[], int]] = web.AppKey("clock_ms")
PRODUCE_TIMEOUT_S: web.AppKey[float] = web.AppKey("produce_timeout_s", float)
TOLERANCE_S: web.AppKey[int] = web.AppKey("tolerance_s", int)
READ_TIMEOUT_S: web.AppKey[float] = web.AppKey("read_timeout_s", float)
GUARD: web.AppKey[ConnectionGuard | None] = web.AppKey("guard")
_DEADLINE: web.RequestKey[float] = web.RequestKey("deadline", float)  # loop time by which the body is read

_DELIVERY_ID = re.compile(r"[\x20-\x7e]{1,200}")
_SURROGATE = re.compile("[\ud800-\udfff]")


def _respond(app: web.Application, outcome: str, *, close: bool = False) -> web.Response:
    app[METRICS].requests.labels(outcome=str(outcome)).inc()
    status, text = _RESPONSES[outcome]
    if text.startswith("{"):
        response = web.Response(status=status, text=text, content_type="application/json")
    else:
        response = web.Response(status=status, text=text)
    if close:
        response.force_close()
    return response


async def _respond_and_close(request: web.Request, outcome: str) -> web.Response:
    """Answer, then close the connection at once: the rest of a body that is too slow or unreadable is not
    waited for (aiohttp would otherwise linger reading it)."""
    response = _respond(request.app, outcome, close=True)
    with contextlib.suppress(ConnectionError):
        await response.prepare(request)
        await response.write_eof()
    request.protocol.force_close()  # the answer is in the transport's buffer; close() sends it first
    return response


class _BodyTooLarge(Exception):
    def __init__(self, head: bytes = b"") -> None:
        super().__init__("body too large")
        self.head = head


OVERSIZE_READ_BYTES = 8 * 1024 * 1024
"""How much of a refused body the door still reads to name its conversation in the log (a large HTML e-mail is
about 3 MiB); a bigger one is refused without a name."""


async def _read_limited(request: web.Request, limit: int) -> bytes:
    """The raw body; raises _BodyTooLarge as soon as it is known to exceed `limit` bytes."""
    if request.content_length is not None and request.content_length > limit:
        raise _BodyTooLarge
    body = bytearray()
    while chunk := await request.content.readany():
        body += chunk
        if len(body) > limit:
            raise _BodyTooLarge(bytes(body))
    return bytes(body)


async def _log_refused_body(request: web.Request, head: bytes, deadline: float | None) -> None:
    """Log which conversation a refused (413) body was about, so an operator can find the conversation Chatwoot
    opens instead (Decisions 1): its ids, event, size and whether it was signed, never its content."""
    fields: dict[str, Any] = {"outcome": "payload_too_large", "bytes": request.content_length or len(head)}
    body = bytearray(head)
    try:
        if request.content_length is None or request.content_length <= OVERSIZE_READ_BYTES:
            async with asyncio.timeout_at(deadline):
                while len(body) <= OVERSIZE_READ_BYTES and (chunk := await request.content.readany()):
                    body += chunk
        fields["bytes"] = max(fields["bytes"], len(body))
        named = conversation_of(parse_json(bytes(body))) if len(body) <= OVERSIZE_READ_BYTES else None
    except Exception:  # too slow, unreadable, not JSON: refused all the same, without a name
        named = None
    if named is not None:
        account_id, conversation_id, event = named
        fields.update(account_id=account_id, conversation_id=conversation_id, event=event)
        headers = request.headers
        try:  # the ids are the sender's word unless its signature holds
            secrets = request.app[SETTINGS]().secrets.agent_bot_secrets
            signer = signing_account(
                headers.get("X-Chatwoot-Signature"), headers.get("X-Chatwoot-Timestamp", ""), bytes(body), secrets
            )
            fields["signed"] = signer == account_id
        except Exception:
            fields["signed"] = False
    log_line(log, logging.WARNING, "webhook body too large: refused, Chatwoot opens the conversation", fields)


def delivery_id_of(header: str | None) -> str | None:
    """`X-Chatwoot-Delivery` when it is printable ASCII of at most 200 characters, else None (absent).

    aiohttp decodes header bytes that are not UTF-8 into lone surrogates; such an id, or one with control
    characters, or an absurdly long one, is no use for audit or de-duplication and must not reach the record.
    """
    if header is None or not _DELIVERY_ID.fullmatch(header):
        return None
    return header


def _without_surrogates(value: Any) -> Any:
    if isinstance(value, str):
        return _SURROGATE.sub("\ufffd", value)
    if isinstance(value, dict):
        return {_without_surrogates(k): _without_surrogates(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_without_surrogates(v) for v in value]
    return value


def scrub_record(record: WebhookReceived) -> WebhookReceived:
    """The record with every lone surrogate (e.g. a JSON `"\\udc80"` in `current_value`) replaced by U+FFFD,
    so it can be written as UTF-8 JSON."""
    dumped = record.model_dump()
    cleaned = _without_surrogates(dumped)
    return record if cleaned == dumped else WebhookReceived.model_validate(cleaned)


def _serialise(record: WebhookReceived) -> bytes:
    """The record as UTF-8 JSON. Serialising fails only on lone surrogates, so the scrub (a full dump and
    walk of the record) runs only then, not on every request."""
    try:
        return record.model_dump_json().encode("utf-8")
    except (ValueError, UnicodeError):  # PydanticSerializationError is a ValueError
        return scrub_record(record).model_dump_json().encode("utf-8")


async def _webhook(request: web.Request) -> web.Response:
    app = request.app
    now_ms = app[CLOCK_MS]()
    deadline = request.get(_DEADLINE)
    try:
        async with asyncio.timeout_at(deadline):
            body = await _read_limited(request, MAX_BODY_BYTES)
    except _BodyTooLarge as refused:
        await _log_refused_body(request, refused.head, deadline)
        return _respond(app, "payload_too_large")
    except TimeoutError:
        log.warning("request body too slow", extra={"path": request.path, "outcome": "read_timeout"})
        return await _respond_and_close(request, "read_timeout")
    except Exception as exc:  # a broken chunked encoding, a bad Content-Encoding, a reset connection, …
        log.warning("request body unreadable", extra={"path": request.path, "error_type": type(exc).__name__})
        return await _respond_and_close(request, "unreadable_body")
    try:
        settings = app[SETTINGS]()
    except Exception as exc:
        log.error("request failed", extra={"path": request.path, "error_type": type(exc).__name__})
        return _respond(app, "settings_error")
    headers = request.headers
    verdict = evaluate(
        body=body,
        timestamp=headers.get("X-Chatwoot-Timestamp"),
        signature=headers.get("X-Chatwoot-Signature"),
        delivery_id=delivery_id_of(headers.get("X-Chatwoot-Delivery")),
        secrets=settings.secrets.agent_bot_secrets,
        routed=settings.config.routing.accounts.keys(),
        now_ms=now_ms,
        tolerance_s=app[TOLERANCE_S],
    )
    fields: dict[str, Any] = {"outcome": str(verdict.outcome), "event": _SURROGATE.sub("\ufffd", verdict.event or "")}
    if verdict.signing_account is not None:
        fields["signing_account"] = verdict.signing_account
    record = verdict.record
    if record is None:
        log_line(log, logging.INFO, "webhook", fields)
        return _respond(app, verdict.outcome)
    fields.update(account_id=record.account_id, conversation_id=record.conversation_id, delivery_id=record.delivery_id)
    try:  # serialising is the request's business: a failure here is a bad request, never a Kafka failure
        value = _serialise(record)
    except Exception as exc:
        log.warning(
            "webhook not serialisable", extra={**fields, "outcome": "bad_request", "error_type": type(exc).__name__}
        )
        return _respond(app, Outcome.BAD_REQUEST)
    started = time.perf_counter()
    try:
        async with asyncio.timeout(app[PRODUCE_TIMEOUT_S]):
            await app[WRITER].write(record.key, value)
    except Exception as exc:
        app[METRICS].produce_seconds.observe(time.perf_counter() - started)
        log.error(
            "request failed",
            extra={
                **fields,
                "path": request.path,
                "outcome": "not_durable",
                "error_type": type(exc).__name__,
            },
        )
        return _respond(app, "not_durable")
    elapsed = time.perf_counter() - started
    app[METRICS].produce_seconds.observe(elapsed)
    fields["produce_ms"] = round(elapsed * 1000, 2)
    log_line(log, logging.INFO, "webhook", fields)
    return _respond(app, Outcome.ACCEPTED)


async def _healthz(request: web.Request) -> web.Response:
    """200 `{"ok":true,"kafka":true}` when configuration and secrets load (§2.5) and the door can write to
    Kafka; 503 otherwise, with `kafka` telling which part failed."""
    app = request.app
    try:
        app[SETTINGS]()
    except ConfigError as exc:
        log.error("configuration invalid", extra={"error_type": type(exc).__name__, "error": str(exc)})
        config_ok = False
    except Exception as exc:
        log.error("configuration unavailable", extra={"error_type": type(exc).__name__})
        config_ok = False
    else:
        config_ok = True
    try:
        kafka = await app[WRITER].writable()
    except Exception as exc:
        log.warning("kafka probe failed", extra={"error_type": type(exc).__name__})
        kafka = False
    app[METRICS].kafka_writable.set(1 if kafka else 0)
    partitions = getattr(app[WRITER], "writable_partitions", None)
    if isinstance(partitions, int):
        app[METRICS].writable_partitions.set(partitions)
    ok = config_ok and kafka
    answer: dict[str, Any] = {"ok": ok, "kafka": kafka}
    bootstrap = getattr(app[WRITER], "bootstrap", None)
    if not kafka and isinstance(bootstrap, str) and (reason := auth_reason(bootstrap)) is not None:
        answer["kafka_reason"] = reason  # a refused login or certificate (handlers/kafka/security.py), in one line
    elif not kafka and isinstance(refused := getattr(app[WRITER], "refusal", None), str):
        answer["kafka_reason"] = refused  # a right the authorizer refused (handlers/kafka/authorization.py)
    body = json.dumps(answer, separators=(",", ":"))
    return web.Response(status=200 if ok else 503, text=body, content_type="application/json")


async def _metrics(request: web.Request) -> web.Response:
    app = request.app
    guard = app[GUARD]
    if guard is not None:
        app[METRICS].open_connections.set(guard.open_connections)
    payload = generate_latest(app[METRICS].registry)
    return web.Response(body=payload, headers={"Content-Type": CONTENT_TYPE_LATEST})


@web.middleware
async def _connection_deadline(
    request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
) -> web.StreamResponse:
    """Marks the connection busy while the handler runs and gives the request its read deadline."""
    guard = request.app[GUARD]
    transport = request.transport
    deadline = guard.request_started(transport) if guard is not None else None
    if deadline is None:
        deadline = asyncio.get_running_loop().time() + request.app[READ_TIMEOUT_S]
    request[_DEADLINE] = deadline
    try:
        return await handler(request)
    finally:
        if guard is not None:
            guard.request_finished(transport)


@web.middleware
async def _not_found(
    request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
) -> web.StreamResponse:
    """Any other path or method gets 404 `not found` (§3.1), never aiohttp's 405 or its default text."""
    try:
        return await handler(request)
    except (web.HTTPNotFound, web.HTTPMethodNotAllowed):
        return _respond(request.app, "not_found")


def create_app(
    *,
    settings: Callable[[], Settings],
    writer: WebhookWriter,
    clock_ms: Callable[[], int] = wall_clock_ms,
    produce_timeout_s: float = DEFAULT_PRODUCE_TIMEOUT_S,
    tolerance_s: int = TIMESTAMP_TOLERANCE_S,
    metrics: IngressMetrics | None = None,
    read_timeout_s: float = DEFAULT_READ_TIMEOUT_S,
    guard: ConnectionGuard | None = None,
) -> web.Application:
    """The ingress app. `settings` is called per request; the writer is closed (flushed) on cleanup.

    `guard` is the ConnectionGuard of the site the app is served through (`serve`); without one (e.g. under
    aiohttp's TestServer) a request's body deadline counts from the start of its handler."""
    app = web.Application(middlewares=[_connection_deadline, _not_found])
    app[SETTINGS] = settings
    app[WRITER] = writer
    app[METRICS] = metrics or IngressMetrics()
    app[CLOCK_MS] = clock_ms
    app[PRODUCE_TIMEOUT_S] = produce_timeout_s
    app[TOLERANCE_S] = tolerance_s
    app[READ_TIMEOUT_S] = read_timeout_s
    app[GUARD] = guard
    app.router.add_post(WEBHOOK_PATH, _webhook)
    app.router.add_get("/healthz", _healthz)
    app.router.add_get("/metrics", _metrics)

    async def close_writer(_: web.Application) -> None:
        await writer.close()

    app.on_cleanup.append(close_writer)
    return app


async def serve(app: web.Application, host: str, port: int, *, shutdown_timeout_s: float = 10.0) -> web.AppRunner:
    """Listen on host:port through the app's ConnectionGuard (one is made when it has none)."""
    guard = app[GUARD]
    if guard is None:
        raise ValueError("serve() needs an app created with a ConnectionGuard")
    return await start_guarded(app, host, port, guard, shutdown_timeout=shutdown_timeout_s)
