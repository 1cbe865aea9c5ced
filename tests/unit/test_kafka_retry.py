"""Transient broker states are waited out with a deadline, then one line (issue 25 item 5); no broker needed."""

from __future__ import annotations

import pytest
from aiokafka.errors import (
    GroupCoordinatorNotAvailableError,
    LeaderNotAvailableError,
    NodeNotReadyError,
    NotEnoughReplicasError,
    TopicAuthorizationFailedError,
)

from handlers.kafka.alter_configs import IncrementalAlterConfigsRequest, IncrementalAlterConfigsRequest_v0
from handlers.kafka.retry import KafkaUnusable, is_transient, retrying
from handlers.kafka.topics import TopicCreationError


class FakeTime:
    """A clock that moves only when the code under test sleeps."""

    def __init__(self) -> None:
        self.now = 100.0
        self.sleeps: list[float] = []

    def clock(self) -> float:
        return self.now

    async def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now += seconds


async def test_a_transient_state_is_retried_until_it_passes() -> None:
    errors = [GroupCoordinatorNotAvailableError(), LeaderNotAvailableError(), NotEnoughReplicasError()]
    waits: list[str] = []
    fake = FakeTime()

    async def step() -> str:
        if errors:
            raise errors.pop(0)
        return "done"

    result = await retrying(
        step,
        bootstrap="b:9092",
        on_wait=lambda error, _deadline: waits.append(type(error).__name__),
        clock=fake.clock,
        sleep=fake.sleep,
    )
    assert result == "done"
    assert fake.sleeps == [0.25, 0.5, 1.0]  # exponential backoff
    assert waits == ["GroupCoordinatorNotAvailableError"]  # said once, not once per attempt


async def test_it_gives_up_at_the_deadline_with_one_line() -> None:
    fake = FakeTime()

    async def step() -> None:
        raise NodeNotReadyError("node 1 is\nnot ready")

    with pytest.raises(KafkaUnusable) as caught:
        await retrying(step, bootstrap="k1:9092,k2:9092", deadline_s=10, clock=fake.clock, sleep=fake.sleep)
    assert str(caught.value) == "kafka at k1:9092,k2:9092 not usable after 10 s: NodeNotReadyError: node 1 is not ready"
    assert fake.now - 100.0 == 10  # the last attempt at the deadline, none after


async def test_other_errors_are_not_retried() -> None:
    calls = 0

    async def step() -> None:
        nonlocal calls
        calls += 1
        raise TopicAuthorizationFailedError()

    fake = FakeTime()
    with pytest.raises(TopicAuthorizationFailedError):
        await retrying(step, bootstrap="b", clock=fake.clock, sleep=fake.sleep)
    assert calls == 1 and fake.sleeps == []


def test_a_topic_creation_refused_for_a_transient_reason_is_transient() -> None:
    assert is_transient(TopicCreationError("a.conversations", NotEnoughReplicasError()))
    assert not is_transient(TopicCreationError("a.conversations", TopicAuthorizationFailedError()))
    assert not is_transient(LookupError("topic a.conversations does not exist"))


def test_the_incremental_alter_configs_request_encodes_set_operations() -> None:
    request = IncrementalAlterConfigsRequest([(2, "a.conversations", [("retention.ms", 0, "-1")])])
    struct = request.prepare({44: (0, 1)})
    assert isinstance(struct, IncrementalAlterConfigsRequest_v0)
    encoded = struct.encode()
    assert b"a.conversations" in encoded and b"retention.ms" in encoded


def test_the_rebootstrap_patch_accepts_the_installed_aiokafka_and_names_what_it_would_miss(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """At start every command checks the aiokafka internals the patch relies on (issue 34): the installed one
    passes; one that lacks a private attribute or has another version is refused with a line that names it."""
    from handlers.kafka import rebootstrap

    rebootstrap.verify()
    monkeypatch.setattr(rebootstrap, "CLIENT_ATTRIBUTES", (*rebootstrap.CLIENT_ATTRIBUTES, "_gone_in_a_new_release"))
    with pytest.raises(rebootstrap.InternalsChanged, match="_gone_in_a_new_release"):
        rebootstrap.verify()
    monkeypatch.setattr(rebootstrap, "SUPPORTED_AIOKAFKA", ("9.9.",))
    with pytest.raises(rebootstrap.InternalsChanged, match=r"aiokafka 0\.14\.\d+ is installed"):
        rebootstrap.verify()


async def test_an_unexpected_error_in_the_rebootstrap_never_escapes_into_aiokafkas_metadata_task(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from handlers.kafka import rebootstrap

    async def fails(*args: object) -> bool:
        return False

    async def breaks(*args: object) -> bool:
        raise AttributeError("_sasl_oauth_token_provider")

    monkeypatch.setattr(rebootstrap, "_original", fails)
    monkeypatch.setattr(rebootstrap, "rebootstrap", breaks)
    assert await rebootstrap._metadata_update_or_rebootstrap(object(), object(), []) is False  # type: ignore[arg-type]
