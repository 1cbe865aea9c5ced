"""The webhook door: aiohttp app for `POST /chatwoot/agent-bot`, `GET /healthz`, `GET /metrics` (DESIGN §3).

The pure decision is `projections.webhook.evaluate`; this module adds the HTTP order of behavior.md §3.2
(body limit first, then settings), and makes an accepted event durable in Kafka before answering 200
(Decisions 6). When Kafka cannot take the record within `produce_timeout_s` the answer is 500, which
Chatwoot retries with the same delivery id. A record whose write was still in flight when we gave up may
land later; the router's job merge makes that duplicate harmless.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, Protocol

from aiohttp import web
from aiokafka import AIOKafkaProducer
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Histogram, generate_latest

from handlers.kafka_topics import ensure_topics
from projections.webhook import MAX_BODY_BYTES, TIMESTAMP_TOLERANCE_S, Outcome, evaluate
from schemas.config import ConfigError, Settings, load_settings
from schemas.records import WebhookReceived

log = logging.getLogger("chatwoot_router.ingress")

WEBHOOK_PATH = "/chatwoot/agent-bot"
DEFAULT_PRODUCE_TIMEOUT_S = 2.0

# outcome label -> (status, body); JSON bodies are compact, exactly as the earlier router wrote them
_RESPONSES: dict[str, tuple[int, str]] = {
    Outcome.ACCEPTED: (200, '{"ok":true}'),
    Outcome.IGNORED: (200, '{"ok":true,"ignored":true}'),
    Outcome.STALE_TIMESTAMP: (401, "invalid or stale timestamp"),
    Outcome.BAD_SIGNATURE: (401, "invalid signature"),
    Outcome.BAD_REQUEST: (400, "bad request"),
    Outcome.FORBIDDEN: (403, "account does not match the webhook secret"),
    "payload_too_large": (413, "payload too large"),
    "settings_error": (500, "internal error"),
    "not_durable": (500, "internal error"),
    "not_found": (404, "not found"),
}


def wall_clock_ms() -> int:
    return time.time_ns() // 1_000_000


class WebhookWriter(Protocol):
    """Makes one record durable; raises when it cannot. `kafka_ok` feeds /healthz's `kafka` field."""

    @property
    def kafka_ok(self) -> bool: ...

    async def write(self, record: WebhookReceived) -> None: ...

    async def close(self) -> None: ...


class KafkaWebhookWriter:
    """Idempotent, acks=all producer to the conversations topic, connected lazily.

    Kafka may be down when the ingress starts or at any time later; each write then tries to (re)connect,
    so the door answers 500 quickly while Kafka is away and 200 again once it is back, without a restart.
    """

    def __init__(
        self,
        bootstrap: str,
        topic: str,
        partitions: int,
        *,
        request_timeout_ms: int = 4000,
        connect_timeout_s: float = 5.0,
    ) -> None:
        self.bootstrap = bootstrap
        self.topic = topic
        self.partitions = partitions
        self._request_timeout_ms = request_timeout_ms
        self._connect_timeout_s = connect_timeout_s
        self._producer: AIOKafkaProducer | None = None
        self._connecting: asyncio.Task[AIOKafkaProducer] | None = None
        self._topic_ready = False
        self._last_write_ok = True

    @property
    def kafka_ok(self) -> bool:
        return self._producer is not None and self._last_write_ok

    async def connect(self) -> None:
        """Create the topic if missing and start the producer (also done lazily by `write`)."""
        await self._ready_producer()

    async def write(self, record: WebhookReceived) -> None:
        producer = await self._ready_producer()
        try:
            await producer.send_and_wait(self.topic, value=record.model_dump_json().encode(), key=record.key.encode())
        except BaseException:  # including cancellation by the caller's deadline
            self._last_write_ok = False
            raise
        self._last_write_ok = True

    async def close(self) -> None:
        """Flush what is in flight and stop (graceful shutdown)."""
        if self._connecting is not None and not self._connecting.done():
            self._connecting.cancel()
        producer, self._producer = self._producer, None
        if producer is not None:
            await producer.stop()

    async def _ready_producer(self) -> AIOKafkaProducer:
        if self._producer is not None:
            return self._producer
        if self._connecting is None or self._connecting.done():
            self._connecting = asyncio.create_task(self._connect())
            self._connecting.add_done_callback(_consume_exception)
        # shielded: a request that gives up must not cancel a connection other requests are waiting for
        return await asyncio.shield(self._connecting)

    async def _connect(self) -> AIOKafkaProducer:
        async with asyncio.timeout(self._connect_timeout_s):
            if not self._topic_ready:
                await ensure_topics(
                    self.bootstrap, {self.topic: self.partitions}, request_timeout_ms=self._request_timeout_ms
                )
                self._topic_ready = True
            producer = AIOKafkaProducer(
                bootstrap_servers=self.bootstrap,
                acks="all",
                enable_idempotence=True,
                request_timeout_ms=self._request_timeout_ms,
                linger_ms=0,
            )
            try:
                await producer.start()
            except BaseException:
                await producer.stop()
                raise
        self._producer = producer
        self._last_write_ok = True
        log.info("kafka producer connected", extra={"topic": self.topic})
        return producer


def _consume_exception(task: asyncio.Task[Any]) -> None:
    if not task.cancelled() and task.exception() is not None:
        log.warning("kafka connection failed", extra={"error_type": type(task.exception()).__name__})


class SettingsFile:
    """Settings from the configuration file and the environment, reloaded when the file changes.

    The webhook path reads settings on every request (§3.2 step 1); a `stat` per request keeps that cheap
    and lets an operator fix or extend the configuration without restarting the door.
    """

    def __init__(self, path: str | None = None, environ: Mapping[str, str] | None = None) -> None:
        self._path = path
        self._environ = environ
        self._cached: tuple[tuple[int, int, int], Settings] | None = None

    def __call__(self) -> Settings:
        env = os.environ if self._environ is None else self._environ
        path = self._path or env.get("ROUTER_CONFIG")
        if not path:
            return load_settings(None, env)  # raises the "no configuration file" ConfigError
        try:
            info = os.stat(path)
        except OSError:
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


SETTINGS: web.AppKey[Callable[[], Settings]] = web.AppKey("settings")
WRITER: web.AppKey[WebhookWriter] = web.AppKey("writer", WebhookWriter)
METRICS: web.AppKey[IngressMetrics] = web.AppKey("metrics", IngressMetrics)
CLOCK_MS: web.AppKey[Callable[[], int]] = web.AppKey("clock_ms")
PRODUCE_TIMEOUT_S: web.AppKey[float] = web.AppKey("produce_timeout_s", float)
TOLERANCE_S: web.AppKey[int] = web.AppKey("tolerance_s", int)


def _respond(app: web.Application, outcome: str) -> web.Response:
    app[METRICS].requests.labels(outcome=str(outcome)).inc()
    status, text = _RESPONSES[outcome]
    if text.startswith("{"):
        return web.Response(status=status, text=text, content_type="application/json")
    return web.Response(status=status, text=text)


async def _read_limited(request: web.Request, limit: int) -> bytes | None:
    """The raw body, or None as soon as it is known to exceed `limit` bytes."""
    if request.content_length is not None and request.content_length > limit:
        return None
    body = bytearray()
    while chunk := await request.content.readany():
        body += chunk
        if len(body) > limit:
            return None
    return bytes(body)


async def _webhook(request: web.Request) -> web.Response:
    app = request.app
    now_ms = app[CLOCK_MS]()
    body = await _read_limited(request, MAX_BODY_BYTES)
    if body is None:
        return _respond(app, "payload_too_large")
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
        delivery_id=headers.get("X-Chatwoot-Delivery"),
        secrets=settings.secrets.agent_bot_secrets,
        routed=settings.config.routing.accounts.keys(),
        now_ms=now_ms,
        tolerance_s=app[TOLERANCE_S],
    )
    fields: dict[str, Any] = {"outcome": str(verdict.outcome), "event": verdict.event}
    if verdict.signing_account is not None:
        fields["signing_account"] = verdict.signing_account
    record = verdict.record
    if record is None:
        log.info("webhook", extra=fields)
        return _respond(app, verdict.outcome)
    fields.update(account_id=record.account_id, conversation_id=record.conversation_id, delivery_id=record.delivery_id)
    started = time.perf_counter()
    try:
        await asyncio.wait_for(app[WRITER].write(record), timeout=app[PRODUCE_TIMEOUT_S])
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
    log.info("webhook", extra={**fields, "produce_ms": round(elapsed * 1000, 2)})
    return _respond(app, Outcome.ACCEPTED)


async def _healthz(request: web.Request) -> web.Response:
    """200 when configuration and secrets load and validate (§2.5); `kafka` is informative only."""
    kafka = request.app[WRITER].kafka_ok
    try:
        request.app[SETTINGS]()
    except ConfigError as exc:
        log.error("configuration invalid", extra={"error_type": type(exc).__name__, "error": str(exc)})
        ok = False
    except Exception as exc:
        log.error("configuration unavailable", extra={"error_type": type(exc).__name__})
        ok = False
    else:
        ok = True
    body = json.dumps({"ok": ok, "kafka": kafka}, separators=(",", ":"))
    return web.Response(status=200 if ok else 503, text=body, content_type="application/json")


async def _metrics(request: web.Request) -> web.Response:
    payload = generate_latest(request.app[METRICS].registry)
    return web.Response(body=payload, headers={"Content-Type": CONTENT_TYPE_LATEST})


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
) -> web.Application:
    """The ingress app. `settings` is called per request; the writer is closed (flushed) on cleanup."""
    app = web.Application(middlewares=[_not_found])
    app[SETTINGS] = settings
    app[WRITER] = writer
    app[METRICS] = metrics or IngressMetrics()
    app[CLOCK_MS] = clock_ms
    app[PRODUCE_TIMEOUT_S] = produce_timeout_s
    app[TOLERANCE_S] = tolerance_s
    app.router.add_post(WEBHOOK_PATH, _webhook)
    app.router.add_get("/healthz", _healthz)
    app.router.add_get("/metrics", _metrics)

    async def close_writer(_: web.Application) -> None:
        await writer.close()

    app.on_cleanup.append(close_writer)
    return app
