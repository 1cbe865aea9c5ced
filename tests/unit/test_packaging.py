"""The project's outer contract: the command, its subcommands, and the compose file users run."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]


def test_compose_file_parses_and_names_the_cluster_services() -> None:
    compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    services = compose["services"]
    assert {"kafka", "ingress", "worker-1", "worker-2"} <= set(services)
    assert services["kafka"]["image"].startswith("apache/kafka:4.")
    assert services["kafka"]["environment"]["KAFKA_PROCESS_ROLES"] == "broker,controller"
    for name in ("ingress", "worker-1", "worker-2"):
        assert services[name]["build"] == ".", name
        assert services[name]["environment"]["KAFKA_BOOTSTRAP_SERVERS"] == "kafka:9092"
    assert services["ingress"]["command"][0] == "ingress"
    assert services["worker-1"]["command"][0] == "worker"
    assert services["sandbox"]["profiles"] == ["demo"]


def test_help_lists_the_subcommands() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "streams.cli", "--help"], capture_output=True, text=True, check=True, cwd=ROOT
    )
    for command in ("kafka", "config", "sandbox", "ingress", "topics"):
        assert command in result.stdout


def test_config_check_names_the_offending_key_path(tmp_path: Path) -> None:
    config = tmp_path / "router.yaml"
    config.write_text(
        "chatwoot: {baseUrl: 'http://127.0.0.1:3000'}\n"
        "routing:\n  botIds: {'1': 7}\n  accounts: {'1': {billing: {assignee: 0, covers: Invoices}}}\n"
    )
    result = subprocess.run(
        [sys.executable, "-m", "streams.cli", "config", "check", "--config", str(config)],
        capture_output=True, text=True, cwd=ROOT, env={"PATH": "/usr/bin:/bin"},
    )
    assert result.returncode == 2
    assert "routing.accounts.1.billing.assignee" in result.stderr


def test_cluster_compose_file_makes_three_nodes_and_points_the_router_at_all_of_them() -> None:
    """docker-compose.cluster.yml, applied on top of docker-compose.yml (`-f docker-compose.yml -f …cluster.yml`)."""
    base = yaml.safe_load((ROOT / "docker-compose.yml").read_text())["services"]
    cluster = yaml.safe_load((ROOT / "docker-compose.cluster.yml").read_text())["services"]
    nodes = {name: {**base.get(name, {}).get("environment", {}), **cluster[name]["environment"]} for name in cluster}
    kafka = {name: env for name, env in nodes.items() if name.startswith("kafka")}
    assert sorted(env["KAFKA_NODE_ID"] for env in kafka.values()) == [1, 2, 3]
    voters = {env["KAFKA_CONTROLLER_QUORUM_VOTERS"] for env in kafka.values()}
    assert voters == {"1@kafka:9093,2@kafka-2:9093,3@kafka-3:9093"}
    for name, env in kafka.items():
        assert cluster[name].get("image", base.get(name, {}).get("image", "")).startswith("apache/kafka:4.")
        assert env["KAFKA_ADVERTISED_LISTENERS"] == f"PLAINTEXT://{name}:9092"
        assert env["KAFKA_PROCESS_ROLES"] == "broker,controller"
        assert (env["KAFKA_MIN_INSYNC_REPLICAS"], env["KAFKA_OFFSETS_TOPIC_REPLICATION_FACTOR"]) == (2, 3)
    volumes = [(cluster[name].get("volumes") or base[name]["volumes"])[0].split(":")[0] for name in kafka]
    assert len(set(volumes)) == 3  # each node its own data
    for name in ("ingress", "worker-1", "worker-2"):
        assert nodes[name]["KAFKA_BOOTSTRAP_SERVERS"] == "kafka:9092,kafka-2:9092,kafka-3:9092"
        assert set(cluster[name]["depends_on"]) == set(kafka)
