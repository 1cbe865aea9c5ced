"""What every topic of an app needs from Kafka (DESIGN §4), and what is wrong with a topic as it is.

Pure: the settings the router creates each topic with, and the comparison of a described topic with them. The
I/O (create, describe, alter) is `handlers.kafka.topics`; `chatwoot-router topics [--fix]` prints and fixes.
docs/operations.md ("Topics and their settings") gives the reasons in a table; in short:

- `conversations` and `sweeps` are the event log that `replay state` folds from its first record: kept forever
  (`retention.ms=-1`, `retention.bytes=-1`) unless the operator sets ROUTER_LOG_RETENTION_MS. `sweeps` is kept
  with `conversations` because it carries the `ConfigApplied` markers that say under which configuration each
  sweeps partition is folded: a marker deleted by retention would make a rebuild fold under the first one.
- `effects` holds commands only while they are executed, and may carry a contact's identities (DESIGN §4
  "Privacy of the log"): 7 days. A command consumed later than its run's deadline is dropped as stale anyway
  and the run re-issues it, so a deleted command is never a lost action.
- `dlq` keeps dead letters 30 days, long enough to notice, fix the cause and `replay dlq`; the original record
  is still on its source topic, so nothing is lost when a dead letter expires.
- `keys` holds each conversation's data key, wrapped (issue 32): compacted, and compacted within
  `max.compaction.lag.ms` (the erasure deadline: ROUTER_ERASURE_DEADLINE_MS, 7 days by default) of an erasure
  fence replacing a key, so a destroyed key is gone from every broker by then (docs/privacy.md). No `segment.ms`
  is set: Kafka never compacts the active segment, but for a compacted topic it rolls the active segment at
  min(`segment.ms`, `max.compaction.lag.ms`) (KIP-354, `LogConfig.maxSegmentMs`), checked when a record is
  appended; a `segment.ms` of the deadline would say nothing more.
- `configs` and the tables' changelogs are compacted only (no time-based deletion): the latest value of each
  key is kept forever, and every configuration version is its own key.
- every topic: replication min(3, brokers), `min.insync.replicas` = min(2, replication), so an `acks=all`
  write acknowledged to a client is on two brokers, and no unclean leader election (an out-of-sync replica
  that became leader would drop acknowledged records).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from enum import StrEnum

# the worker's tables (DESIGN §5); each is backed by a compacted changelog topic named by `changelog_topic`
TABLES = ("conversation_state", "sweep_state", "timers", "effect_attempts", "partition_configs")

MAX_REPLICATION = 3
MIN_INSYNC = 2
FOREVER = -1
DAY_MS = 86_400_000
EFFECTS_RETENTION_MS = 7 * DAY_MS
ERASURE_DEADLINE_MS = 7 * DAY_MS
"""The default of ROUTER_ERASURE_DEADLINE_MS, `<app>.keys`'s `max.compaction.lag.ms`: an erased data key is
compacted away from every broker within this."""
DLQ_RETENTION_MS = 30 * DAY_MS

RETENTION_MS = "retention.ms"
RETENTION_BYTES = "retention.bytes"
CLEANUP_POLICY = "cleanup.policy"
MIN_ISR = "min.insync.replicas"
UNCLEAN = "unclean.leader.election.enable"
MAX_COMPACTION_LAG = "max.compaction.lag.ms"
PARTITIONS = "partitions"
REPLICATION = "replication"


class Kind(StrEnum):
    """What a topic of the app is for; `<app>.<kind>` except for the tables' changelogs."""

    CONVERSATIONS = "conversations"
    EFFECTS = "effects"
    SWEEPS = "sweeps"
    CONFIGS = "configs"
    DLQ = "dlq"
    KEYS = "keys"
    CHANGELOG = "changelog"


# the topics a worker creates with ROUTER_PARTITIONS partitions (`configs` has one partition)
WORKER_KINDS = (Kind.CONVERSATIONS, Kind.EFFECTS, Kind.SWEEPS, Kind.DLQ, Kind.KEYS)
# partition p of each of these is owned by one worker, so they must share one partition count
CO_PARTITIONED = frozenset({Kind.CONVERSATIONS, Kind.EFFECTS, Kind.SWEEPS, Kind.KEYS, Kind.CHANGELOG})
_LOG_KINDS = frozenset({Kind.CONVERSATIONS, Kind.SWEEPS})


def changelog_topic(app_id: str, table: str) -> str:
    """The name Faust gives a table's changelog topic."""
    return f"{app_id}-{table}-changelog"


def leader_topic(app_id: str) -> str:
    """The topic Faust's leader assignor declares at every start (one partition, Faust's default settings): a
    worker without Create can only start when an administrator made it ahead (`config apply`, `topics --fix`)."""
    return f"{app_id}-__assignor-__leader"


def app_topics(app_id: str) -> dict[str, Kind]:
    """Every topic of the app, in the order `chatwoot-router topics` lists them."""
    names: dict[str, Kind] = {f"{app_id}.{kind.value}": kind for kind in Kind if kind is not Kind.CHANGELOG}
    names.update({changelog_topic(app_id, table): Kind.CHANGELOG for table in TABLES})
    return names


def kind_of(name: str) -> Kind | None:
    """The kind of a topic by its name's ending (None for a topic that is not the router's)."""
    if any(name.endswith(f"-{table}-changelog") for table in TABLES):
        return Kind.CHANGELOG
    for kind in Kind:
        if kind is not Kind.CHANGELOG and name.endswith(f".{kind.value}"):
            return kind
    return None


def replication_for(brokers: int) -> int:
    """min(3, brokers): three copies where the cluster has them, and a single node still works."""
    return max(1, min(MAX_REPLICATION, brokers))


def min_insync_for(replication: int) -> int:
    """min(2, replication): an acknowledged write is on two brokers whenever there are two copies."""
    return max(1, min(MIN_INSYNC, replication))


def topic_configs(
    kind: Kind | None,
    replication: int,
    log_retention_ms: int | None = None,
    erasure_deadline_ms: int = ERASURE_DEADLINE_MS,
) -> dict[str, str]:
    """The topic-level settings the router gives a topic of `kind` (None: only the settings every topic gets);
    `erasure_deadline_ms` is ROUTER_ERASURE_DEADLINE_MS, the `max.compaction.lag.ms` of `keys`."""
    configs = {MIN_ISR: str(min_insync_for(replication)), UNCLEAN: "false"}
    if kind in (Kind.CONFIGS, Kind.CHANGELOG, Kind.KEYS):
        configs[CLEANUP_POLICY] = "compact"
        if kind is Kind.KEYS:
            configs[MAX_COMPACTION_LAG] = str(erasure_deadline_ms)
    elif kind is not None:
        retention = {
            Kind.CONVERSATIONS: log_retention_ms or FOREVER,
            Kind.SWEEPS: log_retention_ms or FOREVER,
            Kind.EFFECTS: EFFECTS_RETENTION_MS,
            Kind.DLQ: DLQ_RETENTION_MS,
        }[kind]
        configs.update({CLEANUP_POLICY: "delete", RETENTION_MS: str(retention), RETENTION_BYTES: str(FOREVER)})
    return configs


@dataclass(frozen=True)
class TopicState:
    """A topic as the brokers describe it: partitions, the fewest replicas of any partition, effective configs."""

    name: str
    partitions: int
    replication: int
    configs: Mapping[str, str | None]


@dataclass(frozen=True)
class Finding:
    """One setting of one topic that is not as the router needs it.

    `wanted` is the value `topics --fix` sets in place; None when it cannot be fixed in place (the partition
    count, the replication factor) and `fix` says what to do by hand. `risk` is True when the setting can lose
    history or acknowledged writes (or refuse writes), False when it only differs from the router's choice.
    """

    topic: str
    setting: str
    value: str
    wanted: str | None
    why: str
    fix: str
    risk: bool = True

    @property
    def fixable(self) -> bool:
        return self.wanted is not None


def check_topics(
    app_id: str,
    topics: Mapping[str, TopicState],
    brokers: int,
    log_retention_ms: int | None = None,
    erasure_deadline_ms: int = ERASURE_DEADLINE_MS,
) -> list[Finding]:
    """Every finding over the app's existing topics (missing ones are not findings: the worker creates them).
    A `keys` topic compacted within a shorter time than `erasure_deadline_ms` is not a finding."""
    found: list[Finding] = []
    kinds = app_topics(app_id)
    for name, kind in kinds.items():
        state = topics.get(name)
        if state is not None:
            found.extend(_replication_findings(state, brokers))
            found.extend(_config_findings(state, kind, log_retention_ms, erasure_deadline_ms))
    found.extend(_partition_findings([topics[n] for n, k in kinds.items() if k in CO_PARTITIONED and n in topics]))
    configs = topics.get(f"{app_id}.{Kind.CONFIGS.value}")
    if configs is not None and configs.partitions != 1:
        found.append(
            Finding(
                configs.name,
                PARTITIONS,
                str(configs.partitions),
                None,
                "configuration versions are read back in offset order, which only one partition keeps",
                "recreate the topic with 1 partition and `config apply` the configuration in force again",
            )
        )
    return found


def corrections(findings: Iterable[Finding]) -> dict[str, dict[str, str]]:
    """topic -> setting -> value: what `topics --fix` sets with incremental alter configs."""
    wanted: dict[str, dict[str, str]] = {}
    for finding in findings:
        if finding.wanted is not None:
            wanted.setdefault(finding.topic, {})[finding.setting] = finding.wanted
    return wanted


def shown_settings(kind: Kind) -> tuple[str, ...]:
    """The settings `topics` prints for a topic of `kind`: those the router sets on it."""
    return tuple(topic_configs(kind, 1))


def human_ms(value: str | None) -> str:
    """`604800000 (7 days)`: a retention as the broker says it, with its meaning."""
    if value is None:
        return "unset"
    number = _int(value)
    if number is None:
        return value
    if number < 0:
        return f"{value} (forever)"
    if number % DAY_MS == 0:
        return f"{value} ({number // DAY_MS} days)"
    if number % 3_600_000 == 0:
        return f"{value} ({number // 3_600_000} hours)"
    return value


def _int(value: str | None) -> int | None:
    try:
        return int(value) if value is not None else None
    except ValueError:
        return None


def _replication_findings(state: TopicState, brokers: int) -> list[Finding]:
    wanted = replication_for(brokers)
    if state.replication >= wanted:
        return []
    return [
        Finding(
            state.name,
            REPLICATION,
            str(state.replication),
            None,
            f"{state.replication} copies of each record although the cluster has {brokers} brokers",
            f"add replicas to {wanted} with kafka-reassign-partitions.sh (not done in place by the router)",
        )
    ]


def _config_findings(
    state: TopicState, kind: Kind, log_retention_ms: int | None, erasure_deadline_ms: int
) -> list[Finding]:
    wanted = topic_configs(kind, state.replication, log_retention_ms, erasure_deadline_ms)
    found: list[Finding] = []
    for setting, want in wanted.items():
        have = state.configs.get(setting)
        problem = _problem(kind, setting, have, want, state.replication, log_retention_ms)
        if problem is not None:
            why, risk = problem
            shown = human_ms(have) if setting in (RETENTION_MS, MAX_COMPACTION_LAG) else str(have)
            fix = f"set {setting}={want} (`chatwoot-router topics --fix`)"
            if setting == RETENTION_MS and kind in _LOG_KINDS and log_retention_ms is None:
                fix += ", or set ROUTER_LOG_RETENTION_MS to choose a finite retention"
            if setting == MAX_COMPACTION_LAG:
                fix += ", or set ROUTER_ERASURE_DEADLINE_MS to the erasure deadline you promise"
            found.append(Finding(state.name, setting, shown, want, why, fix, risk))
    return found


def _problem(
    kind: Kind, setting: str, have: str | None, want: str, replication: int, log_retention_ms: int | None
) -> tuple[str, bool] | None:
    """(why it matters, whether it risks data) when `have` is not acceptable for `setting`; None when it is."""
    if setting == MIN_ISR:
        number = _int(have)
        if number is not None and min_insync_for(replication) <= number <= replication:
            return None
        if number is not None and number > replication:
            return f"more than the {replication} replicas: every acks=all write is refused", True
        return f"an acks=all write acknowledged by {have} broker(s) can be lost with that broker's disk", True
    if setting == UNCLEAN:
        if (have or "").lower() == "false":
            return None
        return "an out-of-sync replica may become leader and drop acknowledged records", True
    if setting == CLEANUP_POLICY:
        if set((have or "").replace(" ", "").split(",")) == set(want.split(",")):
            return None
        if want == "compact":
            return "time-based deletion removes table values or configuration versions still in use", True
        return "compaction keeps one record per key and deletes the rest of the history", True
    if setting == MAX_COMPACTION_LAG:
        number = _int(have)
        if number is not None and 0 < number <= int(want):
            return None
        return f"an erased data key may stay on the brokers' disks past the erasure deadline ({human_ms(want)})", True
    if setting == RETENTION_BYTES:
        if _int(have) == FOREVER:
            return None
        return "size-based deletion removes the oldest records whatever their age", kind is not Kind.EFFECTS
    return _retention_problem(kind, have, log_retention_ms)


def _retention_problem(kind: Kind, have: str | None, log_retention_ms: int | None) -> tuple[str, bool] | None:
    number = _int(have)
    kept_ms = number if number is not None and number >= 0 else None  # None: kept forever (or not known)
    if kind in _LOG_KINDS:
        if number == (log_retention_ms if log_retention_ms is not None else FOREVER):
            return None
        if log_retention_ms is None:
            return "the event log loses its head: audits, what-if and rebuilds then see part of the history", True
        if kept_ms is not None and kept_ms < log_retention_ms:
            return f"deletes records sooner than ROUTER_LOG_RETENTION_MS={log_retention_ms} asks", True
        return f"differs from ROUTER_LOG_RETENTION_MS={log_retention_ms}", False
    if kind is Kind.EFFECTS:
        if kept_ms is not None and kept_ms <= EFFECTS_RETENTION_MS:
            return None
        return "commands (which may carry contact identities) are kept longer than they are needed", False
    # the dead-letter queue: at least DLQ_RETENTION_MS; longer (or forever) is the operator's choice
    if kept_ms is None or kept_ms >= DLQ_RETENTION_MS:
        return None
    return "dead letters may be deleted before anyone replays them", True


def _partition_findings(states: list[TopicState]) -> list[Finding]:
    """Co-partitioned topics that differ from the first one present (`conversations` when it exists)."""
    if not states:
        return []
    reference = states[0]
    return [
        Finding(
            state.name,
            PARTITIONS,
            str(state.partitions),
            None,
            f"co-partitioned with {reference.name}, which has {reference.partitions}: partition p of each must "
            "belong to the same worker",
            f"stop the workers, recreate {state.name} with {reference.partitions} partitions "
            f"(ROUTER_PARTITIONS={reference.partitions}) and run `chatwoot-router replay state`; never change "
            f"the count of {reference.name} (it would move conversations between partitions)",
        )
        for state in states[1:]
        if state.partitions != reference.partitions
    ]
