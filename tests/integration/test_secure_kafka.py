"""The secured local Kafka (issue 31 item 3): SASL_SSL with SCRAM-SHA-512, a CA of its own, and each role's user
holding only its role's ACLs (projections/acls). Every client here is built from the properties file the broker
wrote for its role, read by a parser of this file's own (the router's is `KAFKA_CLIENT_PROPERTIES`' business)."""

from __future__ import annotations

import asyncio
import re
import signal
import ssl
import stat
from pathlib import Path
from typing import Any

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.conn import AIOKafkaConnection
from aiokafka.errors import (
    ClusterAuthorizationFailedError,
    GroupAuthorizationFailedError,
    KafkaConnectionError,
    SaslAuthenticationFailed,
    TopicAlreadyExistsError,
    TopicAuthorizationFailedError,
)
from aiokafka.helpers import create_ssl_context

from streams.kafka.ports import free_port, port_in_use
from streams.kafka.tls import ensure_certificates
from tests.support.env import outside_env
from tests.support.processes import Process
from tests.support.secure_kafka import SecureKafka
from tests.support.waiting import within

pytestmark = pytest.mark.kafka  # a broker of its own (tests/support/secure_kafka.py), in the kafka stage

ROLES = ("admin", "ingress", "worker", "reader", "privacy")
JAAS = re.compile(r'\S+\.ScramLoginModule required username="([^"]+)" password="([^"]+)";')


def read_properties(path: Path) -> dict[str, str]:
    """key=value lines of a Java properties file (no continuation lines: these files have none)."""
    settings: dict[str, str] = {}
    for line in path.read_text(encoding="utf-8").splitlines():
        line = line.strip()
        if line and not line.startswith(("#", "!")):
            key, _, value = line.partition("=")
            settings[key.strip()] = value.strip()
    return settings


def client_kwargs(path: Path) -> dict[str, Any]:
    """aiokafka's keyword arguments for the client a properties file describes."""
    settings = read_properties(path)
    match = JAAS.fullmatch(settings["sasl.jaas.config"])
    assert match is not None, "sasl.jaas.config is not a ScramLoginModule line"
    assert settings["ssl.truststore.type"] == "PEM"
    assert settings["ssl.endpoint.identification.algorithm"] == "https"  # aiokafka's context checks host names
    return {
        "security_protocol": settings["security.protocol"],
        "sasl_mechanism": settings["sasl.mechanism"],
        "sasl_plain_username": match.group(1),
        "sasl_plain_password": match.group(2),
        "ssl_context": create_ssl_context(cafile=settings["ssl.truststore.location"]),
    }


def conversations(kafka: SecureKafka) -> str:
    return f"{kafka.app_id}.conversations"


async def ensure_topic(kafka: SecureKafka, name: str) -> None:
    """The topic exists, created as admin (the roles cannot create topics)."""
    admin = AIOKafkaAdminClient(bootstrap_servers=kafka.bootstrap, **client_kwargs(kafka.properties("admin")))
    await admin.start()
    try:
        response = await admin.create_topics([NewTopic(name, num_partitions=2, replication_factor=1)])
        for _topic, code, *_ in response.topic_errors:
            assert code in (0, TopicAlreadyExistsError.errno), code
    finally:
        await admin.close()


async def produce(kafka: SecureKafka, role: str, topic: str, value: bytes) -> None:
    producer = AIOKafkaProducer(
        bootstrap_servers=kafka.bootstrap,
        acks="all",
        enable_idempotence=True,
        request_timeout_ms=10_000,
        **client_kwargs(kafka.properties(role)),
    )
    try:
        await producer.start()  # idempotent: InitProducerId needs IdempotentWrite on the cluster (or Write somewhere)
        await producer.send_and_wait(topic, value, key=b"conversation-1", partition=0)
    finally:
        await producer.stop()


async def read_partition(kafka: SecureKafka, role: str, topic: str) -> list[bytes]:
    """Every value of partition 0 of `topic`, read without a group (as the readers do)."""
    consumer = AIOKafkaConsumer(
        bootstrap_servers=kafka.bootstrap, auto_offset_reset="earliest", **client_kwargs(kafka.properties(role))
    )
    try:
        await consumer.start()
        partition = TopicPartition(topic, 0)
        consumer.assign([partition])
        end = (await consumer.end_offsets([partition]))[partition]
        consumer.seek(partition, (await consumer.beginning_offsets([partition]))[partition])
        values: list[bytes] = []
        while await consumer.position(partition) < end:
            batch = await consumer.getmany(partition, timeout_ms=1000)
            values.extend(record.value for record in batch.get(partition, []))
        return values
    finally:
        await consumer.stop()


async def connect(kafka: SecureKafka, kwargs: dict[str, Any]) -> None:
    """One connection to the broker with `kwargs`, through TLS and SASL when they say so; closed in any case."""
    host, port = kafka.bootstrap.split(":")
    connection = AIOKafkaConnection(host, int(port), request_timeout_ms=10_000, **kwargs)
    try:
        await connection.connect()
    finally:
        connection.close()


def test_the_properties_dir_has_one_private_file_per_role_and_the_ca(secure_kafka: SecureKafka) -> None:
    names = sorted(path.name for path in secure_kafka.properties_dir.iterdir())
    assert names == [
        "admin.properties",
        "ca.pem",
        "ingress.properties",
        "privacy.properties",
        "reader.properties",
        "worker.properties",
    ]
    for role in ROLES:
        path = secure_kafka.properties(role)
        assert stat.S_IMODE(path.stat().st_mode) == 0o600, role  # it holds the role's password
        settings = read_properties(path)
        assert settings["security.protocol"] == "SASL_SSL"
        assert settings["sasl.mechanism"] == "SCRAM-SHA-512"
        assert settings["ssl.truststore.location"] == str(secure_kafka.properties_dir / "ca.pem")
        assert client_kwargs(path)["sasl_plain_username"] == role
    passwords = {client_kwargs(secure_kafka.properties(role))["sasl_plain_password"] for role in ROLES}
    assert len(passwords) == len(ROLES)  # one password per user, none shared


async def test_the_admin_creates_and_lists_topics(secure_kafka: SecureKafka) -> None:
    topic = f"{secure_kafka.app_id}.admin-made"
    async with within(60, "the admin creating and listing a topic"):
        await ensure_topic(secure_kafka, topic)
        admin = AIOKafkaAdminClient(
            bootstrap_servers=secure_kafka.bootstrap, **client_kwargs(secure_kafka.properties("admin"))
        )
        await admin.start()
        try:
            assert topic in await admin.list_topics()
        finally:
            await admin.close()


async def test_the_ingress_writes_conversations_but_cannot_read_them(secure_kafka: SecureKafka) -> None:
    topic = conversations(secure_kafka)
    async with within(90, "the ingress writing, the reader reading, the ingress refused"):
        await ensure_topic(secure_kafka, topic)
        await produce(secure_kafka, "ingress", topic, b"from the door")
        assert b"from the door" in await read_partition(secure_kafka, "reader", topic)
        with pytest.raises(TopicAuthorizationFailedError):
            await read_partition(secure_kafka, "ingress", topic)


async def test_a_reader_can_neither_write_nor_join_the_workers_group(secure_kafka: SecureKafka) -> None:
    topic = conversations(secure_kafka)
    async with within(90, "the reader refused a write and the group"):
        await ensure_topic(secure_kafka, topic)
        with pytest.raises((TopicAuthorizationFailedError, ClusterAuthorizationFailedError)):
            await produce(secure_kafka, "reader", topic, b"not from a reader")
        assert b"not from a reader" not in await read_partition(secure_kafka, "admin", topic)
        consumer = AIOKafkaConsumer(
            topic,
            bootstrap_servers=secure_kafka.bootstrap,
            group_id=secure_kafka.app_id,
            **client_kwargs(secure_kafka.properties("reader")),
        )
        try:
            with pytest.raises(GroupAuthorizationFailedError):
                await consumer.start()
                await consumer.getmany(timeout_ms=5000)
        finally:
            await consumer.stop()


async def test_the_worker_consumes_and_commits_in_its_group_and_writes_its_topics(secure_kafka: SecureKafka) -> None:
    topic, effects = conversations(secure_kafka), f"{secure_kafka.app_id}.effects"
    async with within(120, "the worker reading in its group, committing and writing"):
        await ensure_topic(secure_kafka, topic)
        await ensure_topic(secure_kafka, effects)
        await produce(secure_kafka, "ingress", topic, b"for the worker")
        consumer = AIOKafkaConsumer(
            topic,
            bootstrap_servers=secure_kafka.bootstrap,
            group_id=secure_kafka.app_id,
            enable_auto_commit=False,
            auto_offset_reset="earliest",
            **client_kwargs(secure_kafka.properties("worker")),
        )
        await consumer.start()
        try:
            seen: list[bytes] = []
            while b"for the worker" not in seen:
                batch = await consumer.getmany(timeout_ms=1000)
                seen.extend(record.value for records in batch.values() for record in records)
            await consumer.commit()
        finally:
            await consumer.stop()
        await produce(secure_kafka, "worker", effects, b"a command")


async def test_a_plaintext_client_cannot_talk_to_the_tls_listener(secure_kafka: SecureKafka) -> None:
    async with within(60, "the plaintext client refused"):
        admin = AIOKafkaAdminClient(bootstrap_servers=secure_kafka.bootstrap, request_timeout_ms=10_000)
        try:
            with pytest.raises(KafkaConnectionError):  # the broker closes the connection at the first request
                await admin.start()
        finally:
            await admin.close()


async def test_a_wrong_password_fails_authentication(secure_kafka: SecureKafka) -> None:
    wrong = {**client_kwargs(secure_kafka.properties("admin")), "sasl_plain_password": "not-the-password"}
    async with within(60, "the wrong password refused"):
        with pytest.raises(SaslAuthenticationFailed):
            await connect(secure_kafka, wrong)
        admin = AIOKafkaAdminClient(bootstrap_servers=secure_kafka.bootstrap, **wrong)
        try:
            with pytest.raises(KafkaConnectionError):  # the client's own bootstrap fails too
                await admin.start()
        finally:
            await admin.close()


async def test_a_client_that_does_not_trust_the_ca_fails(secure_kafka: SecureKafka, tmp_path: Path) -> None:
    other_ca = ensure_certificates(tmp_path / "another-ca").ca  # a CA of its own, not the broker's
    untrusting = {
        **client_kwargs(secure_kafka.properties("admin")),
        "ssl_context": create_ssl_context(cafile=str(other_ca)),
    }
    async with within(60, "the untrusted certificate refused"):
        with pytest.raises(ssl.SSLCertVerificationError):
            await connect(secure_kafka, untrusting)
        await connect(secure_kafka, client_kwargs(secure_kafka.properties("admin")))  # what fails is the CA alone


def test_the_command_prints_its_ready_line_and_a_restart_keeps_its_users(tmp_path: Path) -> None:
    """`chatwoot-router kafka --secure`: one ready line naming the properties dir and no password anywhere in its
    output; started again on its data dir, it keeps its CA and passwords, and the role users still connect."""
    port, data_dir = free_port(), tmp_path / "data"
    env = {**outside_env(), "ROUTER_APP_ID": "secure-command"}
    kafka = Process(
        "kafka-secure", ["kafka", "--secure", "--port", str(port), "--data-dir", str(data_dir)], env, tmp_path
    )
    ready = rf"^ready bootstrap=127\.0\.0\.1:{port} properties=(\S+)$"
    try:
        kafka.start()
        properties = Path(kafka.wait_for_line(ready, 180).group(1))
        assert properties == data_dir.resolve() / "clients"
        first = {role: (properties / f"{role}.properties").read_text(encoding="utf-8") for role in ROLES}
        ca = (properties / "ca.pem").read_bytes()
        kafka.stop(signal.SIGTERM, 60)
        assert kafka.returncode == 0
        assert not port_in_use(port)

        kafka.start()
        assert Path(kafka.wait_for_line(ready, 180).group(1)) == properties
        assert {role: (properties / f"{role}.properties").read_text(encoding="utf-8") for role in ROLES} == first
        assert (properties / "ca.pem").read_bytes() == ca
        asyncio.run(connects(f"127.0.0.1:{port}", client_kwargs(properties / "worker.properties")))
    finally:
        kafka.stop(signal.SIGTERM, 60)
    output = kafka.log_path.read_text(encoding="utf-8")
    assert output.count("ready bootstrap=") == 2
    for text in first.values():
        password = JAAS.search(text)
        assert password is not None
        assert password.group(2) not in output


async def connects(bootstrap: str, kwargs: dict[str, Any]) -> None:
    async with within(60, "a role user connecting to the restarted broker"):
        admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap, **kwargs)
        try:
            await admin.start()
            assert (await admin.describe_cluster())["brokers"]
        finally:
            await admin.close()
