"""The ACLs each role needs (projections/acls), their `kafka-acls` command lines, and how the secured local Kafka
(streams/kafka/secure.py) hands them out: no broker here."""

from __future__ import annotations

import datetime as dt
import json
import stat
from pathlib import Path

import pytest

from projections.acls import (
    CLUSTER_NAME,
    SERVICE_ROLES,
    Acl,
    Operation,
    Pattern,
    Refusal,
    Resource,
    Role,
    acls_for,
    kafka_acls_commands,
    refusal_line,
)
from streams.kafka.secure import SecureSetupError, apply_settings, client_properties, prepare
from streams.kafka.tls import NODE_RENEW_BEFORE, NODE_VALIDITY, ensure_certificates

APP = "chatwoot-router"
PRINCIPALS = {role: f"User:{role.value}" for role in SERVICE_ROLES}
WRITES = {Operation.WRITE, Operation.CREATE, Operation.ALTER, Operation.ALTER_CONFIGS}


def table(role: Role) -> set[tuple[Resource, str, Pattern, Operation]]:
    return {(a.resource, a.name, a.pattern, a.operation) for a in acls_for(APP, {role: PRINCIPALS[role]})}


def test_the_ingress_writes_and_describes_its_one_topic_idempotently_and_nothing_else() -> None:
    topic = (Resource.TOPIC, f"{APP}.conversations", Pattern.LITERAL)
    assert table(Role.INGRESS) == {
        (*topic, Operation.WRITE),
        (*topic, Operation.DESCRIBE),
        (*topic, Operation.DESCRIBE_CONFIGS),  # min.insync.replicas, for /healthz
        (Resource.CLUSTER, CLUSTER_NAME, Pattern.LITERAL, Operation.IDEMPOTENT_WRITE),
    }


def test_the_worker_owns_the_apps_topics_and_its_group_but_creates_nothing() -> None:
    rights = table(Role.WORKER)
    for prefix in (f"{APP}.", f"{APP}-"):  # its topics, and Faust's changelogs and leader topic
        for operation in (Operation.READ, Operation.WRITE, Operation.DESCRIBE, Operation.DESCRIBE_CONFIGS):
            assert (Resource.TOPIC, prefix, Pattern.PREFIXED, operation) in rights
    assert (Resource.GROUP, APP, Pattern.LITERAL, Operation.READ) in rights  # the group is the app id, exactly
    assert (Resource.CLUSTER, CLUSTER_NAME, Pattern.LITERAL, Operation.IDEMPOTENT_WRITE) in rights
    assert not {right for right in rights if right[3] in {Operation.CREATE, Operation.ALTER, Operation.ALTER_CONFIGS}}
    assert len(rights) == 10


def test_a_reader_reads_and_describes_but_neither_writes_nor_joins_the_group() -> None:
    rights = table(Role.READER)
    assert {operation for *_, operation in rights} == {Operation.READ, Operation.DESCRIBE}
    assert {(resource, operation) for resource, _, _, operation in rights if resource is Resource.GROUP} == {
        (Resource.GROUP, Operation.DESCRIBE)  # the console's lag: the workers' committed offsets; joining needs Read
    }
    assert not any(resource is Resource.CLUSTER for resource, *_ in rights)


def test_privacy_asks_for_erasures_and_reads_their_proofs_and_the_contacts_keys_only() -> None:
    """`forget`: it writes and reads `conversations`, reads `keys` and its compaction lag; nothing else."""
    conversations = (Resource.TOPIC, f"{APP}.conversations", Pattern.LITERAL)
    keys = (Resource.TOPIC, f"{APP}.keys", Pattern.LITERAL)
    assert table(Role.PRIVACY) == {
        (*conversations, Operation.WRITE),
        (*conversations, Operation.READ),
        (*conversations, Operation.DESCRIBE),
        (*keys, Operation.READ),
        (*keys, Operation.DESCRIBE),
        (*keys, Operation.DESCRIBE_CONFIGS),  # max.compaction.lag.ms: the deadline it promises
        (Resource.CLUSTER, CLUSTER_NAME, Pattern.LITERAL, Operation.IDEMPOTENT_WRITE),
    }


def test_only_the_admin_creates_or_alters() -> None:
    for role in SERVICE_ROLES:
        changes = {right for right in table(role) if right[3] in WRITES - {Operation.WRITE}}
        assert bool(changes) == (role is Role.ADMIN), role
    assert (Resource.CLUSTER, CLUSTER_NAME, Pattern.LITERAL, Operation.ALTER) in table(Role.ADMIN)  # acls --apply


def test_one_principal_in_two_roles_gets_each_right_once_in_a_stable_order() -> None:
    both = acls_for(APP, {Role.INGRESS: "User:door", Role.WORKER: "User:door"})
    assert both == sorted(set(both))
    idempotent = Acl("User:door", Resource.CLUSTER, CLUSTER_NAME, Pattern.LITERAL, Operation.IDEMPOTENT_WRITE)
    assert both.count(idempotent) == 1
    assert acls_for(APP, {}) == []


def test_replay_reads_the_source_and_owns_the_target_prefix_only() -> None:
    rights = {
        (a.resource, a.name, a.pattern, a.operation)
        for a in acls_for(APP, {Role.REPLAY: "User:ops"}, replay_target="green")
    }
    source = {right for right in rights if right[1].startswith(APP)}
    assert {operation for *_, operation in source} == {Operation.READ, Operation.DESCRIBE, Operation.DESCRIBE_CONFIGS}
    assert not any(resource is Resource.GROUP for resource, *_ in source)  # the source's group is never touched
    for prefix in ("green.", "green-"):
        assert (Resource.TOPIC, prefix, Pattern.PREFIXED, Operation.ALL) in rights
    assert (Resource.GROUP, "green", Pattern.LITERAL, Operation.ALL) in rights
    assert (Resource.CLUSTER, CLUSTER_NAME, Pattern.LITERAL, Operation.IDEMPOTENT_WRITE) in rights
    assert len(rights) == 10
    line = " ".join(kafka_acls_commands(acls_for(APP, {Role.REPLAY: "User:ops"}, replay_target="green")))
    assert "--operation All --topic green. --resource-pattern-type prefixed" in line


def test_the_replay_role_needs_its_target_and_the_others_refuse_one() -> None:
    with pytest.raises(ValueError, match="target app id"):
        acls_for(APP, {Role.REPLAY: "User:ops"})
    assert acls_for(APP, {Role.READER: "User:r"}, replay_target="green") == acls_for(APP, {Role.READER: "User:r"})


def test_a_refusal_names_the_right_the_resource_and_the_principal() -> None:
    create = refusal_line(Refusal("User:worker", Operation.CREATE, Resource.TOPIC, f"{APP}-__assignor-__leader"))
    assert create.startswith(f"kafka refused User:worker the right Create on topic '{APP}-__assignor-__leader': ")
    assert "config apply" in create and "\n" not in create
    group = refusal_line(Refusal("User:reader", Operation.READ, Resource.GROUP, APP))
    assert group.startswith(f"kafka refused User:reader the right Read on group '{APP}': ") and "acls --apply" in group
    cluster = refusal_line(Refusal("User:x", Operation.IDEMPOTENT_WRITE, Resource.CLUSTER))
    assert cluster.startswith("kafka refused User:x the right IdempotentWrite on the cluster: ")


def test_a_topic_the_principal_may_not_describe_is_a_refusal_not_a_missing_topic() -> None:
    """Metadata answers a topic this principal may not see with error 29, as it answers a missing one with 3: the
    readers took both for "no such topic", and `audit --verify` reported the live table's values as missing."""
    from handlers.kafka.authorization import find_refusal
    from handlers.kafka.topic_io import raise_refused

    raise_refused([{"topic": f"{APP}.keys", "error_code": 0}, {"topic": f"{APP}.new", "error_code": 3}])
    with pytest.raises(Exception) as refused:
        raise_refused([{"topic": f"{APP}-conversation_state-changelog", "error_code": 29}])
    refusal = find_refusal(refused.value)
    assert refusal is not None and refusal.resource is Resource.TOPIC
    assert refusal.name == f"{APP}-conversation_state-changelog" and refusal.operation is Operation.READ


@pytest.mark.parametrize("principal", ["ingress", "User:", ":ingress", "User:in gress", "User:a\nb"])
def test_a_principal_is_type_colon_name(principal: str) -> None:
    with pytest.raises(ValueError, match="Type:name"):
        acls_for(APP, {Role.READER: principal})


def test_the_command_lines_group_the_operations_of_each_resource() -> None:
    lines = kafka_acls_commands(acls_for(APP, {Role.INGRESS: "User:ingress"}))
    head = 'kafka-acls --bootstrap-server "$KAFKA_BOOTSTRAP_SERVERS" --command-config admin.properties --add'
    assert lines == [
        f"{head} --allow-principal User:ingress --operation IdempotentWrite --cluster",
        f"{head} --allow-principal User:ingress --operation Describe --operation DescribeConfigs --operation Write"
        f" --topic {APP}.conversations --resource-pattern-type literal",
    ]


def test_the_command_lines_cover_every_acl_and_quote_what_the_shell_would_split() -> None:
    acls = acls_for(APP, PRINCIPALS)
    lines = kafka_acls_commands(acls, bootstrap="b:9092", command_config="my admin.properties")
    start = "kafka-acls --bootstrap-server b:9092 --command-config 'my admin.properties' --add"
    assert all(line.startswith(start) for line in lines)
    assert sum(line.count("--operation ") for line in lines) == len(acls)
    assert f"--topic {APP}- --resource-pattern-type prefixed" in " ".join(lines)
    assert f"--group {APP} --resource-pattern-type literal" in " ".join(lines)


# --- the secured local Kafka (streams/kafka/secure.py) ---------------------------------------------------------


def test_settings_are_replaced_in_place_or_appended() -> None:
    text = "a=1\nlisteners=PLAINTEXT://x\n\nb=2\n"
    assert apply_settings(text, {"listeners": "SASL_SSL://y", "c": "3"}) == "a=1\nlisteners=SASL_SSL://y\n\nb=2\nc=3\n"


def test_a_data_dir_keeps_its_passwords_and_ca_and_its_nodes_enforce_acls(tmp_path: Path) -> None:
    first = prepare(tmp_path)
    again = prepare(tmp_path)
    assert again.passwords == first.passwords
    assert len(set(first.passwords.values())) == len(SERVICE_ROLES)
    assert again.tls.ca.read_bytes() == first.tls.ca.read_bytes()
    for private in (tmp_path / "secrets" / "passwords.json", first.tls.ca_key, first.tls.keystore):
        assert stat.S_IMODE(private.stat().st_mode) == 0o600, private
    settings = first.server_settings(9092, 9100)
    assert settings["advertised.listeners"] == "SASL_SSL://127.0.0.1:9092"  # never the controller listener
    assert settings["listener.security.protocol.map"] == "CONTROLLER:SSL,SASL_SSL:SASL_SSL"
    assert settings["listener.name.controller.ssl.client.auth"] == "required"
    assert settings["allow.everyone.if.no.acl.found"] == "false"
    assert settings["authorizer.class.name"] == "org.apache.kafka.metadata.authorizer.StandardAuthorizer"
    assert settings["super.users"] == "User:admin;User:CN=chatwoot-router-kafka-node"
    assert {acl.principal for acl in first.role_acls(APP)} == {
        "User:ingress",
        "User:worker",
        "User:reader",
        "User:privacy",
    }


def test_a_data_dir_made_before_a_role_gets_its_password_unless_its_storage_is_formatted(tmp_path: Path) -> None:
    """A role added by a newer release (`privacy`): the compose file's secrets get its password (kafka-users makes
    its user at the next `up`); a local data dir already formatted has no SCRAM user for it, and says so."""
    first = prepare(tmp_path)
    passwords = tmp_path / "secrets" / "passwords.json"
    older = {role.value: password for role, password in first.passwords.items() if role is not Role.PRIVACY}
    passwords.write_text(json.dumps(older), encoding="utf-8")
    with pytest.raises(SecureSetupError, match=r"made before the role privacy existed.*use a new --data-dir"):
        prepare(tmp_path, add_roles=False)
    again = prepare(tmp_path)
    assert {role: again.passwords[role] for role in SERVICE_ROLES if role is not Role.PRIVACY} == {
        role: first.passwords[role] for role in SERVICE_ROLES if role is not Role.PRIVACY
    }
    assert again.passwords[Role.PRIVACY] and prepare(tmp_path, add_roles=False).passwords == again.passwords
    assert stat.S_IMODE(passwords.stat().st_mode) == 0o600
    passwords.write_text(json.dumps(["not", "a", "mapping"]), encoding="utf-8")
    with pytest.raises(SecureSetupError, match="not the passwords file"):
        prepare(tmp_path)


def test_a_client_properties_file_has_the_standard_keys() -> None:
    text = client_properties(Role.READER, "pw", Path("/d/ca.pem"))
    settings = dict(line.split("=", 1) for line in text.splitlines() if line and not line.startswith("#"))
    assert settings == {
        "security.protocol": "SASL_SSL",
        "sasl.mechanism": "SCRAM-SHA-512",
        "sasl.jaas.config": 'org.apache.kafka.common.security.scram.ScramLoginModule required username="reader" '
        'password="pw";',
        "ssl.truststore.type": "PEM",
        "ssl.truststore.location": "/d/ca.pem",
        "ssl.endpoint.identification.algorithm": "https",
    }


def test_a_node_certificate_near_its_end_is_made_again_from_the_same_ca(tmp_path: Path) -> None:
    start = dt.datetime.now(dt.UTC)
    files = ensure_certificates(tmp_path, now=start)
    ca, keystore = files.ca.read_bytes(), files.keystore.read_bytes()
    assert ensure_certificates(tmp_path, now=start + dt.timedelta(days=1)).keystore.read_bytes() == keystore
    later = start + NODE_VALIDITY - NODE_RENEW_BEFORE + dt.timedelta(days=1)
    renewed = ensure_certificates(tmp_path, now=later)
    assert renewed.ca.read_bytes() == ca  # clients keep trusting the nodes
    assert renewed.keystore.read_bytes() != keystore
