"""A running worker whose group right is taken away (streams/worker/app.py `watch_group_right`): it stops without
committing in one line naming the right, the group and the principal, marked as said so the fresh start waits
without saying it again; a probe that gets no answer is no reason to stop. No broker: the probe is a stand-in."""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any, NoReturn

import pytest
from aiokafka.errors import GroupAuthorizationFailedError, KafkaConnectionError

from handlers.kafka import security
from handlers.kafka.authorization import REPORTED_VARIABLE
from streams.worker import app as worker_app

pytestmark = pytest.mark.unit


class Stopped(Exception):
    """What the stand-in for the fail-stop raises instead of replacing the process."""


class Probe:
    """Answers with each of `answers` in turn (an exception is raised), then is granted."""

    def __init__(self, *answers: BaseException | None) -> None:
        self.answers = list(answers)
        self.asked = 0

    async def check(self) -> None:
        self.asked += 1
        answer = self.answers.pop(0) if self.answers else None
        if answer is not None:
            raise answer


def watch(probe: Probe, monkeypatch: pytest.MonkeyPatch, *, for_s: float = 0.5) -> list[str]:
    """Run the watch against `probe` until it stops the worker or `for_s` passes; the fail-stop reasons."""
    monkeypatch.setattr(worker_app, "GROUP_RIGHT_PROBE_S", 0.01)
    stops: list[str] = []

    def stop(reason: str) -> NoReturn:
        stops.append(reason)
        raise Stopped(reason)

    worker: Any = SimpleNamespace(group_right=probe, service=SimpleNamespace(stop=stop))

    async def run() -> None:
        with contextlib.suppress(Stopped, TimeoutError):
            await asyncio.wait_for(worker_app.WorkerApp.watch_group_right(worker), for_s)

    asyncio.run(run())
    return stops


@pytest.fixture(autouse=True)
def as_worker_user(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    for name in ("KAFKA_CLIENT_PROPERTIES", "KAFKA_SASL_PASSWORD_FILE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("KAFKA_SECURITY_PROTOCOL", "SASL_PLAINTEXT")
    monkeypatch.setenv("KAFKA_SASL_MECHANISM", "SCRAM-SHA-512")
    monkeypatch.setenv("KAFKA_SASL_USERNAME", "worker")
    monkeypatch.setenv("KAFKA_SASL_PASSWORD", "s3cret-pw")
    monkeypatch.delenv(REPORTED_VARIABLE, raising=False)
    security.reset()
    yield
    security.reset()


def test_a_refused_group_stops_the_worker_in_one_line_marked_as_said(monkeypatch: pytest.MonkeyPatch) -> None:
    probe = Probe(None, GroupAuthorizationFailedError("app"))
    stops = watch(probe, monkeypatch)
    assert stops == [
        "kafka refused User:worker the right Read on group 'app': "
        "an administrator grants the role's ACLs (`chatwoot-router acls --apply`)"
    ]
    assert probe.asked == 2
    assert os.environ[REPORTED_VARIABLE] == stops[0]  # the fresh start does not say it again


def test_a_probe_without_an_answer_does_not_stop_the_worker(monkeypatch: pytest.MonkeyPatch) -> None:
    probe = Probe(KafkaConnectionError("no broker"), TimeoutError(), None)
    stops = watch(probe, monkeypatch, for_s=0.3)
    assert stops == []
    assert probe.asked >= 3



class Escape(BaseException):
    """Raised by the probe once the test has seen the stop fail, so a failing test still ends."""


def test_stopping_the_watch_ends_it_even_as_a_probe_answers(monkeypatch: pytest.MonkeyPatch) -> None:
    """The worker's stop cancels the watch at any point of a probe; Python 3.11's `wait_for` swallowed a cancel
    that met an answer already in, and the watch (and the stop awaiting it) then ran for good."""
    monkeypatch.setattr(worker_app, "GROUP_RIGHT_PROBE_S", 1e-6)
    escape = False

    async def check() -> None:
        if escape:
            raise Escape

    worker: Any = SimpleNamespace(group_right=SimpleNamespace(check=check), service=SimpleNamespace(stop=print))

    async def stopped_after(steps: int) -> bool:
        nonlocal escape
        escape = False
        task = asyncio.ensure_future(worker_app.WorkerApp.watch_group_right(worker))
        for _ in range(steps):
            await asyncio.sleep(0)
        task.cancel()
        done, _ = await asyncio.wait({task}, timeout=1.0)
        if not done:
            escape = True
            with contextlib.suppress(Escape):
                await task
        return bool(done)

    async def run() -> list[int]:
        return [steps for steps in range(1, 40) if not await stopped_after(steps)]

    assert asyncio.run(run()) == []  # the step counts at which the stop did not end the watch
