"""The worker's Faust app: topics, tables, agents, the timer tick, the leader's sweep task and web views.

Only wiring lives here; what the agents do is `handlers.worker.service.WorkerService` (docs/architecture.md).

Topics (`<app>.` prefix, raw bytes, decoded by `schemas.codec`): `conversations` (the event log), `effects`
(commands), `sweeps` (sweep requests, page outcomes, sweep timers), `dlq`. All have ROUTER_PARTITIONS
partitions, so the conversation-keyed topics and `sweeps` are co-partitioned and partition *p* of each, and of
every table, is owned by one worker.

Tables (RocksDB, changelog-backed). DESIGN §5 names six tables; the folds' state lives in two here, because
the fold keeps a conversation's parts in one value so that they change atomically with the offset they last
applied, and the due times of §7 are part of that value; a third lists the keys that have a due time, a fourth
guards replies, a fifth records configuration versions:

- `conversation_state` ("acct:conv" -> `ConversationState`): `guard` is §5's `turn_guard`, `ledger` the
  `reply_ledger`, `memos` the `memo` entries, `job` + `run` the `jobs` entry; `offset` makes redelivery a no-op.
- `sweep_state` ("acct:status" -> `SweepState`): §5's `sweep_cursor` plus the sweep job and its page.
- `timers` (key -> `handlers.worker.timers.TimerKey`): the keys that have a due time, written when a key gains
  or loses one; the in-memory index is rebuilt from their states after a rebalance.
- `effect_attempts` (key -> `projections.worker.admission.Attempt`): the last command whose execution started.
- `partition_configs` ("conversations:<p>" / "sweeps:<p>" -> version): the configuration each partition is
  folded under (DESIGN §8).
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Callable
from typing import Any, cast

import faust
from faust.web import Request, Response, View

from handlers.clients.budget import budget_for
from handlers.clients.chatwoot import ChatwootClient
from handlers.kafka.authorization import mark_reported, refusal_reason
from handlers.kafka.cluster_probe import ClusterProbe
from handlers.kafka.config_store import read_book
from handlers.kafka.group_right import GroupRight, probe_topic
from handlers.kafka.security import auth_reason, faust_credentials
from handlers.kafka.topics import TABLES
from handlers.privacy.kek import KeyEncryptionKeys, require_keks
from handlers.privacy.keyring import TableKeyRing, fence_roll_every_ms
from handlers.privacy.retention import retention_ms, scan_every_s, touch_every_ms
from handlers.worker.barrier import Barrier
from handlers.worker.chatwoot_gate import ChatwootGate
from handlers.worker.effects import EffectExecutor
from handlers.worker.fencing import Fence
from handlers.worker.lanes import Lanes
from handlers.worker.metrics import WorkerMetrics
from handlers.worker.partition_reader import PartitionReader
from handlers.worker.ports import Executor
from handlers.worker.service import WorkerService, WorkerTables, wall_clock_ms
from projections.worker.offsets import TailWatch
from projections.worker.throttle import worker_rate
from schemas.config import Settings
from schemas.configs import ConfigBook, ConfigDocument, FoldSettings
from schemas.keys import partition_for
from streams.worker.adapters import FaustPartitionScope, FaustSink, FaustTable, source_record
from streams.worker.env import WorkerEnv
from streams.worker.internals import InternalsChanged, check_internals, check_scoped_write
from streams.worker.tables import Table, TableManager, compact_store, track_changelog
from streams.worker.transport import (
    broker_urls,
    forgotten_by_group,
    set_on_expelled,
    set_on_joined,
    set_pre_commit,
)

log = logging.getLogger("chatwoot_router.worker")

TICK_S = 1.0
BEAT_S = 1.0  # the fence's beat (handlers/worker/fencing.py), far below the 15 s session
BROKER_PROBE_S = 2.0  # how often the broker is probed while it answers
BROKER_RETRY_PROBE_S = 0.5  # ... and while it does not: /healthz turns 200 within about this of its return
BROKER_PROBE_TIMEOUT_S = 1.6
GROUP_RIGHT_PROBE_S = 5.0  # how often a running worker asks whether it may still be a member of its group
SHUTDOWN_DRAIN_S = 5.0
REVOKE_DRAIN_S = 5.0
EXIT_INTERNALS = 2  # a worker whose Faust does not behave as it relies on exits, like one with a bad configuration
REVOKE_DEADLINE_S = 45.0
"""A revoke (write the cache, drain, cancel) must end well inside the 60 s rebalance timeout, else the worker stops."""
HEADS_RETRY_S = 1.0  # how often the heads an assignment could not look up are asked for again
SESSION_TIMEOUT_S = 15.0
REWRAP_BATCH = 1000  # data keys wrapped again per pass while a retired key-encryption key is configured
REWRAP_EVERY_S = 60.0
REBALANCE_TIMEOUT_S = 60.0
PRODUCER_REQUEST_TIMEOUT_S = 20.0
"""aiokafka's request timeout for the producer (Faust's default is 1200 s): an unacknowledged write fails within
it, so the commit barrier (30 s) and a revoke finish inside the rebalance timeout."""
COMMIT_EVERY = 1000
"""... and after this many records, whichever comes first (Faust's `broker_commit_every`)."""
WRITE_CACHE = True
"""The commit protocol's write cache: states and `timers` entries written once per commit (docs/architecture.md
"The commit protocol"); False writes each fold step at once, as before issue 23."""
SOURCES = ("conversations", "effects", "sweeps")


class WorkerApp:
    """One worker process: the Faust app, its topics and tables, and the service its agents call."""

    def __init__(
        self,
        settings: Settings,
        env: WorkerEnv,
        *,
        web_host: str = "127.0.0.1",
        web_port: int = 6066,
        replication_factor: int = 1,
        executor: Executor | None = None,
        book: ConfigBook | None = None,
        lanes: Lanes | None = None,
        metrics: WorkerMetrics | None = None,
        now_ms: Callable[[], int] = wall_clock_ms,
        write_cache: bool = WRITE_CACHE,
        declare_topics: bool = True,
        keks: KeyEncryptionKeys | None = None,
    ) -> None:
        """`declare_topics=False`: Faust creates no topic (its leader topic, changelogs and sources were all made
        before it starts, `handlers.kafka.topics.ensure_app_topics`), so a worker without the Create right starts:
        Faust asks CreateTopics for any topic its producer's metadata does not list yet, and the broker checks the
        right before it looks whether the topic exists."""
        check_internals()  # streams/worker/internals.py: refuse a Faust or aiokafka the worker was not written for
        self.env = env
        own = ConfigDocument.of(settings.config, FoldSettings(retry_base_ms=env.retry_base_ms))
        self.reader = PartitionReader(env.bootstrap, env.app_id)
        self.cluster_probe = ClusterProbe(env.bootstrap)  # its own client: a long partition read never delays it
        self.group_right = GroupRight(env.bootstrap, env.app_id, probe_topic(env.topic("")))
        self._heads_lookup: asyncio.Future[None] | None = None
        self.tails = TailWatch()
        self.broker_ok = True
        self.barrier = Barrier()
        # a pause longer than the session, or the group's client already told it was expelled (issue 40)
        self.fence = Fence(SESSION_TIMEOUT_S, membership=lambda: forgotten_by_group(self.app))
        self.app = faust.App(
            env.app_id,
            broker=broker_urls(env.bootstrap),  # streams/worker/transport.py: the short fetch long-poll
            # TLS and SASL for Faust's consumer, producer and topic creation (handlers/kafka/security.py)
            broker_credentials=faust_credentials(),
            store="rocksdb://",
            datadir=str(env.data_dir),
            processing_guarantee="at_least_once",
            topic_partitions=env.partitions,
            topic_replication_factor=replication_factor,
            topic_allow_declare=declare_topics,
            consumer_auto_offset_reset="earliest",
            web_host=web_host,
            web_bind=web_host,
            web_port=web_port,
            web_in_thread=False,
            # only the router's own views: Faust's table and router views would serve state over HTTP
            web_router_enabled=False,
            web_tables_enabled=False,
            web_stats_enabled=False,
            web_graph_enabled=False,
            web_metrics_enabled=False,
            autodiscover=False,
            producer_acks=-1,
            # a worker killed without leaving the group holds its partitions until its session times out
            broker_session_timeout=SESSION_TIMEOUT_S,
            # ROUTER_COMMIT_INTERVAL_MS: the write cache is written and the offsets committed at least this often
            # (docs/architecture.md "The commit protocol"); it bounds the records folded again after a crash, and
            # latency never waits for it (reads come from the cache)
            broker_commit_interval=env.commit_interval_ms / 1000,
            broker_commit_every=COMMIT_EVERY,
            # ROUTER_WORKER_ID: static membership (KIP-345); a restart within the session keeps the assignment
            consumer_group_instance_id=env.worker_id,
            TableManager=TableManager,  # streams/worker/tables.py: no one-second wait before recovery starts
            Table=Table,  # streams/worker/tables.py: every changelog write's future goes to the commit barrier
            # a write aiokafka cannot deliver fails within this, under the barrier's deadline and the rebalance timeout
            producer_request_timeout=PRODUCER_REQUEST_TIMEOUT_S,
            broker_rebalance_timeout=REBALANCE_TIMEOUT_S,
        )
        track_changelog(self.app, self.barrier)
        raw: dict[str, Any] = {
            "key_type": bytes,
            "value_type": bytes,
            "key_serializer": "raw",
            "value_serializer": "raw",
        }
        self.topics = {
            name: self.app.topic(env.topic(name), partitions=env.partitions, **raw) for name in (*SOURCES, "dlq")
        }
        schema: Any = faust.Schema(key_serializer="raw", value_serializer="json")
        tables = {name: self.app.Table(name, partitions=env.partitions, schema=schema) for name in TABLES}
        # the data keys' table writes `<app>.keys` itself (issue 32), made ahead with its settings like the others
        keys_topic = self.app.topic(env.topic("keys"), partitions=env.partitions, **raw)
        self._keys_table = self.app.Table(
            "data_keys", partitions=env.partitions, schema=schema, changelog_topic=keys_topic
        )
        self._state_table = tables[TABLES[0]]
        self._scope_checked = False
        self._text_retention_ms = retention_ms(env.text_retention_days)
        states, sweep_states, timers, effect_attempts, partition_configs = (FaustTable(tables[n]) for n in TABLES)
        self.keyring = TableKeyRing(
            FaustTable(self._keys_table),
            keks if keks is not None else require_keks(),
            partition_of=lambda key: partition_for(key, env.partitions),
            scope=FaustPartitionScope(self.topics["conversations"].get_topic_name()),
            before_write=lambda: self.service.check_fence("a data key"),
            durable=lambda: self.service.keys_durable(),
            touch_every_ms=touch_every_ms(self._text_retention_ms),
        )
        chatwoot_url = settings.config.chatwoot.base_url
        self._chatwoot_api = settings.config.chatwoot.api_base
        self.version_client = ChatwootClient(chatwoot_url, "", {})  # GET /api needs no token
        self.gate = ChatwootGate(
            chatwoot_url,
            self.version_client.server_version,
            stated_version=env.chatwoot_version,
            on_change=lambda ok: self.metrics.chatwoot_ok.set(1 if ok else 0),
        )
        self.service = WorkerService(
            tables=WorkerTables(states, sweep_states, timers, effect_attempts, partition_configs),
            sink=FaustSink(self.app, self.topics, self.barrier),
            executor=executor
            if executor is not None
            else EffectExecutor(
                settings,
                keyring=self.keyring,
                fresh_read_ms=env.fresh_read_ms,
                settings_reuse_ms=env.settings_reuse_ms,
            ),
            book=book if book is not None else ConfigBook([own]),
            own_document=own,
            load_book=lambda: read_book(env.bootstrap, env.app_id),
            reader=self.reader,
            lanes=lanes,
            metrics=metrics,
            now_ms=now_ms,
            fresh_read_ms=env.fresh_read_ms,
            write_cache=write_cache,
            # the write cache writes at commit time, outside any event: it names each key's partition
            scope=FaustPartitionScope(self.topics["conversations"].get_topic_name()),
            fence=self.fence,
            source_topics=self._source_topics(),
            gate=self.gate,
            keyring=self.keyring,
            text_retention_ms=self._text_retention_ms,
        )
        set_pre_commit(self.app, self.service.before_offsets_commit)  # streams/worker/transport.py
        set_on_expelled(self.app, self.fence.expelled)  # a refused commit: no more writes, the beat stops the worker
        set_on_joined(self.app, self.fence.joined)  # a pause from the first assignment on counts
        self._wire()

    @property
    def metrics(self) -> WorkerMetrics:
        return self.service.metrics

    # --- wiring ------------------------------------------------------------------------------------------

    def _wire(self) -> None:
        app, service = self.app, self.service

        def agent(name: str, source: str) -> None:
            async def body(stream: Any) -> None:
                async for event in stream.events():
                    await service.on_record(name, source_record(event))

            app.agent(self.topics[source], name=name, concurrency=1)(body)

        agent("router", "conversations")
        agent("effects", "effects")
        agent("sweeper", "sweeps")
        app.timer(TICK_S, name="timer_tick")(self.tick)
        app.task(self.leader_sweeps)
        app.task(self.probe_broker_forever)
        app.task(self.watch_group_right)
        app.task(self.beat_forever)
        app.task(self.rewrap_forever)
        app.task(self.expire_text_forever)
        app.task(self.roll_fences_forever)
        app.task(self.gate.run)  # handlers/worker/chatwoot_gate.py: Chatwoot's version, at start and every 5 min

        worker = self

        @app.page("/healthz")
        class Healthz(View):
            async def get(self, request: Request) -> Response:
                ok = worker.ready() and worker.broker_ok and worker.gate.is_open
                body: dict[str, Any] = {"ok": ok, "kafka": worker.broker_ok, "partitions": worker.held_count()}
                if not worker.broker_ok and (reason := auth_reason(worker.env.bootstrap)) is not None:
                    body["kafka_reason"] = reason  # a refused login or certificate, in one line
                if worker.gate.reason is not None:
                    body["chatwoot"] = worker.gate.reason  # why nothing is routed, in one line
                return self.json(body, status=200 if ok else 503)

        @app.page("/metrics")
        class Metrics(View):
            async def get(self, request: Request) -> Response:
                worker.metrics.timers_pending.set(service.timers.pending())
                worker.metrics.set_lag(worker.consumer_lag)
                return self.bytes(worker.metrics.render(), content_type="text/plain; version=0.0.4")

        @app.page("/stuck")
        class Stuck(View):
            """Conversations whose runs keep failing (Decisions 9), with their last reason."""

            async def get(self, request: Request) -> Response:
                body: dict[str, Any] = {"stuck": worker.metrics.stuck_keys()}
                if worker.gate.reason is not None:
                    body["chatwoot"] = worker.gate.reason
                body["throttle"] = worker.throttle_summary()  # Chatwoot's rate limit, for the console's overview
                return self.json(body)

        app.on_before_shutdown.connect(cast(Any, self._on_shutdown))
        app.on_partitions_assigned.connect(cast(Any, self._on_assigned))
        app.on_partitions_revoked.connect(cast(Any, self._on_revoked))

    async def _on_shutdown(self, sender: Any, *args: Any, signal: Any = None, **kwargs: Any) -> None:
        """Let running effects finish briefly (their outcomes still reach Kafka), write the cache, stop the rest."""
        await self.service.drain_effects(SHUTDOWN_DRAIN_S, "at shutdown")
        await self.service.commit_cache()  # what was folded is durable before the offsets are committed at stop
        await self.service.lanes.close()
        await self.service.executor.aclose()
        if self._heads_lookup is not None:
            self._heads_lookup.cancel()
        await self.reader.close()
        await self.cluster_probe.close()
        await self.group_right.close()
        await self.version_client.aclose()

    async def _on_revoked(self, sender: Any, revoked: Any, **kwargs: Any) -> None:
        """Before partitions move, let running effects finish and their outcomes reach Kafka (bounded): the new
        owner folds them before it resumes anything. What still runs then for a revoked partition is cancelled
        (the new owner re-issues what it awaits; a recorded attempt is never made twice), so no effect of this
        worker races the new owner. The write cache is written and acknowledged first: the new owner recovers
        those states from the changelog. A revoke that outlives the rebalance timeout (the group has expelled
        this member by then) stops the worker."""
        try:
            async with asyncio.timeout(REVOKE_DEADLINE_S):
                await self._revoke(revoked)
        except TimeoutError:
            self.service.stop(f"giving partitions up took longer than {REVOKE_DEADLINE_S:g} s")

    async def _revoke(self, revoked: Any) -> None:
        await self.service.commit_cache()
        self.service.forget_states()
        self.service.catch_up.revoke()
        if self.service.lanes.pending:
            await self.service.drain_effects(REVOKE_DRAIN_S, "while partitions move")
            gone = {tp.partition for tp in revoked if tp.topic in self._source_topics()}
            partitions = self.env.partitions
            dropped = await self.service.lanes.cancel(lambda lane: partition_for(lane, partitions) in gone)
            if dropped:
                log.warning("effects of revoked partitions cancelled", extra={"dropped": dropped})
            await self.service.commit_cache()  # the barrier: outcomes of the drained effects acknowledged, or stop

    async def _on_assigned(self, sender: Any, assigned: Any, **kwargs: Any) -> None:
        """A rebalance ended: learn where each owned source partition resumes (committed offset or log start).

        Records wait until it is known (`assignment_known`): Faust may resume the streams while the lookup runs,
        and a record folded before it would be counted from the wrong start (then fetched and folded again, and
        its offset held back from the commit until then)."""
        self.service.assignment_known.clear()
        try:
            await self._learn_assignment(assigned)
        finally:
            self.service.assignment_known.set()

    async def _learn_assignment(self, assigned: Any) -> None:
        sources = self._source_topics()
        owned = [(tp.topic, tp.partition) for tp in assigned if tp.topic in sources]
        self.service.forget_states()
        self.keyring.forget_cached()  # another owner may have made or erased keys meanwhile: the table says
        conversations = [tp for tp in owned if tp[0] == self.env.topic("conversations")]
        try:
            starts = await self.reader.resume_points(owned)
        except Exception as exc:  # the first record of each partition then sets its start
            log.warning("resume points unknown after assignment", extra={"error_type": type(exc).__name__})
            starts = {}
        try:
            heads = await self.reader.heads(conversations)
        except Exception as exc:  # the partitions count as behind until a later lookup finds their heads
            log.warning("partition heads unknown after assignment", extra={"error_type": type(exc).__name__})
            heads = {}
        self.service.offsets.assign(owned, starts)
        self._share_chatwoot_budget(len(conversations))
        if conversations and not self._scope_checked:
            self._check_scope({p for _, p in conversations})
        self.service.catch_up.assign(
            frozenset(partition for _, partition in conversations),
            {tp[1]: offset for tp, offset in heads.items()},
            {tp[1]: offset for tp, offset in starts.items() if tp[0] == self.env.topic("conversations")},
        )
        if self._heads_lookup is not None:
            self._heads_lookup.cancel()
        if self.service.catch_up.unknown():
            self._heads_lookup = asyncio.ensure_future(self._look_up_heads_again(conversations))

    def throttle_summary(self) -> dict[str, float | int | None]:
        """What Chatwoot's rate limit cost this worker so far (handlers/clients/budget.py)."""
        budget = budget_for(self._chatwoot_api)
        stats = budget.stats
        return {
            "per_minute": stats.per_minute,
            "throttled": stats.throttled,
            "waited_s": round(stats.waited_s, 1),
            "paused_for_s": round(budget.paused_for_s, 1),
            "last_throttled_at": stats.last_throttled_at,
        }

    def _share_chatwoot_budget(self, owned: int) -> None:
        """This worker's share of the Chatwoot request budget: its share of the partitions (issue 30)."""
        budget = budget_for(self._chatwoot_api)
        budget.set_rate(worker_rate(self.env.chatwoot_requests_per_min, owned, self.env.partitions))
        self.metrics.watch_budget(budget)

    def _check_scope(self, partitions: set[int]) -> None:
        """Once, on the first partitions owned: a write in the write cache's partition scope lands there."""
        try:
            check_scoped_write(self._state_table, self.service.scope, frozenset(partitions))
        except InternalsChanged as exc:
            log.critical(f"{exc}: the write cache cannot be trusted; stopping")
            logging.shutdown()
            os._exit(EXIT_INTERNALS)
        self._scope_checked = True

    async def _look_up_heads_again(self, conversations: list[tuple[str, int]]) -> None:
        """Until the heads an assignment could not look up are known (or the partitions move): until then those
        partitions' mutations wait, at most until their fresh read is too old, and are then read again."""
        catch_up = self.service.catch_up
        while catch_up.unknown():
            await asyncio.sleep(HEADS_RETRY_S)
            wanted = [tp for tp in conversations if tp[1] in catch_up.unknown()]
            if not wanted:
                return
            try:
                heads = await self.reader.heads(wanted)
            except Exception as exc:  # still away: the next attempt comes HEADS_RETRY_S later
                log.warning("partition heads still unknown", extra={"error_type": type(exc).__name__})
                continue
            catch_up.learn_heads({tp[1]: offset for tp, offset in heads.items()})
            log.info("partition heads known again", extra={"partitions": len(heads)})

    # --- the timer tick and the leader's sweeps ----------------------------------------------------------

    async def tick(self) -> None:
        """Every second: emit what is due in the owned partitions and fetch again a tail the consumer missed."""
        if not self.ready():
            return
        try:
            await self.refetch_stuck_tails(self.service.now_ms())
        except Exception as exc:  # a consumer between rebalances: the next tick tries again
            log.warning("tail check skipped", extra={"error_type": type(exc).__name__})
        await self.service.fire_due_timers(self.owned_partitions(), self.app.consumer_generation_id)

    async def beat_forever(self) -> None:
        """Every second, note that the worker runs (handlers/worker/fencing.py): a task of its own, so a slow tick or a
        long await never looks like a pause; only a process that did not run at all (frozen, or its loop blocked,
        when its group heartbeat stopped too) leaves a gap. In doubt while owning partitions, it stops."""
        while True:
            # armed by the consumer's thread the moment the group first gives this worker an assignment
            # (streams/worker/transport.py: set_on_joined), and from then on for good (issue 40)
            self.fence.beat()
            if self.fence.in_doubt():
                self.service.stop(f"{self.fence.reason()}; not writing its cache")
            await asyncio.sleep(BEAT_S)

    async def rewrap_forever(self) -> None:
        """While retired key-encryption keys are configured, wrap the data keys of the partitions this worker owns
        again under the current one, a batch a minute (the rotation: docs/privacy.md); the log says how many."""
        if not self.keyring.keks.retired:
            return
        await self._recovery.completed.wait()
        while True:
            owned = self.owned_partitions() if self.ready() else frozenset()
            if owned:
                done = await self.keyring.rewrap_retired(owned, REWRAP_BATCH)
                if done:
                    log.info("data keys wrapped again under the current key-encryption key", extra={"count": done})
            await asyncio.sleep(REWRAP_EVERY_S)

    async def expire_text_forever(self) -> None:
        """With ROUTER_TEXT_RETENTION_DAYS, ask for the erasure of the text that outlived it in the partitions this
        worker owns (handlers/privacy/retention.py), a batch at a time; the log says how many."""
        retention = self._text_retention_ms
        if retention is None:
            return
        await self._recovery.completed.wait()
        while True:
            owned = self.owned_partitions() if self.ready() else frozenset()
            if owned:
                asked = await self.service.request_text_expiry(owned)
                if asked:
                    log.info("text past its retention: erasure requested", extra={"count": asked})
            await asyncio.sleep(scan_every_s(retention))

    async def roll_fences_forever(self) -> None:
        """Once an erasure's deadline has passed, write its fence again (`TableKeyRing.roll_fences`), so Kafka rolls
        the keys partition's segment and its cleaner removes the old key, and compact this worker's own store of
        that partition, so no older file of it keeps the old key either (docs/privacy.md "The erasure deadline")."""
        deadline = self.env.erasure_deadline_ms
        await self._recovery.completed.wait()
        while True:
            owned = self.owned_partitions() if self.ready() else frozenset()
            if owned:
                rolled = await self.keyring.roll_fences(owned, deadline)
                for partition in sorted(rolled):
                    await compact_store(self._keys_table, partition)
                if rolled:
                    log.info("erasure fences written again past their deadline", extra={"partitions": len(rolled)})
            await asyncio.sleep(fence_roll_every_ms(deadline) / 1000)

    async def leader_sweeps(self) -> None:
        """On start and every ROUTER_SWEEP_INTERVAL_S, the leader requests a pass per account and status."""
        await self._recovery.completed.wait()
        while True:
            if self.app.is_leader():
                await self.service.request_sweeps()
            await asyncio.sleep(self.env.sweep_interval_s)

    async def refetch_stuck_tails(self, now: int) -> None:
        """Send the consumer back to the expected offset of a partition stopped short of its last records."""
        consumer = self.app.consumer
        sources = self._source_topics()
        for tp in consumer.assignment():
            if tp.topic not in sources:
                continue
            key = (tp.topic, tp.partition)
            expected = self.service.offsets.expected(key)
            if self.tails.stuck(key, expected, consumer.highwater(tp), now) and expected is not None:
                log.warning(
                    "partition stopped short of its last records: fetching them again",
                    extra={"topic": tp.topic, "partition": tp.partition, "expected": expected},
                )
                self.metrics.offset_gaps.labels(tp.topic).inc()
                await consumer.seek(tp, expected)

    # --- health ------------------------------------------------------------------------------------------

    async def probe_broker_forever(self) -> None:
        """Probe every BROKER_PROBE_S while the cluster answers and every BROKER_RETRY_PROBE_S while it does not,
        so /healthz turns 200 again soon after the broker is back (a task, not a timer: a failing probe takes
        longer than the retry interval)."""
        while True:
            await self.probe_broker()
            await asyncio.sleep(BROKER_PROBE_S if self.broker_ok else BROKER_RETRY_PROBE_S)

    async def probe_broker(self) -> None:
        """Whether the cluster answers now: a worker that cannot reach it makes no progress (/healthz 503).

        One dead broker of several is not "unreachable" (handlers/kafka/cluster_probe.py)."""
        try:
            async with asyncio.timeout(BROKER_PROBE_TIMEOUT_S):
                await self.cluster_probe.answer()
        except Exception as exc:
            if self.broker_ok:
                log.error("broker unreachable", extra={"error_type": type(exc).__name__})
            self.broker_ok = False
            self.metrics.broker_up.set(0)
            return
        if not self.broker_ok:
            log.info("broker reachable again")
        self.broker_ok = True
        self.metrics.broker_up.set(1)

    async def watch_group_right(self) -> None:
        """Every GROUP_RIGHT_PROBE_S, whether the cluster still lets this worker's principal be a member of its group
        (handlers/kafka/group_right.py). Once that right is taken away aiokafka's coordinator stops in silence (its
        heartbeats refused), the group expels the worker and another may own its partitions: the worker stops
        without committing, in one line naming the right, the group and the principal, and the fresh start waits
        for the grant without saying it again (streams/worker_cmd.py). A probe that gets no answer is the broker
        probe's business."""
        while True:
            await asyncio.sleep(GROUP_RIGHT_PROBE_S)
            try:
                async with asyncio.timeout(GROUP_RIGHT_PROBE_S):  # not wait_for, which on 3.11 can swallow a stop
                    await self.group_right.check()
            except Exception as exc:
                line = refusal_reason(exc)
                if line is not None:
                    mark_reported(line)  # said here, in the fail-stop line
                    self.service.stop(line)

    def ready(self) -> bool:
        """Joined the group and recovered the tables (DESIGN §3 /healthz)."""
        try:
            recovered = self._recovery.completed.is_set()
        except Exception:
            return False
        return bool(recovered and not self.app.rebalancing)

    @property
    def _recovery(self) -> Any:
        return cast(Any, self.app.tables).recovery

    def _source_topics(self) -> set[str]:
        return {self.topics[name].get_topic_name() for name in SOURCES}

    def held_count(self) -> int:
        """How many partitions of `conversations` the worker holds now, recovered or not (for /healthz)."""
        try:
            return len(self.owned_partitions())
        except Exception:  # no assignment yet
            return 0

    def owned_partitions(self) -> frozenset[int]:
        """Partitions of `conversations` (and so of `sweeps` and the tables) this worker actively owns."""
        name = self.topics["conversations"].get_topic_name()
        return frozenset(tp.partition for tp in self.app.assignor.assigned_actives() if tp.topic == name)

    def consumer_lag(self) -> dict[str, int]:
        """Highwater minus next offset to read, summed per topic over assigned partitions (best effort)."""
        lag: dict[str, int] = {}
        try:
            consumer = self.app.consumer
            read = getattr(consumer, "_read_offset", {})
            sources = self._source_topics()
            for tp in consumer.assignment():
                if tp.topic not in sources:
                    continue
                highwater = consumer.highwater(tp)
                if highwater is None:
                    continue
                last = read.get(tp)
                behind = highwater - (last + 1 if last is not None else 0)
                lag[tp.topic] = lag.get(tp.topic, 0) + max(0, behind)
        except Exception:  # metrics must never break a scrape
            return lag
        return lag


def build_worker(settings: Settings, env: WorkerEnv, **kwargs: Any) -> WorkerApp:
    """Create the worker app (see WorkerApp for the keyword arguments)."""
    return WorkerApp(settings, env, **kwargs)
