"""Retrying a command's Kafka work through transient broker states, with a deadline (issue 25 item 5).

A broker that is starting, electing leaders or moving a group coordinator answers for a few seconds with errors
that mean "ask again" (`GroupCoordinatorNotAvailable` on a fresh broker's first group request,
`LeaderNotAvailable` right after a topic is created, `NotEnoughReplicas` while a replica catches up,
`NodeNotReady` or a refused connection while it starts). The operator commands (`config apply`, `topics`,
`sweep`, `replay state`) run their whole Kafka step through `retrying`: it is run again after a backoff until
it succeeds or the deadline passes, and then `KafkaUnusable` carries the one line the command prints, never a
traceback. Every step retried this way is safe to repeat: a configuration document and its markers written
twice switch partitions to the same version, a second sweep request asks for one more pass, a rebuild resumes
its copy and writes the same table values, and `topics` only reads or sets the same values.
"""

from __future__ import annotations

import asyncio
import logging
import sys
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

from aiokafka.errors import (
    GroupCoordinatorNotAvailableError,
    GroupLoadInProgressError,
    KafkaConnectionError,
    KafkaTimeoutError,
    LeaderNotAvailableError,
    NoBrokersAvailable,
    NodeNotReadyError,
    NotControllerError,
    NotCoordinatorForGroupError,
    NotEnoughReplicasAfterAppendError,
    NotEnoughReplicasError,
    NotLeaderForPartitionError,
    RequestTimedOutError,
)

T = TypeVar("T")

DEADLINE_S = 60.0
"""How long a command keeps asking a broker in a transient state before it gives up."""

TRANSIENT: tuple[type[BaseException], ...] = (
    GroupCoordinatorNotAvailableError,
    GroupLoadInProgressError,
    NotCoordinatorForGroupError,
    LeaderNotAvailableError,
    NotLeaderForPartitionError,
    NotEnoughReplicasError,
    NotEnoughReplicasAfterAppendError,
    NodeNotReadyError,
    NoBrokersAvailable,
    KafkaConnectionError,
    KafkaTimeoutError,
    RequestTimedOutError,
    NotControllerError,
)


class KafkaUnusable(Exception):
    """Kafka stayed in a transient state until the deadline; `str()` is one printable line."""

    def __init__(self, bootstrap: str, waited_s: float, cause: BaseException) -> None:
        self.cause = cause
        name = type(cause).__name__
        detail = " ".join(str(cause).split()).removeprefix(name).removeprefix(":").strip()[:300]  # one line
        reason = f"{name}: {detail}" if detail else name
        super().__init__(f"kafka at {bootstrap} not usable after {waited_s:.0f} s: {reason}")


def is_transient(exc: BaseException) -> bool:
    """A broker state that passes by itself (also when wrapped, e.g. a topic creation refused for it)."""
    return isinstance(exc, TRANSIENT) or isinstance(getattr(exc, "error", None), TRANSIENT)


async def retrying(
    step: Callable[[], Awaitable[T]],
    *,
    bootstrap: str,
    deadline_s: float = DEADLINE_S,
    on_wait: Callable[[BaseException, float], None] | None = None,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
) -> T:
    """`await step()`, again after a backoff while it fails transiently; KafkaUnusable once the deadline passes.

    Any other exception propagates at once. `on_wait(error, deadline_s)` is called before the first wait only,
    so a command says once that it is waiting instead of once per attempt.
    """
    started = clock()
    delay = 0.25
    waited = False
    while True:
        try:
            return await step()
        except Exception as exc:
            if not is_transient(exc):
                raise
            remaining = started + deadline_s - clock()
            if remaining <= 0:
                raise KafkaUnusable(bootstrap, clock() - started, exc) from exc
            if on_wait is not None and not waited:
                on_wait(exc, deadline_s)
            waited = True
            await sleep(min(delay, remaining))  # backoff between attempts; the last one comes at the deadline
            delay = min(delay * 2, 5.0)


def print_waiting(command: str, bootstrap: str) -> Callable[[BaseException, float], None]:
    """An `on_wait` for a short-lived command: one line on stderr saying which command waits for which broker
    and why; aiokafka's own error line, which every attempt would repeat, is silenced from then on (the
    command ends with its own line either way)."""

    def report(error: BaseException, deadline_s: float) -> None:
        print(
            f"chatwoot-router {command}: waiting up to {deadline_s:.0f} s for kafka at {bootstrap} "
            f"({type(error).__name__})",
            file=sys.stderr,
            flush=True,
        )
        logging.getLogger("aiokafka").setLevel(logging.CRITICAL)

    return report
