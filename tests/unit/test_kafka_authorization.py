"""The authorizer's refusals found in aiokafka's and Faust's errors (handlers/kafka/authorization.py): the right,
the resource and the principal in one line, with no password; no broker here."""

from __future__ import annotations

import logging
from collections.abc import Iterator

import pytest
from aiokafka.errors import (
    ClusterAuthorizationFailedError,
    GroupAuthorizationFailedError,
    KafkaConnectionError,
    TopicAuthorizationFailedError,
)

from handlers.kafka import security
from handlers.kafka.authorization import REPORTED_VARIABLE, find_refusal, mark_reported, refusal_reason, report_once
from handlers.kafka.topics import TopicCreationError
from projections.acls import Operation, Refusal, Resource

pytestmark = pytest.mark.unit


@pytest.fixture(autouse=True)
def as_worker(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    for name in ("KAFKA_CLIENT_PROPERTIES", "KAFKA_SECURITY_PROTOCOL", "KAFKA_SASL_PASSWORD_FILE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("KAFKA_SECURITY_PROTOCOL", "SASL_PLAINTEXT")
    monkeypatch.setenv("KAFKA_SASL_MECHANISM", "SCRAM-SHA-512")
    monkeypatch.setenv("KAFKA_SASL_USERNAME", "worker")
    monkeypatch.setenv("KAFKA_SASL_PASSWORD", "s3cret-pw")
    security.reset()
    yield
    security.reset()


def test_faust_declaring_its_leader_topic_is_a_refused_create() -> None:
    error = TopicAuthorizationFailedError("Cannot create topic: app-__assignor-__leader (29): Authorization failed.")
    assert find_refusal(error) == Refusal("User:worker", Operation.CREATE, Resource.TOPIC, "app-__assignor-__leader")


def test_the_admin_clients_refused_creation_is_a_create_too() -> None:
    error = TopicCreationError("app.dlq", TopicAuthorizationFailedError())
    assert find_refusal(error) == Refusal("User:worker", Operation.CREATE, Resource.TOPIC, "app.dlq")


def test_a_group_a_topic_and_the_cluster() -> None:
    assert find_refusal(GroupAuthorizationFailedError("app")) == Refusal(
        "User:worker", Operation.READ, Resource.GROUP, "app"
    )
    assert find_refusal(TopicAuthorizationFailedError({"app.b", "app.a"})) == Refusal(
        "User:worker", Operation.READ, Resource.TOPIC, "app.a, app.b"
    )
    written = find_refusal(TopicAuthorizationFailedError("app.conversations"), topic_operation=Operation.WRITE)
    assert written is not None and written.operation is Operation.WRITE
    cluster = find_refusal(ClusterAuthorizationFailedError())
    assert cluster == Refusal("User:worker", Operation.IDEMPOTENT_WRITE, Resource.CLUSTER)


def test_a_refusal_raised_from_another_error_is_found_and_other_errors_are_not_refusals() -> None:
    try:
        try:
            raise GroupAuthorizationFailedError("app")
        except GroupAuthorizationFailedError as inner:
            raise RuntimeError("consumer crashed") from inner
    except RuntimeError as outer:
        line = refusal_reason(outer)
    assert line is not None and line.startswith("kafka refused User:worker the right Read on group 'app'")
    assert "s3cret-pw" not in line and "\n" not in line
    assert find_refusal(KafkaConnectionError("no broker")) is None


def test_a_refusal_is_logged_once_also_across_a_start_again(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """The line is kept in the environment, which `exec` hands to the fresh process; a fail-stop line that said it
    marks it said."""
    monkeypatch.delenv(REPORTED_VARIABLE, raising=False)
    logger = logging.getLogger("chatwoot_router.test_refusals")
    group = "kafka refused User:reader the right Read on group 'app': …"
    topic = "kafka refused User:reader the right Write on topic 'app.effects': …"
    with caplog.at_level(logging.ERROR, logger=logger.name):
        for line in (group, group, topic, topic, group):
            report_once(line, logger)
        mark_reported(topic)  # e.g. a running worker's fail-stop line
        report_once(topic, logger)
    assert [record.getMessage() for record in caplog.records] == [group, topic, group]
