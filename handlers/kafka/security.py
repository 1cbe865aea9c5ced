"""The one place every Kafka client of the router gets its security from (issue 31 item 1).

`client_options()` are the keyword arguments of aiokafka's producer, consumer, admin and low-level clients;
`faust_credentials()` is the same for Faust's `broker_credentials` (its aiokafka driver passes them to its consumer,
its producer and the producer's client, which also creates topics). Both come from `settings()`, read once per
process from KAFKA_CLIENT_PROPERTIES and the KAFKA_* variables (`schemas/kafka_security.py`); an invalid setting is
a ConfigError naming the key or variable (exit 2). PLAINTEXT gives empty options, so a plaintext client is made
exactly as before.

aiokafka reports a refused login or an untrusted certificate only as `Unable to bootstrap from [...]`: its
bootstrap logs each broker's error and drops it. `check_brokers` therefore asks each bootstrap server once, with
the same settings, and `describe_auth_failure` turns what it gets into one line naming the broker (never a
password): the commands print it at start and exit 2, the ingress and the workers report it on `/healthz`
(`auth_reason`) while they keep trying.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import os
import ssl
import time
from collections.abc import Awaitable, Callable
from typing import Any

from aiokafka.conn import create_conn
from aiokafka.errors import (
    AuthenticationFailedError,
    AuthenticationMethodNotSupported,
    IllegalSaslStateError,
    KafkaError,
    SaslAuthenticationFailed,
    UnsupportedSaslMechanismError,
)
from aiokafka.helpers import create_ssl_context
from aiokafka.protocol.metadata import MetadataRequest

from schemas.config import ConfigError
from schemas.kafka_security import KafkaSecurity, SecuritySettingError, read_security

log = logging.getLogger("chatwoot_router.kafka")

PROBE_TIMEOUT_S = 5.0
"""How long one bootstrap server may take to accept a connection and the login (TLS and SASL)."""
AUTH_REASON_INTERVAL_S = 10.0
"""How often a long-running process asks the brokers again while it cannot reach them (`auth_reason`)."""


@functools.cache
def settings() -> KafkaSecurity:
    """This process's Kafka security (os.environ, read once); the ignored keys of the properties file are named
    in one warning. Raises ConfigError naming the key or variable of a bad setting."""
    try:
        security = read_security(os.environ)
    except SecuritySettingError as exc:
        raise ConfigError(exc.source, exc.name, exc.reason) from None
    if security.ignored:
        log.warning(
            "%s: keys the router ignores (no security settings): %s",
            "KAFKA_CLIENT_PROPERTIES",
            ", ".join(security.ignored),
        )
    return security


def reset() -> None:
    """Forget the settings, the options and the probes (tests that change the environment)."""
    settings.cache_clear()
    _options.cache_clear()
    _ssl_context.cache_clear()
    _watches.clear()


def client_options() -> dict[str, Any]:
    """aiokafka keyword arguments for this process's security: `AIOKafkaProducer(..., **client_options())`; the
    same for consumers, admin clients and `AIOKafkaClient`. Empty for PLAINTEXT. A new dict each call (callers may
    add to it); the SSL context inside is shared."""
    return dict(_options())


@functools.cache
def _options() -> dict[str, Any]:
    security = settings()
    if security.protocol == "PLAINTEXT":
        return {}
    options: dict[str, Any] = {"security_protocol": security.protocol}
    if security.uses_tls:
        options["ssl_context"] = _ssl_context()
    if security.uses_sasl:
        options["sasl_mechanism"] = security.mechanism
        options["sasl_plain_username"] = security.username
        options["sasl_plain_password"] = security.password
    return options


def faust_credentials() -> Any:
    """Faust's `broker_credentials` for this process's security (None for PLAINTEXT): SASLCredentials (PLAIN or
    SCRAM, with the SSL context for SASL_SSL) or SSLCredentials. Faust 0.15.3 maps them to the same aiokafka
    options as `client_options` (faust/transport/drivers/aiokafka.py `credentials_to_aiokafka_auth`)."""
    security = settings()
    if security.protocol == "PLAINTEXT":
        return None
    from faust.auth import SASLCredentials, SSLCredentials  # Faust is imported only by the worker

    context = _ssl_context() if security.uses_tls else None
    if security.uses_sasl:
        return SASLCredentials(
            username=security.username, password=security.password, ssl_context=context, mechanism=security.mechanism
        )
    return SSLCredentials(context)


@functools.cache
def _ssl_context() -> ssl.SSLContext:
    return build_ssl_context(settings())


def build_ssl_context(security: KafkaSecurity) -> ssl.SSLContext:
    """The TLS context: the CA file (else the system's CAs), the client certificate and key (mTLS), hostname
    verification unless ssl.endpoint.identification.algorithm is empty, the TLS versions allowed. A file that does
    not load is a ConfigError naming its key or variable."""
    try:
        context = create_ssl_context(cafile=security.ca_file)
    except (ssl.SSLError, OSError, ValueError):
        raise _config_error(security, "ca_file", "holds no CA certificate OpenSSL can load (PEM)") from None
    if security.cert_file is not None:
        password = security.key_password
        try:
            # a callable, never None: OpenSSL would ask for an encrypted key's pass phrase on the terminal
            context.load_cert_chain(
                security.cert_file, security.key_file, password=password if password is not None else _no_password
            )
        except (ssl.SSLError, OSError, ValueError):
            field = "key_password" if password is not None else "cert_file"
            raise _config_error(
                security,
                field,
                "the client certificate and key do not load (a wrong or missing ssl.key.password, a key that does "
                "not match the certificate, or not PEM)",
            ) from None
    context.check_hostname = security.check_hostname  # the chain is verified either way (CERT_REQUIRED)
    context.minimum_version = _TLS[security.tls_versions[0]]
    context.maximum_version = _TLS[security.tls_versions[-1]]
    return context


_TLS = {"TLSv1.2": ssl.TLSVersion.TLSv1_2, "TLSv1.3": ssl.TLSVersion.TLSv1_3}


def _no_password() -> str:
    return ""


def _config_error(security: KafkaSecurity, field: str, reason: str) -> ConfigError:
    exc = security.error(field, reason)
    return ConfigError(exc.source, exc.name, reason)


# --- authentication and TLS failures ------------------------------------------------------------------------------

_SASL_REFUSED = (SaslAuthenticationFailed, AuthenticationFailedError)
_SASL_UNSUPPORTED = (UnsupportedSaslMechanismError, AuthenticationMethodNotSupported, IllegalSaslStateError)
_CERTIFICATE_REFUSED = (
    "TLSV13_ALERT_CERTIFICATE_REQUIRED",
    "SSLV3_ALERT_BAD_CERTIFICATE",
    "TLSV1_ALERT_UNKNOWN_CA",
    "SSLV3_ALERT_CERTIFICATE_UNKNOWN",
    "TLSV1_ALERT_ACCESS_DENIED",
    "SSLV3_ALERT_CERTIFICATE_EXPIRED",
)


def describe_auth_failure(exc: BaseException, broker: str) -> str | None:
    """One line when `exc` (or what caused it) is a refused login or a failed TLS verification against `broker`
    (`host:port`, or the bootstrap list); None for anything else (an unreachable broker, a timeout). The line holds
    the broker, the mechanism and the user name, never a password."""
    for error in _chain(exc):
        if isinstance(error, _SASL_REFUSED):
            return f"authentication against broker {broker} failed: {_who()} was refused (wrong username or password?)"
        if isinstance(error, _SASL_UNSUPPORTED):
            return (
                f"authentication against broker {broker} failed: it does not accept {_who()} "
                "(check security.protocol and sasl.mechanism against the listener)"
            )
        if isinstance(error, ssl.SSLCertVerificationError):
            detail = _one_line(error.verify_message or error.reason or "certificate not trusted")
            return (
                f"TLS verification of broker {broker} failed: {detail} "
                "(check ssl.truststore.location and ssl.endpoint.identification.algorithm)"
            )
        if isinstance(error, ssl.SSLError):
            reason = _one_line(str(error.reason or type(error).__name__))
            if reason in _CERTIFICATE_REFUSED:
                return (
                    f"TLS authentication against broker {broker} failed: it refused this client's certificate "
                    f"({reason}; check ssl.keystore.location)"
                )
            return (
                f"TLS handshake with broker {broker} failed ({reason}: is it a TLS listener? check security.protocol)"
            )
    return None


def _chain(exc: BaseException) -> list[BaseException]:
    seen: list[BaseException] = []
    current: BaseException | None = exc
    while current is not None and current not in seen and len(seen) < 10:
        seen.append(current)
        current = current.__cause__ or current.__context__
    return seen


def _who() -> str:
    with contextlib.suppress(ConfigError):
        security = settings()
        if security.uses_sasl:
            return f"SASL {security.mechanism} as user {_one_line(security.username or '')!r}"
    return "this client"


def _one_line(text: str, limit: int = 160) -> str:
    flat = " ".join(text.split())
    flat = "".join(c if c.isprintable() else "?" for c in flat)
    return flat if len(flat) <= limit else flat[: limit - 1] + "…"


Connect = Callable[..., Awaitable[Any]]


async def ask_brokers(
    bootstrap: str, *, timeout_s: float = PROBE_TIMEOUT_S, connect: Connect = create_conn
) -> dict[str, BaseException | None]:
    """Connect to every bootstrap server at once with this process's security, log in and ask for metadata: per
    `host:port` (in bootstrap order), None when it answered, else the error."""
    from aiokafka.conn import collect_hosts

    options = _conn_options(client_options())
    hosts = [(host, port) for host, port, _ in collect_hosts(bootstrap, randomize=False)]

    async def one(host: str, port: int) -> BaseException | None:
        conn = None
        try:
            async with asyncio.timeout(timeout_s):
                conn = await connect(host, port, request_timeout_ms=int(timeout_s * 1000), **options)
                await conn.send(MetadataRequest([]))
        except (OSError, KafkaError, TimeoutError) as exc:
            return exc
        finally:
            if conn is not None:
                conn.close()
        return None

    answers = await asyncio.gather(*(one(host, port) for host, port in hosts))
    return {f"{host}:{port}": answer for (host, port), answer in zip(hosts, answers, strict=True)}


async def check_brokers(bootstrap: str, *, timeout_s: float = PROBE_TIMEOUT_S) -> str | None:
    """The first refused login or certificate `ask_brokers` meets (in bootstrap order), as one line; None when
    none was refused (an unreachable broker is not this function's to report)."""
    answers = await ask_brokers(bootstrap, timeout_s=timeout_s)
    found = (_describe(error, broker) for broker, error in answers.items() if error is not None)
    return next((line for line in found if line is not None), None)


def _describe(error: BaseException, broker: str) -> str | None:
    """`describe_auth_failure`, and one case only a fresh connection can tell: a broker that accepted the TCP
    connection and reset it at once when TLS is spoken to it is a plaintext listener (Kafka drops the ClientHello
    as a request of absurd size)."""
    line = describe_auth_failure(error, broker)
    if line is None and isinstance(error, ConnectionResetError) and settings().uses_tls:
        line = (
            f"TLS handshake with broker {broker} failed: it closed the connection "
            "(is it a TLS listener? check security.protocol)"
        )
    return line


def brokers_answer(bootstrap: str, *, timeout_s: float = PROBE_TIMEOUT_S) -> bool:
    """Whether some bootstrap server accepts this process's security and answers (the demo's check of an
    external cluster); runs its own event loop."""
    answers = asyncio.run(ask_brokers(bootstrap, timeout_s=timeout_s))
    return any(error is None for error in answers.values())


def _conn_options(options: dict[str, Any]) -> dict[str, Any]:
    """`create_conn` takes the clients' security options under the same names."""
    return {
        name: options[name]
        for name in ("security_protocol", "ssl_context", "sasl_mechanism", "sasl_plain_username", "sasl_plain_password")
        if name in options
    }


def check_at_start(bootstrap: str) -> str | None:
    """`check_brokers` for a command about to start (its own event loop). With PLAINTEXT no login or certificate
    can be refused; only when no broker answers, each is asked whether it speaks TLS (a secured cluster reached
    without KAFKA_CLIENT_PROPERTIES would otherwise be an endless "waiting for kafka")."""
    if settings().protocol == "PLAINTEXT":
        if brokers_answer(bootstrap):
            return None
        return asyncio.run(plaintext_to_tls(bootstrap))
    return asyncio.run(check_brokers(bootstrap))


async def plaintext_to_tls(bootstrap: str, *, timeout_s: float = PROBE_TIMEOUT_S) -> str | None:
    """One line when a bootstrap server completes a TLS handshake: a plaintext client cannot use it."""
    from aiokafka.conn import collect_hosts

    context = ssl.create_default_context()
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE  # only "does it speak TLS?": nothing is sent after the handshake

    async def speaks_tls(host: str, port: int) -> bool:
        try:
            async with asyncio.timeout(timeout_s):
                _, writer = await asyncio.open_connection(host, port, ssl=context)
        except (OSError, ssl.SSLError, TimeoutError):
            return False
        writer.close()
        with contextlib.suppress(Exception):
            await writer.wait_closed()
        return True

    for host, port, _ in collect_hosts(bootstrap, randomize=False):
        if await speaks_tls(host, port):
            return (
                f"broker {host}:{port} speaks TLS and this client does not: set security.protocol (SSL or SASL_SSL) "
                "and the credentials in KAFKA_CLIENT_PROPERTIES (docs/operations.md \"Connecting to a secured Kafka\")"
            )
    return None


class AuthWatch:
    """Why this process's security keeps it off the cluster, for a `/healthz` that must answer at once: `reason()`
    returns the last finding and starts a new check in the background when that one is older than `interval_s`.
    A change of finding is logged once."""

    def __init__(self, bootstrap: str, *, interval_s: float = AUTH_REASON_INTERVAL_S) -> None:
        self.bootstrap = bootstrap
        self.interval_s = interval_s
        self._finding: str | None = None
        self._checked_at: float | None = None
        self._task: asyncio.Task[None] | None = None

    def reason(self) -> str | None:
        now = time.monotonic()
        stale = self._checked_at is None or now - self._checked_at >= self.interval_s
        if stale and (self._task is None or self._task.done()):
            self._task = asyncio.get_running_loop().create_task(self._check())
        if self._checked_at is None or now - self._checked_at > 3 * self.interval_s:
            return None  # a finding from an earlier outage says nothing about this one
        return self._finding

    async def _check(self) -> None:
        try:
            finding = await check_brokers(self.bootstrap)
        except Exception as exc:  # a check must never break the health endpoint that started it
            log.warning("kafka authentication check failed", extra={"error_type": type(exc).__name__})
            finding = None
        if finding != self._finding and finding is not None:
            log.error(finding)
        self._finding, self._checked_at = finding, time.monotonic()


_watches: dict[str, AuthWatch] = {}


def auth_reason(bootstrap: str) -> str | None:
    """For a `/healthz` that found Kafka unusable: the authentication or TLS failure behind it, if any (None for
    PLAINTEXT, and until the first background check has answered). Needs a running event loop."""
    try:
        if settings().protocol == "PLAINTEXT":
            return None
    except ConfigError:
        return None
    watch = _watches.get(bootstrap)
    if watch is None:
        watch = _watches[bootstrap] = AuthWatch(bootstrap)
    return watch.reason()
