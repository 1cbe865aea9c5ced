"""The router on a secured Kafka (issue 31 item 4): SASL_SSL with SCRAM, each process under its own role's principal
holding only that role's ACLs (tests/support/secure_kafka.py, projections/acls), and the refusals, each one clear
line with nothing written.

The administrator creates every topic ahead (`config apply`): the workers have no Create right, not even for
Faust's own leader topic and changelogs."""

from __future__ import annotations

import asyncio
import json
import re
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from streams.kafka.ports import free_port
from streams.worker_cmd import REFUSED_RETRY_S
from tests.support.processes import Process, run_cli
from tests.support.secure_kafka import SecureKafka
from tests.support.stack import BILLING, Stack
from tests.support.waiting import wait_until

pytestmark = pytest.mark.e2e

BILLING_QUESTION = "I was charged twice on my invoice, please refund the payment"


def as_role(stack: Stack, kafka: SecureKafka, role: str, **extra: str) -> dict[str, str]:
    """The stack's environment under `role`'s client properties."""
    return {**stack.env, "KAFKA_CLIENT_PROPERTIES": str(kafka.properties(role)), **extra}


def cli(env: dict[str, str], *args: str, timeout_s: float = 90) -> subprocess.CompletedProcess[str]:
    return run_cli(env, *args, timeout_s=timeout_s)


@pytest.fixture(scope="module")
def secured(secure_kafka: SecureKafka, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    """The sandbox, the ingress as `ingress` and the worker as `worker`, after `config apply` as `admin`."""
    tmp = tmp_path_factory.mktemp("secure-e2e")
    stack = Stack(secure_kafka.bootstrap, secure_kafka.app_id, tmp, env={"ROUTER_PARTITIONS": "2"})
    applied = cli(as_role(stack, secure_kafka, "admin"), "config", "apply", str(stack.config_path))
    assert applied.returncode == 0, applied.stdout + applied.stderr
    stack.ingress = Process(
        "ingress",
        ["ingress", "--host", "127.0.0.1", "--port", str(stack.ingress_port)],
        as_role(stack, secure_kafka, "ingress"),
        tmp,
    )
    stack.worker = Process(
        "worker", ["worker", "--web-port", str(stack.web_port)], as_role(stack, secure_kafka, "worker"), tmp
    )
    stack.start()  # stops what it started when a process does not come up
    try:
        yield stack
    finally:
        stack.stop()


def test_a_webhook_is_routed_with_each_process_under_its_role_and_audit_verifies_as_reader(
    secured: Stack, secure_kafka: SecureKafka
) -> None:
    conversation = secured.new_conversation(contact_name="Ada Lovelace", contact_email="ada@example.org")
    secured.customer_says(1, conversation, BILLING_QUESTION)  # the sandbox signs the webhook with the bot's secret
    done = secured.wait_conversation(1, conversation, "assigned to billing", lambda c: c["assignee_id"] == BILLING)
    assert done["bot_assignee_id"] is None
    reader = as_role(secured, secure_kafka, "reader")

    def verified() -> bool:
        result = cli(reader, "audit", "--verify", "--conversation", f"1:{conversation}")
        return result.returncode == 0 and "0 differences" in result.stdout

    wait_until("audit --verify as the reader", verified, 90, every_s=1)
    assert "Traceback" not in secured.worker.log_path.read_text(encoding="utf-8")


def one_line(result: subprocess.CompletedProcess[str]) -> str:
    """The command's error: exactly one non-empty line on stderr, no traceback."""
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert "Traceback" not in result.stderr, result.stderr
    assert len(lines) == 1, result.stderr
    return lines[0]


def test_a_wrong_password_is_one_line_naming_the_broker(secured: Stack, secure_kafka: SecureKafka) -> None:
    env = {**as_role(secured, secure_kafka, "reader"), "KAFKA_SASL_PASSWORD": "not-the-password"}
    result = cli(env, "topics")
    assert result.returncode == 2
    line = one_line(result)
    assert f"authentication against broker {secure_kafka.bootstrap} failed" in line
    assert "not-the-password" not in result.stderr + result.stdout


def test_a_plaintext_client_at_the_tls_listener_is_one_line(secured: Stack, secure_kafka: SecureKafka) -> None:
    """No KAFKA_CLIENT_PROPERTIES at all (no credentials, plaintext): told at once, not an endless wait."""
    env = {name: value for name, value in secured.env.items() if name != "KAFKA_CLIENT_PROPERTIES"}
    env["KAFKA_BOOTSTRAP_SERVERS"] = secure_kafka.bootstrap
    result = cli(env, "topics")
    assert result.returncode == 2, result.stdout + result.stderr
    line = one_line(result)
    assert f"broker {secure_kafka.bootstrap} speaks TLS and this client does not" in line


def test_a_ca_the_client_does_not_trust_is_one_line(secured: Stack, secure_kafka: SecureKafka, tmp_path: Path) -> None:
    from streams.kafka.tls import ensure_certificates

    other_ca = ensure_certificates(tmp_path / "another-ca").ca
    env = {**as_role(secured, secure_kafka, "reader"), "KAFKA_SSL_CA_LOCATION": str(other_ca)}
    result = cli(env, "topics")
    assert result.returncode == 2
    assert f"TLS verification of broker {secure_kafka.bootstrap} failed" in one_line(result)


def test_the_ingress_principal_cannot_read_conversations(secured: Stack, secure_kafka: SecureKafka) -> None:
    result = cli(as_role(secured, secure_kafka, "ingress"), "audit", "--verify")
    assert result.returncode != 0
    assert "Traceback" not in result.stderr, result.stderr
    # the first topic it asks for is the configuration (`configs`): refused, not taken for a topic not made yet
    assert f"kafka refused User:ingress the right Read on topic '{secure_kafka.app_id}.configs'" in result.stderr


def test_a_reader_principal_cannot_write(secured: Stack, secure_kafka: SecureKafka, tmp_path: Path) -> None:
    changed = json.loads(secured.config_path.read_text(encoding="utf-8"))
    changed["routing"]["accounts"]["2"]["support"]["covers"] = "Support for broken devices and cables."
    candidate = tmp_path / "changed.json"  # a new version: `config apply` has to write it
    candidate.write_text(json.dumps(changed), encoding="utf-8")
    result = cli(as_role(secured, secure_kafka, "reader"), "config", "apply", str(candidate))
    assert result.returncode != 0
    assert "Traceback" not in result.stderr, result.stderr
    assert "kafka refused User:reader the right" in result.stderr, result.stderr


def group_state(kafka: SecureKafka) -> tuple[set[str], dict[tuple[str, int], int]]:
    """The app's group as the administrator sees it: its members' ids and its committed offsets."""
    from aiokafka.admin import AIOKafkaAdminClient

    from projections.acls import Role

    async def ask() -> tuple[set[str], dict[tuple[str, int], int]]:
        assert kafka.broker.secure is not None
        admin = AIOKafkaAdminClient(bootstrap_servers=kafka.bootstrap, **kafka.broker.secure.client_options(Role.ADMIN))
        await admin.start()
        try:
            described = await admin.describe_consumer_groups([kafka.app_id])
            members = {member[0] for response in described for group in response.groups for member in group[5]}
            offsets = await admin.list_consumer_group_offsets(kafka.app_id)
            return members, {(tp.topic, tp.partition): committed.offset for tp, committed in offsets.items()}
        finally:
            await admin.close()

    return asyncio.run(ask())


def a_refused_worker(secured: Stack, kafka: SecureKafka, tmp_path: Path) -> str:
    """Run a worker of this app under the reader's properties until it has said why it waits, and past its next
    attempt; returns its log. The app's own worker keeps its group meanwhile: the refused one never joins it, so the
    members do not change and no committed offset goes back."""
    members, offsets = group_state(kafka)
    worker = Process(
        "worker-as-reader",
        ["worker", "--web-port", str(free_port())],
        as_role(secured, kafka, "reader", ROUTER_DATA_DIR=str(tmp_path / "state")),
        tmp_path,
    )
    worker.start()
    try:
        worker.wait_for_line(rf"kafka refused User:reader the right Read on group '{kafka.app_id}'", 60)
        time.sleep(REFUSED_RETRY_S + 2)  # at least one more attempt, refused the same way (and not said again)
        assert worker.alive()
        assert group_state(kafka)[0] == members  # it never joined the group
    finally:
        worker.stop()
    after = group_state(kafka)[1]
    assert all(after.get(partition, -1) >= offset for partition, offset in offsets.items())
    return worker.log_path.read_text(encoding="utf-8")


def assert_one_refusal(text: str, kafka: SecureKafka) -> None:
    """One line, at error level, naming the right, the group and the principal; no traceback, no password."""
    refusals = [json.loads(line) for line in text.splitlines() if "kafka refused" in line]
    assert [entry["message"] for entry in refusals] == [
        f"kafka refused User:reader the right Read on group '{kafka.app_id}': "
        "an administrator grants the role's ACLs (`chatwoot-router acls --apply`)"
    ], text
    assert refusals[0]["level"] == "error"
    assert "Traceback" not in text
    password = re.search(r'password="([^"]+)"', kafka.properties("reader").read_text(encoding="utf-8"))
    assert password is not None and password.group(1) not in text


def test_a_reader_cannot_join_the_workers_group(secured: Stack, secure_kafka: SecureKafka, tmp_path: Path) -> None:
    """The reader's properties file given to a worker of this app: it may read the app's topics and describe its
    group (the console's lag) but not join it; the worker says so in one line and waits, committing nothing. (Before
    the next test, which gives the reader's principal a worker's rights on another app.)"""
    assert_one_refusal(a_refused_worker(secured, secure_kafka, tmp_path), secure_kafka)


def test_a_worker_of_another_app_cannot_join_this_apps_group(
    secured: Stack, secure_kafka: SecureKafka, tmp_path: Path
) -> None:
    """The reader's principal, made a worker of another app id (`acls --apply`), runs a worker of this app: the
    authorizer refuses it this app's group; the worker says so in one line and waits, writing nothing."""
    admin = as_role(secured, secure_kafka, "admin", ROUTER_APP_ID=f"{secure_kafka.app_id}-other")
    granted = cli(admin, "acls", "--worker", "User:reader", "--apply")
    assert granted.returncode == 0, granted.stdout + granted.stderr
    assert_one_refusal(a_refused_worker(secured, secure_kafka, tmp_path), secure_kafka)


def test_the_console_renders_as_the_reader(secured: Stack, secure_kafka: SecureKafka) -> None:
    """The console reads the log and the group's lag with the reader's rights only (Read, Describe; no group)."""
    from tests.e2e.test_console_e2e import _console

    conversation = secured.new_conversation()
    secured.customer_says(1, conversation, BILLING_QUESTION)
    secured.wait_conversation(1, conversation, "assigned to billing", lambda c: c["assignee_id"] == BILLING)
    process, url = _console(secured, env=as_role(secured, secure_kafka, "reader"))
    try:

        def shown() -> bool:
            page = secured.http.get(f"{url}/conversations/1:{conversation}")
            return page.status_code == 200 and "assigned" in page.text

        wait_until("the console to show the conversation", shown, 90, every_s=1)
        overview = secured.http.get(f"{url}/")
        assert overview.status_code == 200
        assert "refused" not in overview.text and "Traceback" not in process.log_path.read_text(errors="replace")
    finally:
        process.stop()


def test_forget_runs_as_the_privacy_role_which_reads_nothing_else(secured: Stack, secure_kafka: SecureKafka) -> None:
    """`forget` under the privacy role's properties (issue 32): the erasure is confirmed, the role may read the keys
    topic's compaction lag (the deadline it prints), and it can read no other topic of the app: `audit` is refused
    in a line naming the right."""
    from aiokafka.admin import AIOKafkaAdminClient
    from aiokafka.admin.config_resource import ConfigResource, ConfigResourceType

    from projections.acls import Role

    conversation = secured.new_conversation(contact_name="Grace Hopper", contact_email="grace@example.org")
    secured.customer_says(1, conversation, BILLING_QUESTION)
    secured.wait_conversation(1, conversation, "assigned to billing", lambda c: c["assignee_id"] == BILLING)
    privacy = as_role(secured, secure_kafka, "privacy")
    forgot = cli(privacy, "forget", "--conversation", f"1:{conversation}", "--reason", "customer asked")
    assert forgot.returncode == 0, forgot.stdout + forgot.stderr
    assert f"forgotten 1:{conversation} at" in forgot.stdout and "Traceback" not in forgot.stderr

    async def keys_lag() -> str | None:
        assert secure_kafka.broker.secure is not None
        options = secure_kafka.broker.secure.client_options(Role.PRIVACY)
        admin = AIOKafkaAdminClient(bootstrap_servers=secure_kafka.bootstrap, **options)
        await admin.start()
        try:
            keys = ConfigResource(ConfigResourceType.TOPIC, f"{secure_kafka.app_id}.keys")
            [response] = await admin.describe_configs([keys])
        finally:
            await admin.close()
        [resource] = response.to_object()["resources"]
        assert resource["error_code"] == 0, resource
        entries = resource["config_entries"]
        return next((e["config_value"] for e in entries if e["config_names"] == "max.compaction.lag.ms"), None)

    assert asyncio.run(keys_lag()) is not None

    refused = cli(privacy, "audit", "--verify")
    assert refused.returncode != 0
    assert "Traceback" not in refused.stderr, refused.stderr
    assert "kafka refused User:privacy the right Read on topic" in refused.stderr, refused.stderr
