"""The group-right probe (handlers/kafka/group_right.py) on the secured broker: it tells a principal without Read on
the app's group (the reader, the ingress) from one with it (the worker, the admin), and commits nothing."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest
from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.client import AIOKafkaClient
from aiokafka.errors import GroupAuthorizationFailedError, GroupCoordinatorNotAvailableError

from handlers.kafka import security
from handlers.kafka.authorization import refusal_reason
from handlers.kafka.group_right import GroupRight, probe_topic, refused
from projections.acls import SERVICE_ROLES, Role
from tests.support.secure_kafka import SecureKafka

pytestmark = pytest.mark.kafka  # the secured broker of tests/support/secure_kafka.py, in the kafka stage


def role_options(kafka: SecureKafka, role: Role) -> dict[str, object]:
    assert kafka.broker.secure is not None
    return kafka.broker.secure.client_options(role)


async def probe_as(kafka: SecureKafka, role: Role) -> bool:
    client = AIOKafkaClient(bootstrap_servers=kafka.bootstrap, **role_options(kafka, role))
    await client.bootstrap()
    try:
        return await refused(client, kafka.app_id, probe_topic(f"{kafka.app_id}."))
    finally:
        await client.close()


def test_only_the_roles_that_may_join_the_group_pass(secure_kafka: SecureKafka) -> None:
    answers = {role: asyncio.run(probe_as(secure_kafka, role)) for role in SERVICE_ROLES}
    assert answers == {
        Role.ADMIN: False,
        Role.WORKER: False,
        Role.INGRESS: True,
        Role.READER: True,
        Role.PRIVACY: True,
    }


def test_the_probe_commits_nothing(secure_kafka: SecureKafka) -> None:
    async def committed() -> set[str]:
        """The topics the group holds offsets for (on a fresh broker the offsets topic is made at the first ask:
        the probe never asked for the coordinator)."""
        admin = AIOKafkaAdminClient(bootstrap_servers=secure_kafka.bootstrap, **role_options(secure_kafka, Role.ADMIN))
        await admin.start()
        try:
            for _ in range(60):
                try:
                    offsets = await admin.list_consumer_group_offsets(secure_kafka.app_id)
                except GroupCoordinatorNotAvailableError:
                    await asyncio.sleep(0.5)
                    continue
                return {partition.topic for partition in offsets}
            raise AssertionError("no group coordinator within 30 s")
        finally:
            await admin.close()

    for role in (Role.ADMIN, Role.WORKER):  # the two that pass the group's check
        assert asyncio.run(probe_as(secure_kafka, role)) is False
    assert probe_topic(f"{secure_kafka.app_id}.") not in asyncio.run(committed())


@pytest.fixture
def as_reader(secure_kafka: SecureKafka, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    for name in ("KAFKA_SASL_USERNAME", "KAFKA_SASL_PASSWORD", "KAFKA_SASL_PASSWORD_FILE", "KAFKA_SECURITY_PROTOCOL"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("KAFKA_CLIENT_PROPERTIES", str(secure_kafka.properties("reader")))
    security.reset()
    yield
    security.reset()


def test_a_refusal_is_the_one_line_of_a_refused_group(secure_kafka: SecureKafka, as_reader: None) -> None:
    async def check() -> BaseException:
        right = GroupRight(secure_kafka.bootstrap, secure_kafka.app_id, probe_topic(f"{secure_kafka.app_id}."))
        try:
            with pytest.raises(GroupAuthorizationFailedError) as raised:
                await right.check()
            return raised.value
        finally:
            await right.close()

    line = refusal_reason(asyncio.run(check()))
    assert line == (
        f"kafka refused User:reader the right Read on group '{secure_kafka.app_id}': "
        "an administrator grants the role's ACLs (`chatwoot-router acls --apply`)"
    )
