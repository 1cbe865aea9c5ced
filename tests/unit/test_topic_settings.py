"""The settings every topic gets and the check of existing topics (issue 26 item 1), without a broker.

A "stock" topic below is what a stock Kafka broker gives a topic created with only a partition count:
`retention.ms` 7 days, `min.insync.replicas` 1, `cleanup.policy` delete, unclean leader election off.
"""

from __future__ import annotations

import pytest

from handlers.kafka.topics import configured_erasure_deadline_ms
from projections.topic_settings import (
    DLQ_RETENTION_MS,
    EFFECTS_RETENTION_MS,
    ERASURE_DEADLINE_MS,
    TABLES,
    Finding,
    Kind,
    TopicState,
    app_topics,
    check_topics,
    corrections,
    human_ms,
    kind_of,
    min_insync_for,
    replication_for,
    topic_configs,
)
from schemas.config import ConfigError, read_env
from streams.admin.forget_cmd import erasure_deadline
from streams.worker.env import read_worker_env

APP = "prod.router"
WEEK = str(7 * 86_400_000)
STOCK = {
    "retention.ms": WEEK,
    "retention.bytes": "-1",
    "cleanup.policy": "delete",
    "min.insync.replicas": "1",
    "unclean.leader.election.enable": "false",
}


def stock(name: str, partitions: int = 6, replication: int = 3, **configs: str) -> TopicState:
    settings = dict(STOCK)
    settings.update({key.replace("_", "."): value for key, value in configs.items()})
    return TopicState(name, partitions, replication, settings)


def as_created(
    app_id: str,
    brokers: int,
    partitions: int = 6,
    log_retention_ms: int | None = None,
    erasure_deadline_ms: int = ERASURE_DEADLINE_MS,
) -> dict:
    """Every topic of the app with exactly the settings the router creates it with."""
    replication = replication_for(brokers)
    topics = {}
    for name, kind in app_topics(app_id).items():
        count = 1 if kind is Kind.CONFIGS else partitions
        configs = topic_configs(kind, replication, log_retention_ms, erasure_deadline_ms)
        topics[name] = TopicState(name, count, replication, configs)
    return topics


def by_setting(findings: list[Finding]) -> dict[tuple[str, str], Finding]:
    return {(finding.topic, finding.setting): finding for finding in findings}


def test_every_topic_of_the_app_has_a_kind_read_back_from_its_name() -> None:
    names = app_topics(APP)
    assert len(names) == 6 + len(TABLES)
    assert names[f"{APP}.conversations"] is Kind.CONVERSATIONS
    assert names[f"{APP}-timers-changelog"] is Kind.CHANGELOG
    assert all(kind_of(name) is kind for name, kind in names.items())
    assert kind_of(f"{APP}.something-else") is None
    assert kind_of(f"{APP}-unknown_table-changelog") is None


@pytest.mark.parametrize(("brokers", "replication", "min_isr"), [(1, 1, 1), (2, 2, 2), (3, 3, 2), (7, 3, 2)])
def test_replication_and_min_insync_follow_the_cluster(brokers: int, replication: int, min_isr: int) -> None:
    assert replication_for(brokers) == replication
    assert min_insync_for(replication) == min_isr
    assert topic_configs(Kind.EFFECTS, replication)["min.insync.replicas"] == str(min_isr)


def test_the_settings_of_each_kind() -> None:
    log = topic_configs(Kind.CONVERSATIONS, 3)
    assert log == {
        "min.insync.replicas": "2",
        "unclean.leader.election.enable": "false",
        "cleanup.policy": "delete",
        "retention.ms": "-1",
        "retention.bytes": "-1",
    }
    assert topic_configs(Kind.SWEEPS, 3) == log  # the sweeps log carries the partitions' config markers
    assert topic_configs(Kind.CONVERSATIONS, 3, log_retention_ms=86_400_000)["retention.ms"] == "86400000"
    assert topic_configs(Kind.EFFECTS, 3)["retention.ms"] == str(EFFECTS_RETENTION_MS)
    assert topic_configs(Kind.DLQ, 3)["retention.ms"] == str(DLQ_RETENTION_MS)
    for kind in (Kind.CONFIGS, Kind.CHANGELOG):
        configs = topic_configs(kind, 3)
        assert configs["cleanup.policy"] == "compact" and "retention.ms" not in configs
    assert topic_configs(None, 1) == {"min.insync.replicas": "1", "unclean.leader.election.enable": "false"}


@pytest.mark.parametrize("brokers", [1, 3])
def test_topics_as_the_router_creates_them_have_no_finding(brokers: int) -> None:
    assert check_topics(APP, as_created(APP, brokers), brokers) == []
    retained = as_created(APP, brokers, log_retention_ms=30 * 86_400_000)
    assert check_topics(APP, retained, brokers, log_retention_ms=30 * 86_400_000) == []


def test_missing_topics_are_not_findings() -> None:
    assert check_topics(APP, {}, 3) == []
    only_log = {f"{APP}.conversations": as_created(APP, 3)[f"{APP}.conversations"]}
    assert check_topics(APP, only_log, 3) == []


def test_a_stock_cluster_is_named_setting_by_setting() -> None:
    topics = {name: stock(name) for name in app_topics(APP)}
    topics[f"{APP}.configs"] = stock(f"{APP}.configs", partitions=1)
    found = by_setting(check_topics(APP, topics, brokers=3))
    log = found[(f"{APP}.conversations", "retention.ms")]
    assert log.value == f"{WEEK} (7 days)" and log.wanted == "-1" and log.risk and log.fixable
    assert "ROUTER_LOG_RETENTION_MS" in log.fix and "topics --fix" in log.fix
    assert found[(f"{APP}.sweeps", "retention.ms")].wanted == "-1"
    isr = found[(f"{APP}.conversations", "min.insync.replicas")]
    assert (isr.value, isr.wanted, isr.risk) == ("1", "2", True)
    assert found[(f"{APP}.configs", "cleanup.policy")].wanted == "compact"
    assert found[(f"{APP}-conversation_state-changelog", "cleanup.policy")].wanted == "compact"
    assert (f"{APP}.effects", "retention.ms") not in found  # 7 days is the router's own choice for effects
    dlq = found[(f"{APP}.dlq", "retention.ms")]
    assert dlq.wanted == str(DLQ_RETENTION_MS) and dlq.risk
    assert not any(f.setting == "partitions" for f in found.values())
    fixes = corrections(found.values())
    assert fixes[f"{APP}.conversations"] == {"retention.ms": "-1", "min.insync.replicas": "2"}
    assert all(f.fixable for f in found.values())


def test_fixing_every_finding_leaves_nothing_to_fix() -> None:
    topics = {name: stock(name, unclean_leader_election_enable="true") for name in app_topics(APP)}
    topics[f"{APP}.configs"] = stock(f"{APP}.configs", partitions=1)
    for topic, settings in corrections(check_topics(APP, topics, 3)).items():
        state = topics[topic]
        topics[topic] = TopicState(topic, state.partitions, state.replication, {**state.configs, **settings})
    assert check_topics(APP, topics, 3) == []


def test_an_operator_chosen_log_retention_is_not_a_finding_but_a_shorter_one_is() -> None:
    month = 30 * 86_400_000
    name = f"{APP}.conversations"
    assert check_topics(APP, {name: stock(name, min_insync_replicas="2", retention_ms=str(month))}, 3, month) == []
    shorter = check_topics(APP, {name: stock(name, min_insync_replicas="2")}, 3, log_retention_ms=month)
    assert [(f.setting, f.wanted, f.risk) for f in shorter] == [("retention.ms", str(month), True)]
    longer = check_topics(APP, {name: stock(name, min_insync_replicas="2", retention_ms="-1")}, 3, month)
    assert [(f.setting, f.risk) for f in longer] == [("retention.ms", False)]  # differs, loses nothing


def test_settings_that_lose_history_or_writes() -> None:
    topics = {
        f"{APP}.conversations": stock(f"{APP}.conversations", retention_ms="-1", cleanup_policy="compact"),
        f"{APP}.effects": stock(f"{APP}.effects", min_insync_replicas="4", unclean_leader_election_enable="true"),
        f"{APP}-timers-changelog": stock(f"{APP}-timers-changelog", cleanup_policy="compact,delete"),
        f"{APP}.dlq": stock(f"{APP}.dlq", retention_ms="-1", retention_bytes="1073741824"),
    }
    found = by_setting(check_topics(APP, topics, 3))
    assert "compaction keeps one record per key" in found[(f"{APP}.conversations", "cleanup.policy")].why
    assert "every acks=all write is refused" in found[(f"{APP}.effects", "min.insync.replicas")].why
    assert found[(f"{APP}.effects", "unclean.leader.election.enable")].wanted == "false"
    assert found[(f"{APP}-timers-changelog", "cleanup.policy")].wanted == "compact"
    assert found[(f"{APP}.dlq", "retention.bytes")].wanted == "-1"
    assert (f"{APP}.dlq", "retention.ms") not in found  # a dead letter kept forever is the operator's call
    assert all(f.risk for f in found.values())


def test_a_policy_written_in_another_order_is_the_same_policy() -> None:
    name = f"{APP}-timers-changelog"
    state = stock(name, cleanup_policy="compact", min_insync_replicas="2")
    assert check_topics(APP, {name: state}, 3) == []
    both = check_topics(APP, {name: stock(name, cleanup_policy="delete, compact", min_insync_replicas="2")}, 3)
    assert [f.setting for f in both] == ["cleanup.policy"]


def test_effects_kept_forever_differs_without_risk() -> None:
    name = f"{APP}.effects"
    found = check_topics(APP, {name: stock(name, retention_ms="-1", min_insync_replicas="2")}, 3)
    assert [(f.setting, f.wanted, f.risk) for f in found] == [("retention.ms", str(EFFECTS_RETENTION_MS), False)]


def test_partition_counts_of_co_partitioned_topics_must_agree() -> None:
    topics = as_created(APP, 3, partitions=12)
    for name in (f"{APP}.effects", f"{APP}-sweep_state-changelog", f"{APP}.dlq"):
        topics[name] = TopicState(name, 6, 3, topics[name].configs)
    topics[f"{APP}.configs"] = TopicState(f"{APP}.configs", 3, 3, topics[f"{APP}.configs"].configs)
    found = [f for f in check_topics(APP, topics, 3) if f.setting == "partitions"]
    assert sorted(f.topic for f in found) == sorted(
        [f"{APP}.effects", f"{APP}-sweep_state-changelog", f"{APP}.configs"]
    )  # the dlq is not co-partitioned: any count will do
    assert all(not f.fixable and f.risk for f in found)
    effects = next(f for f in found if f.topic == f"{APP}.effects")
    assert effects.value == "6" and "12" in effects.why and "never change the count" in effects.fix
    assert corrections(found) == {}


def test_too_few_replicas_is_reported_with_the_manual_fix() -> None:
    name = f"{APP}.conversations"
    found = check_topics(APP, {name: stock(name, replication=1, retention_ms="-1")}, brokers=3)
    assert [(f.setting, f.value, f.fixable) for f in found] == [("replication", "1", False)]
    assert "kafka-reassign-partitions" in found[0].fix
    # min.insync.replicas 1 is all a single replica allows: not a finding of its own


@pytest.mark.parametrize(
    ("value", "shown"),
    [
        ("-1", "-1 (forever)"),
        (WEEK, f"{WEEK} (7 days)"),
        ("7200000", "7200000 (2 hours)"),
        ("1234", "1234"),
        (None, "unset"),
    ],
)
def test_retentions_are_shown_with_their_meaning(value: str | None, shown: str) -> None:
    assert human_ms(value) == shown


def test_the_log_retention_variable() -> None:
    assert read_env({}).log_retention_ms is None
    assert read_env({"ROUTER_LOG_RETENTION_MS": " 2592000000 "}).log_retention_ms == 2_592_000_000
    assert read_worker_env({"ROUTER_LOG_RETENTION_MS": "86400000"}).log_retention_ms == 86_400_000
    for bad in ("-1", "0", "1000", "30d", "1e9", "²", "999999999999"):
        with pytest.raises(ConfigError) as caught:
            read_env({"ROUTER_LOG_RETENTION_MS": bad})
        assert str(caught.value).startswith("Invalid environment: ROUTER_LOG_RETENTION_MS: must be a whole number")


def test_the_keys_topic_is_compacted_within_the_erasure_deadline() -> None:
    keys = topic_configs(Kind.KEYS, 3)
    assert keys["cleanup.policy"] == "compact" and keys["max.compaction.lag.ms"] == str(ERASURE_DEADLINE_MS)
    assert "segment.ms" not in keys  # Kafka rolls a compacted topic's active segment at max.compaction.lag.ms
    assert topic_configs(Kind.KEYS, 3, erasure_deadline_ms=3_000)["max.compaction.lag.ms"] == "3000"
    assert all("max.compaction.lag.ms" not in topic_configs(k, 3, None, 3_000) for k in Kind if k is not Kind.KEYS)


def test_the_check_holds_the_keys_topic_to_the_configured_deadline() -> None:
    name = f"{APP}.keys"
    made = as_created(APP, 3, erasure_deadline_ms=3_000)
    assert check_topics(APP, made, 3, erasure_deadline_ms=3_000) == []
    assert check_topics(APP, made, 3) == []  # compacted sooner than the default promises: not a finding
    week = as_created(APP, 3)
    found = by_setting(check_topics(APP, week, 3, erasure_deadline_ms=3_000))
    lag = found[(name, "max.compaction.lag.ms")]
    assert (lag.value, lag.wanted, lag.risk) == (f"{WEEK} (7 days)", "3000", True)
    assert "ROUTER_ERASURE_DEADLINE_MS" in lag.fix and "topics --fix" in lag.fix
    assert corrections([lag]) == {name: {"max.compaction.lag.ms": "3000"}}
    unset = {name: TopicState(name, 6, 3, {**made[name].configs, "max.compaction.lag.ms": None})}
    assert [f.value for f in check_topics(APP, unset, 3)] == ["unset"]


def test_the_erasure_deadline_variable() -> None:
    assert read_env({}).erasure_deadline_ms == ERASURE_DEADLINE_MS == 7 * 86_400_000
    assert read_env({"ROUTER_ERASURE_DEADLINE_MS": " 86400000 "}).erasure_deadline_ms == 86_400_000
    assert configured_erasure_deadline_ms({}) == ERASURE_DEADLINE_MS
    assert configured_erasure_deadline_ms({"ROUTER_ERASURE_DEADLINE_MS": "3000", "ROUTER_PARTITIONS": "x"}) == 3000
    for bad in ("-1", "0", "999", "2592000001", "7d", "1e6", "²"):
        with pytest.raises(ConfigError) as caught:
            configured_erasure_deadline_ms({"ROUTER_ERASURE_DEADLINE_MS": bad})
        assert str(caught.value).startswith("Invalid environment: ROUTER_ERASURE_DEADLINE_MS: must be a whole number")


def test_forget_promises_the_configured_deadline_unless_the_brokers_compact_later() -> None:
    assert erasure_deadline(3_000, None) == (3_000, None)
    assert erasure_deadline(3_000, 1_000) == (3_000, None)  # sooner than promised keeps the promise
    promised, warning = erasure_deadline(86_400_000, 7 * 86_400_000)
    assert promised == 7 * 86_400_000
    assert warning is not None and "topics --fix" in warning
    assert "max.compaction.lag.ms=604800000 (7 days)" in warning and "ROUTER_ERASURE_DEADLINE_MS=86400000" in warning
