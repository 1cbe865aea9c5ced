"""The contract of docker-compose.secure.yml (issue 31 item 6) on top of docker-compose.yml and
docker-compose.cluster.yml, read as `docker compose -f … -f … -f …` merges them, and the files `chatwoot-router
kafka-secrets` writes for it. No Docker engine: each node's environment is turned into server properties the way
the apache/kafka image does (`kafka.docker.KafkaDockerWrapper`), and compared with what `chatwoot-router kafka
--secure` serves (streams/kafka/secure.py)."""

from __future__ import annotations

import re
import shlex
import stat
from pathlib import Path
from typing import Any

import pytest
import yaml
from cryptography import x509

from projections.acls import SERVICE_ROLES, Role
from streams.kafka.secrets_cmd import NODE_CLIENT, SCRAM_DIR, write_secrets
from streams.kafka.secure import AUTHORIZER, MECHANISM, PROPERTIES_FILES
from streams.kafka.tls import NODE_PRINCIPAL
from tests.support.processes import ROOT

pytestmark = pytest.mark.unit

FILES = ("docker-compose.yml", "docker-compose.cluster.yml", "docker-compose.secure.yml")
SECRETS = "/etc/kafka/secrets"  # where every container mounts the volume kafka-secrets
NODES = ("kafka", "kafka-2", "kafka-3")
ROUTER_IMAGE = "chatwoot-router:local"
ROLE_OF = {"ingress": Role.INGRESS, "worker-1": Role.WORKER, "worker-2": Role.WORKER, "console": Role.READER}
ONE_SHOT = {"kafka-secrets", "kafka-users", "kafka-setup"}


def merge(base: Any, override: Any) -> Any:
    """Compose's merge, as far as these files need it: mappings key by key, sequences appended, scalars replaced."""
    if isinstance(base, dict) and isinstance(override, dict):
        return {key: merge(base[key], value) if key in base else value for key, value in {**base, **override}.items()}
    if isinstance(base, list) and isinstance(override, list):
        return base + [item for item in override if item not in base]
    return override


@pytest.fixture(scope="module")
def services() -> dict[str, dict[str, Any]]:
    merged: dict[str, Any] = {}
    for name in FILES:
        merged = merge(merged, yaml.safe_load((ROOT / name).read_text(encoding="utf-8")))
    return merged["services"]


def environment(service: dict[str, Any]) -> dict[str, str]:
    return {key: str(value) for key, value in (service.get("environment") or {}).items()}


def image_properties(env: dict[str, str]) -> dict[str, str]:
    """Server properties from KAFKA_* variables as the image's KafkaDockerWrapper makes them (KAFKA_OPTS and the
    other JVM variables are not properties)."""
    jvm = {"KAFKA_VERSION", "KAFKA_HEAP_OPTS", "KAFKA_LOG4J_OPTS", "KAFKA_OPTS", "KAFKA_JMX_OPTS"}
    jvm |= {"KAFKA_JVM_PERFORMANCE_OPTS", "KAFKA_GC_LOG_OPTS", "KAFKA_LOG4J_ROOT_LOGLEVEL", "KAFKA_LOG4J_LOGGERS"}
    jvm |= {"KAFKA_TOOLS_LOG4J_LOGLEVEL", "KAFKA_JMX_HOSTNAME"}
    properties = {}
    for key, value in env.items():
        if key.startswith("KAFKA_") and key not in jvm:
            name = key.replace("KAFKA_", "").lower().replace("_", ".").replace("...", "-").replace("..", "_")
            properties[name] = value
    return properties


def listeners(value: str) -> dict[str, str]:
    """`NAME://host:port,…` as {NAME: host:port}."""
    return dict(entry.split("://", 1) for entry in value.split(","))


def test_every_process_of_the_router_runs_under_its_roles_properties_file(services: dict[str, Any]) -> None:
    for name, role in ROLE_OF.items():
        env = environment(services[name])
        assert env["KAFKA_CLIENT_PROPERTIES"] == f"{SECRETS}/clients/{PROPERTIES_FILES[role]}", name
        assert env["KAFKA_BOOTSTRAP_SERVERS"] == "kafka:9092,kafka-2:9092,kafka-3:9092", name
        assert f"kafka-secrets:{SECRETS}:ro" in services[name]["volumes"], name
        assert services[name]["depends_on"]["kafka-setup"] == {"condition": "service_completed_successfully"}, name


def test_only_the_setup_job_holds_the_admins_file_and_no_router_client_is_left_plaintext(
    services: dict[str, Any],
) -> None:
    admin = f"{SECRETS}/clients/{PROPERTIES_FILES[Role.ADMIN]}"
    users = {name for name, service in services.items() if environment(service).get("KAFKA_CLIENT_PROPERTIES") == admin}
    assert users == {"kafka-setup"}
    for name, service in services.items():
        if service.get("image") == ROUTER_IMAGE and name not in {"sandbox", "kafka-secrets"}:
            assert "KAFKA_CLIENT_PROPERTIES" in environment(service), f"{name} would connect in plaintext"
        if name not in {"kafka-users", *NODES}:  # the setup of the users and the nodes' own health checks
            assert NODE_CLIENT not in yaml.safe_dump(service), f"{name} uses the node certificate (a super user)"


@pytest.mark.parametrize("node", NODES)
def test_every_node_serves_passwords_only_over_sasl_ssl_and_refuses_what_no_acl_allows(
    services: dict[str, Any], node: str
) -> None:
    """CLIENT is SASL_SSL; the brokers' replication and the controllers are mutual TLS (the node certificate); no
    listener is plaintext, no node holds a password."""
    env = environment(services[node])
    properties = image_properties(env)
    protocols = dict(entry.split(":", 1) for entry in properties["listener.security.protocol.map"].split(","))
    controller = properties["controller.listener.names"]
    inter_broker = properties["inter.broker.listener.name"]
    assert listeners(properties["advertised.listeners"]) == {"CLIENT": f"{node}:9092", inter_broker: f"{node}:9094"}
    served = set(listeners(properties["listeners"]))
    assert served == {"CLIENT", inter_broker, controller}
    assert {name: protocols[name] for name in served} == {"CLIENT": "SASL_SSL", inter_broker: "SSL", controller: "SSL"}
    for name in (inter_broker, controller):
        assert properties[f"listener.name.{name.lower()}.ssl.client.auth"] == "required", name
    assert properties["listener.name.client.ssl.client.auth"] == "none"  # the password is the client's proof
    # the image's start script wants a JKS keystore with passwords for any advertised "SSL://"; PEM has none
    assert "SSL://" not in env["KAFKA_ADVERTISED_LISTENERS"]
    assert "ssl.keystore.password" not in properties and "ssl.key.password" not in properties
    assert properties["sasl.enabled.mechanisms"] == MECHANISM
    login = properties[f"listener.name.client.{MECHANISM.lower()}.sasl.jaas.config"]
    assert login == "org.apache.kafka.common.security.scram.ScramLoginModule required;"  # no user: a server only
    assert properties["ssl.keystore.type"] == properties["ssl.truststore.type"] == "PEM"
    assert properties["ssl.keystore.location"] == f"{SECRETS}/tls/node-keystore.pem"
    assert properties["ssl.endpoint.identification.algorithm"] == "https"
    assert properties["authorizer.class.name"] == AUTHORIZER
    assert properties["allow.everyone.if.no.acl.found"] == "false"
    assert set(properties["super.users"].split(";")) == {f"User:{Role.ADMIN.value}", NODE_PRINCIPAL}
    assert not any("password" in value.lower() for value in env.values()), "a password in a node's environment"
    assert f"kafka-secrets:{SECRETS}:ro" in services[node]["volumes"]
    assert "ports" not in services[node]


def test_the_jobs_make_certificates_for_every_node_then_the_users_then_the_roles_acls(
    services: dict[str, Any],
) -> None:
    made = shlex.split(services["kafka-secrets"]["command"][0])
    assert made[:2] == ["chatwoot-router", "kafka-secrets"]
    assert made[made.index("--out") + 1] == SECRETS
    assert set(made[made.index("--hosts") + 1].split(",")) == set(NODES)
    users = services["kafka-users"]["command"][0]
    internal = [listeners(environment(services[node])["KAFKA_ADVERTISED_LISTENERS"])["INTERNAL"] for node in NODES]
    assert f"--bootstrap-server {','.join(internal)}" in users
    assert f"{SECRETS}/{SCRAM_DIR}/*.properties" in users and f"--command-config {SECRETS}/{NODE_CLIENT}" in users
    assert services["kafka-setup"]["depends_on"]["kafka-users"] == {"condition": "service_completed_successfully"}
    setup = services["kafka-setup"]["command"][0]
    granted = dict(re.findall(r"--(\w+) (User:\S+)", setup))
    assert granted == {role.value: f"User:{role.value}" for role in SERVICE_ROLES if role is not Role.ADMIN}
    assert "--apply" in setup and "config apply" in setup
    for name in ONE_SHOT:
        assert services[name]["restart"] == "no", name


def test_kafka_secrets_writes_the_files_the_compose_file_names(tmp_path: Path) -> None:
    out = tmp_path / "secrets"
    setup = write_secrets(out, list(NODES))
    sans = x509.load_pem_x509_certificate(setup.tls.keystore.read_bytes()).extensions.get_extension_for_class(
        x509.SubjectAlternativeName
    )
    assert set(sans.value.get_values_for_type(x509.DNSName)) == {*NODES, "localhost"}
    for role in SERVICE_ROLES:
        properties = (out / "clients" / PROPERTIES_FILES[role]).read_text(encoding="utf-8")
        assert f"ssl.truststore.location={out.resolve()}/clients/ca.pem" in properties
        password = setup.passwords[role]
        assert f'username="{role.value}" password="{password}"' in properties
        scram = out / SCRAM_DIR / f"{role.value}.properties"
        assert scram.read_text(encoding="utf-8") == f"{MECHANISM}=password={password}\n"
        assert stat.S_IMODE(scram.stat().st_mode) == 0o600
    node = (out / NODE_CLIENT).read_text(encoding="utf-8")
    assert "security.protocol=SSL" in node and f"ssl.keystore.location={setup.tls.keystore}" in node
    again = write_secrets(out, list(NODES))  # a second `up`: the same CA, node certificate and passwords
    assert again.passwords == setup.passwords
    assert again.tls.ca.read_bytes() == setup.tls.ca.read_bytes()
    assert again.tls.keystore.read_bytes() == setup.tls.keystore.read_bytes()
