"""The local three-node cluster's configuration (streams/kafka/cluster.py), without starting it: each node a broker
and a controller of one quorum of three, replication 3 and min ISR 2 everywhere, consecutive client ports."""

from __future__ import annotations

from pathlib import Path

from streams.kafka.cluster import free_port_run, node_properties
from streams.kafka.local import port_in_use

VOTERS = "1@127.0.0.1:9100,2@127.0.0.1:9101,3@127.0.0.1:9102"


def settings(text: str) -> dict[str, str]:
    return dict(line.split("=", 1) for line in text.splitlines() if line)


def test_each_node_is_broker_and_controller_of_one_quorum_of_three(tmp_path: Path) -> None:
    node = settings(node_properties(2, 9093, 9101, VOTERS, tmp_path))
    assert node["process.roles"] == "broker,controller"
    assert node["node.id"] == "2"
    assert node["controller.quorum.voters"] == VOTERS
    assert node["listeners"] == "PLAINTEXT://127.0.0.1:9093,CONTROLLER://127.0.0.1:9101"
    assert node["advertised.listeners"] == "PLAINTEXT://127.0.0.1:9093"
    assert node["log.dirs"] == str(tmp_path)


def test_every_topic_internal_ones_included_gets_replication_3_and_min_isr_2(tmp_path: Path) -> None:
    node = settings(node_properties(1, 9092, 9100, VOTERS, tmp_path))
    for key in (
        "default.replication.factor",
        "offsets.topic.replication.factor",
        "transaction.state.log.replication.factor",
        "share.coordinator.state.topic.replication.factor",
    ):
        assert node[key] == "3", key
    for key in ("min.insync.replicas", "transaction.state.log.min.isr", "share.coordinator.state.topic.min.isr"):
        assert node[key] == "2", key
    assert node["unclean.leader.election.enable"] == "false"


def test_client_ports_are_consecutive_and_free() -> None:
    first = free_port_run(3)
    assert not any(port_in_use(first + n) for n in range(3))
