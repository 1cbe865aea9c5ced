"""The worker's Faust app: topics, tables, agents, the timer tick, the leader's sweep task and web views.

Topics (`<app>.` prefix, raw bytes, decoded by `streams.worker.codec`): `conversations` (the event log),
`effects` (commands), `sweeps` (sweep requests, page outcomes, sweep timers), `dlq`. All are created with
ROUTER_PARTITIONS partitions, so the conversation-keyed topics and `sweeps` are co-partitioned and partition
*p* of each, and of every table, is owned by one worker.

Tables (RocksDB, changelog-backed). DESIGN §5 names six tables; the folds' state lives in three here, because
the fold keeps a conversation's parts in one value so that they change atomically with the offset they last
applied (a crash between two tables' writes would otherwise leave them disagreeing); a fourth guards replies:

- `conversation_state` (key "acct:conv" -> `ConversationState`): `guard` is §5's `turn_guard`, `ledger` the
  `reply_ledger`, `memos` the `memo` entries, `job` + `run` the `jobs` entry (route job and the run in
  progress: phase, pending command, deadline, requests used); `offset` makes redelivery a no-op.
- `sweep_state` (key "acct:status" -> `SweepState`): §5's `sweep_cursor` plus the sweep job and its page.
- `timers` (key -> {"due": ms, "p": partition}): the due-time index of §7, written by the agent that folds
  the key's topic; `projections.timer_index.TimerIndex` mirrors the owned partitions in memory.
- `effect_attempts` (key -> `projections.admission.Attempt`): the last command whose execution the effect
  agent started for the key, written and flushed to Kafka before a mutation, a `decide` or a `create_message`
  is handed to the executor (reads are not recorded).

Agents: `router` (conversations, concurrency 1) folds events and emits commands; `effects` hands each
command to `handlers.lanes.Lanes` (one lane per conversation, capped per account and globally) and acks as it
dispatches, each outcome going back to its key's topic; `sweeper` (sweeps, concurrency 1) folds sweeps. A
record that cannot be decoded or folded goes to `dlq` with headers and never stalls its partition.

Failure points: a crash after a state write and before its commands are sent loses those commands; the
fold's deadline timer (or the resume after a takeover) re-issues reads and idempotent mutations, and a
`create_message` is never re-issued (the state, with its ledger entry, is flushed to Kafka before that command
is sent). A command consumed again after a crash or a partition move runs only while its run still awaits that
very copy and, unless it is a read, only if no execution of it was started before (`projections.admission`);
otherwise it is dropped and counted, and a redelivered reply comes back `unconfirmed`. A crash after commands
and before the offset commit redelivers the event; the state's offset turns it into a no-op that still
re-writes the timer. A `TimerFired` lost in a crash is emitted again after restart, because the `timers`
table still holds the due time. Every agent folds its partitions' records exactly in offset order: a record
past the expected offset makes the missing ones be read and folded first (`projections.offsets`,
docs/consumer-gaps.md).
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import Callable
from typing import Any, cast

import faust
from aiokafka.errors import KafkaError
from faust.web import Request, Response, View

from handlers.config_store import read_book
from handlers.effects import EffectExecutor
from handlers.kafka_topics import TABLES
from handlers.lanes import Lanes
from handlers.partition_reader import FetchedRecord, PartitionReader, RangeNotRead
from handlers.worker_metrics import WorkerMetrics
from projections.admission import Attempt, admit, needs_attempt_record
from projections.fold import fold_under
from projections.offsets import OffsetTracker, TailWatch
from projections.sweep import fold_sweep
from projections.timer_index import TimerIndex
from schemas.config import RouterConfig, Settings
from schemas.configs import ConfigBook, ConfigDocument, FoldSettings
from schemas.records import (
    ConfigApplied,
    EffectCommand,
    EffectError,
    EffectOutcome,
    Record,
    SweepRequested,
    TimerFired,
    TurnOutcome,
)
from schemas.state import ConversationState, SweepState
from streams.worker import fetch_latency
from streams.worker.codec import (
    Undecodable,
    check_key,
    decode_command,
    decode_conversation_event,
    decode_marker,
    decode_sweep_event,
    dlq_headers,
    encode,
)
from streams.worker.env import WorkerEnv

log = logging.getLogger("chatwoot_router.worker")

TICK_S = 1.0
BROKER_PROBE_S = 2.0
SHUTDOWN_DRAIN_S = 5.0
REVOKE_DRAIN_S = 5.0
SESSION_TIMEOUT_S = 15.0
SWEEP_STATUSES = ("pending", "open")


def wall_clock_ms() -> int:
    return time.time_ns() // 1_000_000


def is_conversation_key(key: str) -> bool:
    """Whether `key` names a conversation ("acct:conv", both numbers) rather than a sweep ("acct:open")."""
    account, _, rest = key.partition(":")
    return account.isdigit() and rest.isdigit()


class WorkerApp:
    """One worker process's Faust app and what its agents share (executor, lanes, metrics, timer index)."""

    def __init__(
        self,
        settings: Settings,
        env: WorkerEnv,
        *,
        web_host: str = "127.0.0.1",
        web_port: int = 6066,
        replication_factor: int = 1,
        executor: Any = None,
        book: ConfigBook | None = None,
        lanes: Lanes | None = None,
        metrics: WorkerMetrics | None = None,
        now_ms: Callable[[], int] = wall_clock_ms,
    ) -> None:
        self.settings = settings
        self.config = settings.config
        self.own_document = ConfigDocument.of(settings.config, FoldSettings(retry_base_ms=env.retry_base_ms))
        self.book = book if book is not None else ConfigBook([self.own_document])
        self.env = env
        self.now_ms = now_ms
        self.instance_id = uuid.uuid4().hex  # tells this process's commands from those of a dead or departed one
        self.metrics = metrics or WorkerMetrics()
        self.executor = executor if executor is not None else EffectExecutor(settings)
        self.lanes = lanes or Lanes()
        self.index = TimerIndex()
        self.offsets = OffsetTracker()
        self.tails = TailWatch()
        self.reader = PartitionReader(env.bootstrap, env.app_id)
        self.broker_ok = True
        fetch_latency.install()
        self._index_generation: int | None = None
        self._index_partitions: frozenset[int] = frozenset()
        partitions = env.partitions
        self.app = faust.App(
            env.app_id,
            broker=[f"kafka://{host.strip()}" for host in env.bootstrap.split(",") if host.strip()],
            store="rocksdb://",
            datadir=str(env.data_dir),
            processing_guarantee="at_least_once",
            topic_partitions=partitions,
            topic_replication_factor=replication_factor,
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
            # ROUTER_WORKER_ID: static membership (KIP-345); a restart within the session keeps the assignment
            consumer_group_instance_id=env.worker_id,
        )
        raw: dict[str, Any] = {
            "key_type": bytes,
            "value_type": bytes,
            "key_serializer": "raw",
            "value_serializer": "raw",
            "partitions": partitions,
        }
        self.conversations = self.app.topic(env.topic("conversations"), **raw)
        self.effects = self.app.topic(env.topic("effects"), **raw)
        self.sweeps = self.app.topic(env.topic("sweeps"), **raw)
        self.dlq = self.app.topic(env.topic("dlq"), **raw)
        table: dict[str, Any] = {
            "partitions": partitions,
            "schema": faust.Schema(key_serializer="raw", value_serializer="json"),
        }
        states, sweep_states, timers, effect_attempts, partition_configs = TABLES
        self.states = self.app.Table(states, **table)
        self.sweep_states = self.app.Table(sweep_states, **table)
        self.timers = self.app.Table(timers, **table)
        self.effect_attempts = self.app.Table(effect_attempts, **table)
        # "conversations:<p>" / "sweeps:<p>" -> the configuration version partition p is folded under (DESIGN §8)
        self.partition_configs = self.app.Table(partition_configs, **table)
        self._wire()

    # --- wiring ------------------------------------------------------------------------------------------

    def _wire(self) -> None:
        app = self.app

        @app.agent(self.conversations, name="router", concurrency=1)
        async def router(stream: Any) -> None:
            async for event in stream.events():
                await self._in_order("router", event, self.handle_conversation_event)

        @app.agent(self.effects, name="effects", concurrency=1)
        async def effects(stream: Any) -> None:
            async for event in stream.events():
                await self._in_order("effects", event, self.dispatch_command)

        @app.agent(self.sweeps, name="sweeper", concurrency=1)
        async def sweeper(stream: Any) -> None:
            async for event in stream.events():
                await self._in_order("sweeper", event, self.handle_sweep_event)

        @app.timer(TICK_S, name="timer_tick")
        async def timer_tick() -> None:
            await self.fire_due_timers()

        @app.task
        async def leader_sweeps() -> None:
            await self.run_leader_sweeps()

        @app.timer(BROKER_PROBE_S, name="broker_probe")
        async def broker_probe() -> None:
            await self.probe_broker()

        worker = self

        @app.page("/healthz")
        class Healthz(View):
            async def get(self, request: Request) -> Response:
                ok = worker.ready() and worker.broker_ok
                return self.json({"ok": ok, "kafka": worker.broker_ok}, status=200 if ok else 503)

        @app.page("/metrics")
        class Metrics(View):
            async def get(self, request: Request) -> Response:
                worker.metrics.timers_pending.set(worker.index.pending())
                worker.metrics.set_lag(worker.consumer_lag)
                return self.bytes(worker.metrics.render(), content_type="text/plain; version=0.0.4")

        @app.page("/stuck")
        class Stuck(View):
            """Conversations whose runs keep failing (Decisions 9), with their last reason."""

            async def get(self, request: Request) -> Response:
                return self.json({"stuck": worker.metrics.stuck_keys()})

        app.on_before_shutdown.connect(cast(Any, self._on_shutdown))
        app.on_partitions_assigned.connect(cast(Any, self._on_assigned))
        app.on_partitions_revoked.connect(cast(Any, self._on_revoked))

    async def _on_shutdown(self, sender: Any, *args: Any, signal: Any = None, **kwargs: Any) -> None:
        """Let running effects finish briefly (their outcomes still reach Kafka), then stop the rest."""
        try:
            await asyncio.wait_for(self.lanes.drain(), SHUTDOWN_DRAIN_S)
        except TimeoutError:
            log.warning("effects still running at shutdown", extra={"pending": self.lanes.pending})
        await self.lanes.close()
        await self.executor.aclose()
        await self.reader.close()

    # --- health ------------------------------------------------------------------------------------------

    async def probe_broker(self) -> None:
        """Whether the broker answers now: a worker that cannot reach it makes no progress (/healthz 503)."""
        try:
            await asyncio.wait_for(self.reader.probe(), BROKER_PROBE_S * 0.8)
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

    def ready(self) -> bool:
        """Joined the group and recovered the tables (DESIGN §3 /healthz)."""
        app = self.app
        try:
            recovered = self._recovery.completed.is_set()
        except Exception:
            return False
        return bool(recovered and not app.rebalancing)

    @property
    def _recovery(self) -> Any:
        return cast(Any, self.app.tables).recovery

    def owned_partitions(self) -> frozenset[int]:
        """Partitions of `conversations` (and so of `sweeps` and the tables) this worker actively owns."""
        name = self.conversations.get_topic_name()
        return frozenset(tp.partition for tp in self.app.assignor.assigned_actives() if tp.topic == name)

    def consumer_lag(self) -> dict[str, int]:
        """Highwater minus next offset to read, summed per topic over assigned partitions (best effort)."""
        lag: dict[str, int] = {}
        try:
            consumer = self.app.consumer
            read = getattr(consumer, "_read_offset", {})
            sources = {t.get_topic_name() for t in (self.conversations, self.effects, self.sweeps)}
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

    # --- in-order delivery (DESIGN §6 "No record skipped") ------------------------------------------------

    def _source_topics(self) -> set[str]:
        return {t.get_topic_name() for t in (self.conversations, self.effects, self.sweeps)}

    async def _on_revoked(self, sender: Any, revoked: Any, **kwargs: Any) -> None:
        """Before partitions move, let running effects finish and their outcomes reach Kafka (bounded).

        The new owner then folds those outcomes before it resumes anything, so an effect is not made twice by
        two processes; what runs longer than REVOKE_DRAIN_S may still be re-issued by the new owner.
        """
        if not self.lanes.pending:
            return
        try:
            await asyncio.wait_for(self.lanes.drain(), REVOKE_DRAIN_S)
        except TimeoutError:
            log.warning("effects still running while partitions move", extra={"pending": self.lanes.pending})
        await self.app.producer.flush()

    async def _on_assigned(self, sender: Any, assigned: Any, **kwargs: Any) -> None:
        """A rebalance ended: learn where each owned source partition resumes (committed offset or log start)."""
        sources = self._source_topics()
        owned = [(tp.topic, tp.partition) for tp in assigned if tp.topic in sources]
        try:
            starts = await self.reader.resume_points(owned)
        except Exception as exc:  # the first record of each partition then sets its start
            log.warning("resume points unknown after assignment", extra={"error_type": type(exc).__name__})
            starts = {}
        self.offsets.assign(owned, starts)

    async def _in_order(self, agent: str, event: Any, handler: Callable[[Any], Any]) -> None:
        """Fold `event` exactly once and in offset order: skip what was folded, read and fold a gap first."""
        message = event.message
        tp = (message.topic, message.partition)
        verdict, expected = self.offsets.check(tp, message.offset)
        if verdict == "duplicate":
            self.metrics.records_skipped.labels(message.topic).inc()
            return
        if verdict == "gap" and expected is not None:
            await self._fill_gap(agent, tp, expected, message.offset, handler)
        await self._guarded(agent, event, handler)
        self.offsets.advance(tp, message.offset)

    async def _fill_gap(
        self, agent: str, tp: tuple[str, int], start: int, end: int, handler: Callable[[Any], Any]
    ) -> None:
        """Read offsets start..end-1 of `tp` past Faust's consumer and fold them in order (never ignored)."""
        topic, partition = tp
        log.warning(
            "offset gap: reading the skipped records",
            extra={"topic": topic, "partition": partition, "expected": start, "offset": end},
        )
        self.metrics.offset_gaps.labels(topic).inc()
        attempt = 0
        while True:  # never fold past a gap: the agent waits until the broker lets it read the records
            try:
                records = await self.reader.read_range(topic, partition, start, end)
                break
            except (RangeNotRead, KafkaError, OSError) as exc:
                attempt += 1
                log.error(
                    "offset gap not read yet",
                    extra={
                        "topic": topic,
                        "partition": partition,
                        "attempt": attempt,
                        "error_type": type(exc).__name__,
                    },
                )
                await asyncio.sleep(min(0.5 * 2**attempt, 5.0))
        for record in records:
            await self._guarded(agent, record, handler)
            self.offsets.advance(tp, record.message.offset)
            self.metrics.gap_records.labels(topic).inc()

    # --- agents ------------------------------------------------------------------------------------------

    async def _guarded(self, agent: str, event: Any | FetchedRecord, handler: Callable[[Any], Any]) -> None:
        """Run one record's handler; anything that escapes sends the record to the DLQ (never stalls)."""
        message = event.message
        started = time.monotonic()
        try:
            await handler(event)
            self.metrics.handle_seconds.labels(agent).observe(time.monotonic() - started)
        except Undecodable as exc:
            await self.to_dlq(event, str(exc))
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            self.metrics.agent_errors.labels(agent).inc()
            log.error(
                "record could not be processed",
                extra={
                    "agent": agent,
                    "topic": message.topic,
                    "partition": message.partition,
                    "offset": message.offset,
                    "error_type": type(exc).__name__,
                },
            )
            await self.to_dlq(event, f"{type(exc).__name__}: processing failed")

    async def to_dlq(self, event: Any, error: str) -> None:
        message = event.message
        self.metrics.dlq.labels(message.topic).inc()
        log.warning(
            "record sent to the DLQ",
            extra={"topic": message.topic, "partition": message.partition, "offset": message.offset, "reason": error},
        )
        await self.dlq.send(
            key=event.key,
            value=event.value if event.value is not None else b"",
            headers=dlq_headers(error, message.topic, message.partition, message.offset),
        )

    # --- configuration versions (DESIGN §8) ------------------------------------------------------------

    def document_in_force(self, topic: str, partition: int) -> ConfigDocument:
        """The configuration partition `partition` of `topic` ("conversations" or "sweeps") is folded under."""
        version = self.partition_configs.get(f"{topic}:{partition}")
        return self.book.in_force(version) or self.own_document

    def latest_document(self) -> ConfigDocument:
        return self.book.latest or self.own_document

    async def switch_config(self, topic: str, partition: int, marker: ConfigApplied) -> None:
        """Fold a `ConfigApplied` marker: from the next record on, the partition uses its version."""
        if marker.version not in self.book:
            for document in (await read_book(self.env.bootstrap, self.env.app_id)).documents():
                self.book.add(document)
        if marker.version not in self.book:
            raise Undecodable(f"configuration version {marker.version} is not on the configs topic")
        self.partition_configs[f"{topic}:{partition}"] = marker.version
        self.metrics.config_switches.inc()
        log.info(
            "configuration version in force", extra={"topic": topic, "partition": partition, "version": marker.version}
        )

    async def handle_conversation_event(self, event: Any) -> None:
        marker = decode_marker(event.value)
        if marker is not None:
            await self.switch_config("conversations", event.message.partition, marker)
            return
        record = decode_conversation_event(event.value)
        check_key(event.key, record.key)
        key, partition, offset = record.key, event.message.partition, event.message.offset
        stored = self.states.get(key)
        state = ConversationState.model_validate(stored) if stored is not None else ConversationState()
        result = fold_under(self.document_in_force("conversations", partition), state, record, offset)
        # A redelivered record (already applied) re-writes the state it finds: after a SIGKILL the local store can
        # hold a value whose changelog record never left, and the changelog must get it before the offset moves
        # past this record (docs/consumer-gaps.md §2).
        redelivered = result.state is state and stored is not None
        if result.state is not state:
            self.states[key] = result.state.model_dump(mode="json")
            self.metrics.events_folded.labels("conversations", record.type).inc()
        elif redelivered:
            self.states[key] = stored
        if any(command.op == "create_message" for command in result.commands):
            await self.app.producer.flush()  # the ledger entry is durable before the reply may be sent
        await self._send_commands(result.commands)
        run = result.state.run
        self.set_timer(
            partition,
            key,
            result.wakeup_ms,
            waiting=run is not None and run.pending is not None,
            issued=bool(result.commands),
            rewrite=redelivered,
        )
        for outcome in result.outcomes:
            self.report_turn(outcome)

    async def handle_sweep_event(self, event: Any) -> None:
        marker = decode_marker(event.value)
        if marker is not None:
            await self.switch_config("sweeps", event.message.partition, marker)
            return
        record = decode_sweep_event(event.value)
        check_key(event.key, record.key)
        key, partition, offset = record.key, event.message.partition, event.message.offset
        stored = self.sweep_states.get(key)
        state = SweepState.model_validate(stored) if stored is not None else SweepState()
        document = self.document_in_force("sweeps", partition)
        result = fold_sweep(state, record, offset, document.config, retry_base_ms=document.fold.retry_base_ms)
        redelivered = result.state is state and stored is not None  # re-written: see handle_conversation_event
        if result.state is not state:
            self.sweep_states[key] = result.state.model_dump(mode="json")
            self.metrics.events_folded.labels("sweeps", record.type).inc()
        elif redelivered:
            self.sweep_states[key] = stored
        await self._send_commands(result.commands)
        for found in result.found:
            await self._send(self.conversations, found.key, found)
        self.set_timer(partition, key, result.wakeup_ms, rewrite=redelivered)

    def awaited_command(self, key: str) -> EffectCommand | None:
        """The command the key's run (or sweep page) waits for now, as the fold recorded it."""
        stored = self.states.get(key) if is_conversation_key(key) else self.sweep_states.get(key)
        if not isinstance(stored, dict):
            return None
        holder = stored.get("run") if is_conversation_key(key) else stored
        pending = holder.get("pending") if isinstance(holder, dict) else None
        return EffectCommand.model_validate(pending) if pending is not None else None

    async def dispatch_command(self, event: Any) -> None:
        """Hand a command to its lane only while its run awaits it and no execution of it started (DESIGN §6)."""
        command = decode_command(event.value)
        check_key(event.key, command.key)
        stored = self.effect_attempts.get(command.key)
        attempted = Attempt.model_validate(stored) if isinstance(stored, dict) else None
        verdict = admit(command, self.awaited_command(command.key), attempted)
        if verdict != "execute":
            self.metrics.commands_dropped.labels(command.op, verdict).inc()
            log.info(
                "command not executed",
                extra={"command_id": command.command_id, "op": command.op, "reason": verdict},
            )
            if verdict == "redelivered" and command.op == "create_message":
                # the POST may have happened, so it is never made twice (§9.7); the run checks history
                await self.lanes.submit(command.key, command.account_id, lambda: self.report_unconfirmed(command))
            return
        if needs_attempt_record(command):
            self.effect_attempts[command.key] = Attempt.of(command, self.instance_id).model_dump(mode="json")
            await self.app.producer.flush()  # the attempt is durable before the call can happen
        config = self.document_in_force("conversations", event.message.partition).config
        await self.lanes.submit(command.key, command.account_id, lambda: self.execute(command, config))

    async def report_unconfirmed(self, command: EffectCommand) -> None:
        """The outcome of a reply whose earlier attempt's result is unknown: the fold checks history or hands off."""
        log.warning("reply attempt redelivered; not sent again", extra={"key": command.key})
        error = EffectError(kind="unconfirmed", reason="redelivered after a restart; not sent again")
        outcome = EffectOutcome(
            key=command.key,
            account_id=command.account_id,
            command_id=command.command_id,
            op=command.op,
            error=error,
            at_ms=self.now_ms(),
        )
        self.metrics.count_outcome(outcome, 0.0)
        await self._send(self.conversations, command.key, outcome)

    async def execute(self, command: EffectCommand, config: RouterConfig | None = None) -> None:
        """Run one command in its lane and record its outcome as an event on the command's key."""
        started = time.monotonic()
        outcome: EffectOutcome = await self.executor.execute(command, config)
        self.metrics.count_outcome(outcome, time.monotonic() - started)
        topic = self.sweeps if command.op == "list_conversations" else self.conversations
        await self._send(topic, command.key, outcome)

    async def _send_commands(self, commands: list[EffectCommand]) -> None:
        for command in commands:
            await self._send(self.effects, command.key, command)
            self.metrics.commands.labels(command.op).inc()

    async def _send(self, topic: Any, key: str, record: Record) -> None:
        await topic.send(key=key.encode(), value=encode(record))

    # --- timers ------------------------------------------------------------------------------------------

    def set_timer(
        self,
        partition: int,
        key: str,
        due_ms: int | None,
        *,
        waiting: bool = False,
        issued: bool = False,
        rewrite: bool = False,
    ) -> None:
        """Record the key's next due time in the table (inside an agent) and in the in-memory index.

        A run that waits for an effect's outcome is marked with the id of the process that issued the awaited
        command (this one when it `issued` it now): another process that takes the partition over, or this
        process restarted, resumes it at once instead of waiting for the command's deadline. `rewrite` writes
        the entry even when the store already holds it (a redelivered record: see `handle_conversation_event`).
        """
        stored = self.timers.get(key)
        by = None
        if waiting:
            issuer = stored.get("waiting_by") if isinstance(stored, dict) else None
            by = self.instance_id if issued or issuer is None else issuer
        entry = None if due_ms is None else {"due": due_ms, "p": partition, "waiting_by": by}
        if entry is not None and (entry != stored or rewrite):
            self.timers[key] = entry
        elif entry is None and stored is not None:
            del self.timers[key]
        self.index.set(partition, key, due_ms)

    def _refresh_index(self) -> tuple[frozenset[int], list[tuple[str, int]]]:
        """Rebuild the index from the table after each rebalance (partitions moved, state recovered).

        Also returns the conversations of newly owned partitions whose run waits for an outcome of a command
        another process issued: it may have died with that process, so they are resumed now rather than at
        their deadline.
        """
        generation = self.app.consumer_generation_id
        owned = self.owned_partitions()
        resume: list[tuple[str, int]] = []
        if generation != self._index_generation or owned != self._index_partitions:
            new = owned - self._index_partitions
            entries = []
            for raw_key, value in self.timers.items():
                key = raw_key.decode() if isinstance(raw_key, bytes) else str(raw_key)
                if isinstance(value, dict) and value.get("p") in owned:
                    entries.append((int(value["p"]), key, int(value["due"])))
                    by = value.get("waiting_by")
                    # only what another process issued: this process's own commands are still in its lanes
                    if by not in (None, self.instance_id) and value["p"] in new and is_conversation_key(key):
                        resume.append((key, int(value["due"])))
            self.index.rebuild(entries)
            self._index_generation, self._index_partitions = generation, owned
            log.info(
                "timer index rebuilt",
                extra={"timers": len(entries), "resumed": len(resume), "partitions": sorted(owned)},
            )
        return owned, resume

    async def refetch_stuck_tails(self, now: int) -> None:
        """Send the consumer back to the expected offset of a partition stopped short of its last records."""
        consumer = self.app.consumer
        sources = self._source_topics()
        for tp in consumer.assignment():
            if tp.topic not in sources:
                continue
            key = (tp.topic, tp.partition)
            expected = self.offsets.expected(key)
            if self.tails.stuck(key, expected, consumer.highwater(tp), now) and expected is not None:
                log.warning(
                    "partition stopped short of its last records: fetching them again",
                    extra={"topic": tp.topic, "partition": tp.partition, "expected": expected},
                )
                self.metrics.offset_gaps.labels(tp.topic).inc()
                await consumer.seek(tp, expected)

    async def fire_due_timers(self) -> None:
        """Emit `TimerFired` for what is due in the partitions this worker owns (DESIGN §7)."""
        if not self.ready():
            return
        owned, resume = self._refresh_index()
        now = self.now_ms()
        try:
            await self.refetch_stuck_tails(now)
        except Exception as exc:  # a consumer between rebalances: the next tick tries again
            log.warning("tail check skipped", extra={"error_type": type(exc).__name__})
        for key, due_ms in resume:
            await self._send(self.conversations, key, TimerFired(key=key, due_ms=due_ms, at_ms=now, resume=True))
            self.metrics.runs_resumed.inc()
        for key, due_ms in self.index.pop_due(now, owned):
            conversation = is_conversation_key(key)
            topic = self.conversations if conversation else self.sweeps
            await self._send(topic, key, TimerFired(key=key, due_ms=due_ms, at_ms=now))
            self.metrics.timers_fired.labels("conversations" if conversation else "sweeps").inc()

    # --- sweeps ------------------------------------------------------------------------------------------

    def sweep_requests(self, account: int | None = None) -> list[SweepRequested]:
        now = self.now_ms()
        accounts = [account] if account is not None else sorted(self.latest_document().config.routing.accounts)
        return [SweepRequested(account_id=a, status=s, at_ms=now) for a in accounts for s in SWEEP_STATUSES]

    async def run_leader_sweeps(self) -> None:
        """On start and every ROUTER_SWEEP_INTERVAL_S, the leader requests a pass per account and status."""
        await self._recovery.completed.wait()
        while True:
            if self.app.is_leader():
                for request in self.sweep_requests():
                    await self._send(self.sweeps, request.key, request)
                    self.metrics.sweeps_requested.inc()
                log.info("sweep requested", extra={"accounts": len(self.latest_document().config.routing.accounts)})
            await asyncio.sleep(self.env.sweep_interval_s)

    # --- turn outcomes -----------------------------------------------------------------------------------

    def report_turn(self, outcome: TurnOutcome) -> None:
        """One log line per turn outcome (ids and classes only, behavior.md §11) and its metrics."""
        self.metrics.count_turn(outcome)
        fields = {
            "key": outcome.key,
            "run": outcome.run,
            "result": outcome.result,
            "reason": outcome.reason,
            "status": outcome.status,
            "assignee_id": outcome.assignee_id,
            "labeled": outcome.labeled,
            "replied": outcome.replied,
        }
        if outcome.result == "retry":
            failures = outcome.failures or 0
            level = logging.ERROR if failures >= 3 else logging.WARNING
            log.log(
                level,
                "job failed; will retry",
                extra={
                    "job": f"route:{outcome.key}",
                    "attempts": failures,
                    "delayMs": outcome.delay_ms,
                    "reason": outcome.reason,
                },
            )
        elif outcome.result == "dropped":
            log.info("conversation deleted; job dropped", extra={"job": f"route:{outcome.key}"})
        else:
            log.info(f"turn {outcome.result}", extra=fields)


def build_worker(settings: Settings, env: WorkerEnv, **kwargs: Any) -> WorkerApp:
    """Create the worker app (see WorkerApp for the keyword arguments)."""
    return WorkerApp(settings, env, **kwargs)
