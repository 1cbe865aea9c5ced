"""Find the authorizer's refusal in a Kafka error, and say it in one line naming the right, the resource and the
principal (issue 31): a worker or an ingress missing a right logs that line once and keeps trying, instead of a
traceback. The principal is this process's SASL user (`User:<name>`, handlers/kafka/security.py); never a password.

aiokafka raises `TopicAuthorizationFailedError(topic or topics)` from metadata, fetch and produce requests,
`GroupAuthorizationFailedError(group id)` from the group coordinator, and `ClusterAuthorizationFailedError` for
cluster-wide requests (an idempotent producer's InitProducerId); Faust raises `TopicAuthorizationFailedError("Cannot
create topic: <name> (29): …")` when it declares a topic, and `handlers.kafka.topics` a `TopicCreationError`.
Which operation was refused is not in the error: it follows from the request, so the caller may name it.

A refused consumer group is not raised to Faust at all (aiokafka keeps it in its coordinator task):
`handlers.kafka.group_right` asks for that right itself.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re

from aiokafka.errors import (
    ClusterAuthorizationFailedError,
    GroupAuthorizationFailedError,
    TopicAuthorizationFailedError,
)

from handlers.kafka.security import settings
from projections.acls import Operation, Refusal, Resource, refusal_line
from schemas.config import ConfigError

REFUSED = (TopicAuthorizationFailedError, GroupAuthorizationFailedError, ClusterAuthorizationFailedError)
REPORTED_VARIABLE = "ROUTER_WORKER_REFUSED"
"""The refusal a worker logged last, kept in its environment across a start again in place (`exec`), so the fresh
process waits without saying it again (the line holds no password)."""
_CREATE = re.compile(r"[Cc]annot create topic:? ([^\s:]+)")


def principal() -> str:
    """Who this process is to the authorizer, as Kafka writes it."""
    with contextlib.suppress(ConfigError):
        security = settings()
        if security.uses_sasl and security.username:
            return f"User:{security.username}"
        if security.cert_file is not None:
            return "the principal of this client's certificate"
        if not security.uses_sasl and not security.uses_tls:
            return "User:ANONYMOUS"
        return "this client (TLS without a certificate: User:ANONYMOUS)"
    return "this client"


def find_refusal(exc: BaseException, *, topic_operation: Operation = Operation.READ) -> Refusal | None:
    """The refusal behind `exc` (or an exception it was raised from), None for any other error.
    `topic_operation` is what the failed request did to a topic when the error does not say (Read for a consumer,
    Write for a producer)."""
    seen: list[BaseException] = []
    current: BaseException | None = exc
    while current is not None and current not in seen and len(seen) < 10:
        seen.append(current)
        inner = getattr(current, "error", None)  # handlers.kafka.topics.TopicCreationError
        if isinstance(inner, REFUSED):
            created = _CREATE.search(str(current))
            return Refusal(principal(), Operation.CREATE, Resource.TOPIC, created.group(1) if created else "?")
        if isinstance(current, REFUSED):
            return _refusal(current, topic_operation)
        current = current.__cause__ or current.__context__
    return None


def _refusal(error: BaseException, topic_operation: Operation) -> Refusal:
    detail = error.args[0] if error.args else None
    who = principal()
    if isinstance(error, GroupAuthorizationFailedError):
        return Refusal(who, Operation.READ, Resource.GROUP, str(detail) if detail else "?")
    if isinstance(error, ClusterAuthorizationFailedError):
        return Refusal(who, Operation.IDEMPOTENT_WRITE, Resource.CLUSTER)
    created = _CREATE.search(str(detail or ""))
    if created:
        return Refusal(who, Operation.CREATE, Resource.TOPIC, created.group(1))
    if isinstance(detail, set | frozenset | list | tuple):
        names = sorted(str(name) for name in detail)
        return Refusal(who, topic_operation, Resource.TOPIC, ", ".join(names) or "?")
    return Refusal(who, topic_operation, Resource.TOPIC, str(detail) if detail else "?")


def refusal_reason(exc: BaseException, *, topic_operation: Operation = Operation.READ) -> str | None:
    """`find_refusal` as its one line, or None."""
    refusal = find_refusal(exc, topic_operation=topic_operation)
    return refusal_line(refusal) if refusal is not None else None


def report_once(line: str, logger: logging.Logger) -> None:
    """Log the refusal `line` at error level unless it is the one this process (or the one it replaced) logged last:
    once per refusal, not once per attempt."""
    if os.environ.get(REPORTED_VARIABLE) != line:
        logger.error(line)
        mark_reported(line)


def mark_reported(line: str) -> None:
    """`line` was said (e.g. in a fail-stop line): the next `report_once` of it is silent."""
    os.environ[REPORTED_VARIABLE] = line
