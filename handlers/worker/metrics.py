"""Prometheus metrics of the worker (DESIGN §3 `GET /metrics`, behavior.md §11), in a registry of their own.

Labels are closed sets (event types, ops, error classes, turn results, handoff reasons, topics), never ids,
so cardinality stays bounded however many conversations pass through.
"""

from __future__ import annotations

from collections.abc import Callable

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from handlers.clients.budget import RequestBudget
from projections.guard import STUCK_AFTER_FAILURES
from schemas.records import EffectOutcome, TurnOutcome

_LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120)


def outcome_class(outcome: EffectOutcome) -> str:
    """The outcome's class for metrics: ok, or the error kind (missing, failed, timeout, unconfirmed)."""
    return "ok" if outcome.error is None else outcome.error.kind


class WorkerMetrics:
    """Counters, histograms and gauges of one worker process."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.events_folded = Counter(
            "router_events_folded_total", "events applied by the folds", ["topic", "type"], registry=r
        )
        self.commands = Counter(
            "router_effect_commands_total",
            "effect commands issued (sent, or run at once as chained reads)",
            ["op"],
            registry=r,
        )
        self.outcomes = Counter(
            "router_effect_outcomes_total", "effect outcomes by op and class", ["op", "class"], registry=r
        )
        self.effect_seconds = Histogram(
            "router_effect_seconds",
            "time to execute one effect command",
            ["op"],
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.handle_seconds = Histogram(
            "router_record_seconds",
            "time an agent spends on one record (decode, fold, writes, sends)",
            ["agent"],
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.turns = Counter("router_turn_outcomes_total", "route runs ended, by result", ["result"], registry=r)
        self.handoffs = Counter("router_handoffs_total", "handoffs by reason", ["reason"], registry=r)
        self.replies_sent = Counter("router_replies_sent_total", "canned replies created in Chatwoot", registry=r)
        self.dlq = Counter("router_dlq_records_total", "records sent to the DLQ", ["topic"], registry=r)
        self.timers_fired = Counter("router_timers_fired_total", "TimerFired events emitted", ["topic"], registry=r)
        self.runs_resumed = Counter(
            "router_runs_resumed_total", "runs resumed at once after their partition moved here", registry=r
        )
        self.commands_chained = Counter(
            "router_effect_commands_chained_total",
            "reads run right after the conversation's previous command, without a trip through the effects topic",
            ["op"],
            registry=r,
        )
        self.commands_dropped = Counter(
            "router_effect_commands_dropped_total",
            "commands consumed but not executed: stale (the run moved on), redelivered (already started), "
            "stale_read (a mutation whose fresh read was older than ROUTER_FRESH_READ_MS) or catching_up (a "
            "mutation whose partition was not folded up to the head seen at assignment within that time)",
            ["op", "reason"],
            registry=r,
        )
        self.read_age = Histogram(
            "router_mutation_read_age_seconds",
            "age of the fresh read a mutation depends on when the mutation is made (its bound: ROUTER_FRESH_READ_MS)",
            ["op"],
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.records_skipped = Counter(
            "router_records_skipped_total",
            "records delivered again after they were folded, skipped",
            ["topic"],
            registry=r,
        )
        self.offset_gaps = Counter(
            "router_offset_gaps_total",
            "records handed over past the expected offset (a gap, then read)",
            ["topic"],
            registry=r,
        )
        self.gap_records = Counter(
            "router_gap_records_total",
            "records read past the consumer to fill a gap, then folded",
            ["topic"],
            registry=r,
        )
        self.config_switches = Counter(
            "router_config_switches_total", "ConfigApplied markers folded (a partition switched version)", registry=r
        )
        self.cache_writes = Counter(
            "router_cache_writes_total",
            "state and timers records the write cache wrote at commits (one per key changed since the last)",
            registry=r,
        )
        self.broker_up = Gauge("router_broker_up", "1 while the broker answered the last metadata probe", registry=r)
        self.broker_up.set(1)
        self.timers_pending = Gauge("router_timers_pending", "keys with a durable timer on this worker", registry=r)
        self.agent_errors = Counter(
            "router_agent_errors_total", "unexpected errors caught in agents", ["agent"], registry=r
        )
        self.sweeps_requested = Counter(
            "router_sweeps_requested_total", "sweep requests written by the leader", registry=r
        )
        self.stuck = Gauge(
            "router_stuck_conversations",
            "conversations on this worker whose last three or more runs failed in a row, by last reason "
            "(Decisions 9: e.g. an inbox linked to another account's bot, a malformed message page)",
            ["reason"],
            registry=r,
        )
        self._stuck: dict[str, str] = {}
        self.commands_held = Counter(
            "router_commands_held_total",
            "commands that waited because Chatwoot's version is below the minimum or unknown (not run meanwhile)",
            registry=r,
        )
        self.chatwoot_ok = Gauge(
            "router_chatwoot_version_ok", "1 while Chatwoot reports a version the router supports", registry=r
        )
        self.commits_clamped = Counter(
            "router_commits_clamped_total",
            "offset commits Faust asked for past the last record the worker folded, committed no further",
            ["topic"],
            registry=r,
        )
        self.consumer_lag = Gauge(
            "router_consumer_lag", "records not yet consumed, summed over owned partitions", ["topic"], registry=r
        )
        # Chatwoot's rate limit (handlers/clients/budget.py): read from the budget when scraped
        self.chatwoot_rate = Gauge(
            "router_chatwoot_requests_per_min", "this worker's share of the Chatwoot request budget", registry=r
        )
        self.chatwoot_throttled = Gauge(
            "router_chatwoot_throttled_total", "429 answers from Chatwoot (its rate limit) since start", registry=r
        )
        self.chatwoot_throttle_wait = Gauge(
            "router_chatwoot_budget_wait_seconds_total",
            "seconds Chatwoot requests waited for the request budget since start, summed over requests",
            registry=r,
        )
        self.chatwoot_paused = Gauge(
            "router_chatwoot_paused_seconds", "seconds left of the pause after Chatwoot's last 429", registry=r
        )

    def watch_budget(self, budget: RequestBudget) -> None:
        """Serve the Chatwoot budget's figures (it keeps them; the metrics read them when scraped)."""
        self.chatwoot_rate.set_function(lambda: budget.stats.per_minute)
        self.chatwoot_throttled.set_function(lambda: budget.stats.throttled)
        self.chatwoot_throttle_wait.set_function(lambda: budget.stats.waited_s)
        self.chatwoot_paused.set_function(lambda: budget.paused_for_s)

    def stuck_keys(self) -> dict[str, str]:
        """The conversations currently counted as stuck, with their last failure reason."""
        return dict(self._stuck)

    def count_outcome(self, outcome: EffectOutcome, seconds: float) -> None:
        self.outcomes.labels(outcome.op, outcome_class(outcome)).inc()
        self.effect_seconds.labels(outcome.op).observe(seconds)
        if outcome.op == "create_message" and outcome.error is None:
            self.replies_sent.inc()

    def count_turn(self, outcome: TurnOutcome) -> None:
        self.turns.labels(outcome.result).inc()
        if outcome.result == "handed_off":
            self.handoffs.labels(outcome.reason or "unspecified").inc()
        self._track_stuck(outcome)

    def _track_stuck(self, outcome: TurnOutcome) -> None:
        """A conversation is stuck while its runs keep failing (three or more in a row); any other end frees it."""
        before = self._stuck.get(outcome.key)
        if outcome.result == "retry" and (outcome.failures or 0) >= STUCK_AFTER_FAILURES:
            self._stuck[outcome.key] = outcome.reason or "unspecified"
        elif outcome.result != "deferred":
            self._stuck.pop(outcome.key, None)
        after = self._stuck.get(outcome.key)
        if before != after:
            if before is not None:
                self.stuck.labels(before).dec()
            if after is not None:
                self.stuck.labels(after).inc()

    def set_lag(self, lag_by_topic: Callable[[], dict[str, int]]) -> None:
        """Refresh the lag gauges from a callable (called at scrape time by the /metrics view)."""
        for topic, lag in lag_by_topic().items():
            self.consumer_lag.labels(topic).set(lag)

    def render(self) -> bytes:
        return generate_latest(self.registry)
