"""The worker's record pipeline, behind small interfaces so that it needs no broker (docs/architecture.md).

`streams/worker/app.py` is the Faust wiring; each of its agents hands every record to `WorkerService.on_record`:

- **In order** (DESIGN §6 "No record skipped"): a record already folded is skipped; one past the expected
  offset makes the service read the missing records (`GapReader`) and fold them first.
- **Guarded**: a record that cannot be decoded or handled goes to the DLQ with its error; it never stalls the
  partition.
- **Folds** (`router`, `sweeper`): one routine for both, `fold_record`: fold the record into the key's stored
  state (`projections.worker.steps`), keep the state in the write cache if it changed (and mark it to be re-written for
  a redelivered record), write the cache and flush before a `create_message` is sent (its ledger entry must be
  durable first), send the commands and what a sweep
  page found, end the lane's hold on its slots once the run waits for nothing, set the key's timer, report turn
  outcomes. A `ConfigApplied` marker switches the partition's
  configuration version instead.
- **Effects**: a command runs only while its run awaits that very copy and, unless it is a read, only if no
  execution of it started before (`projections.worker.admission`; the attempt is flushed before the call); a
  redelivered reply is reported `unconfirmed`, never sent again. Outcomes go back to the key's topic.
- **Chained reads**: after a conversation's command, the service folds its outcome in memory (the same pure fold,
  on the stored state); when that fold would issue exactly one more read, the service runs it at once in the
  same lane, and the command is not sent when the real fold issues it (`fold_record` skips that very copy). The
  outcomes of reads run back to back are one `ChainedOutcomes` event, which the fold applies part by part as it
  would separate events; the outcome of anything else is sent at once. A chained read's outcome names the command
  copy it answers (`EffectOutcome.answers`), and the fold takes it only for that copy. This saves a command
  record, an outcome record, a state write and a trip through Kafka per chained read; the requests are the same.
- **Timers** (`handlers.worker.timers`): `fire_due_timers` emits `TimerFired` for what is due and resumes runs
  whose awaited command was issued by another process.
- **The commit protocol** (docs/architecture.md): the states and the `timers` entries are written back once per
  commit. `before_commit` writes every key changed since the last commit; the transport calls it before it
  flushes the producer and commits the input offsets (`streams/worker/transport.py`), and `commit_cache` does
  the same (write, then flush) whenever correctness needs it sooner: before a reply, before a configuration
  switch, before partitions are given up and at shutdown.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import Awaitable, Callable, Collection, Mapping
from dataclasses import dataclass
from typing import Any, NoReturn, cast

from aiokafka.errors import KafkaError
from pydantic import ValidationError

from handlers.privacy.keyring import TableKeyRing
from handlers.privacy.retention import TextRetention
from handlers.worker.barrier import BarrierBroken
from handlers.worker.catch_up import CatchUp
from handlers.worker.chatwoot_gate import ChatwootGate
from handlers.worker.fencing import Fence, fail_stop
from handlers.worker.lanes import Lanes
from handlers.worker.metrics import WorkerMetrics
from handlers.worker.partition_reader import RangeNotRead
from handlers.worker.ports import TP, Executor, GapReader, PartitionScope, Sink, SourceRecord, Table, any_partition
from handlers.worker.state_cache import ModelCache
from handlers.worker.timers import Timers
from projections.fold import Event, parts_of
from projections.worker.admission import Attempt, admit, changed_since_read, needs_attempt_record, read_is_fresh
from projections.worker.offsets import OffsetTracker
from projections.worker.steps import Step, conversation_step, sweep_step
from schemas.codec import (
    Undecodable,
    check_key,
    decode_command,
    decode_conversation_event,
    decode_marker,
    decode_sweep_event,
    dlq_headers,
    encode,
)
from schemas.configs import ConfigBook, ConfigDocument
from schemas.data_keys import ErasedKey, WrappedDataKey
from schemas.keys import SWEEP_STATUSES, conversation_key_of, is_conversation_key, partition_slot
from schemas.records import (
    CONVERSATION_READS,
    MAX_CHAINED_OUTCOMES,
    MUTATIONS,
    ChainedOutcomes,
    ConfigApplied,
    EffectCommand,
    EffectError,
    EffectOutcome,
    ForgetRequested,
    ForgetScope,
    Forgotten,
    Record,
    SweepRequested,
    TimerFired,
    TurnOutcome,
)
from schemas.state import ConversationState, SweepState

log = logging.getLogger("chatwoot_router.worker")

Handler = Callable[[SourceRecord], Awaitable[None]]
BookLoader = Callable[[], Awaitable[ConfigBook]]


MAX_CHAIN = 16
"""At most this many reads run back to back for one command (a run's request budget ends it sooner)."""

DEFAULT_FRESH_READ_MS = 5000
"""How old the fresh read a mutation depends on may be when the mutation is made (ROUTER_FRESH_READ_MS; healthy
gaps are tens of milliseconds: docs/benchmarks.md)."""
CONFIG_READ_DEADLINE_S = 60.0
"""How long a `ConfigApplied` marker waits for its version on the configs topic before the worker stops."""
DEFAULT_SESSION_TIMEOUT_S = 15.0
"""The consumer group's session timeout (streams/worker/app.py): a worker silent for longer may be expelled."""


_UNREAD = object()  # a partition_configs slot not read yet (None is a slot with no version)


def wall_clock_ms() -> int:
    return time.time_ns() // 1_000_000


@dataclass(frozen=True)
class WorkerTables:
    """The worker's tables (DESIGN §5; `streams/worker/app.py` says what each holds)."""

    states: Table
    sweep_states: Table
    timers: Table
    effect_attempts: Table
    partition_configs: Table


class WorkerService:
    """What one worker process does with the records of the partitions it owns."""

    def __init__(
        self,
        *,
        tables: WorkerTables,
        sink: Sink,
        executor: Executor,
        book: ConfigBook,
        own_document: ConfigDocument,
        load_book: BookLoader,
        reader: GapReader,
        lanes: Lanes | None = None,
        metrics: WorkerMetrics | None = None,
        now_ms: Callable[[], int] = wall_clock_ms,
        instance_id: str | None = None,
        max_chain: int = MAX_CHAIN,
        fresh_read_ms: int = DEFAULT_FRESH_READ_MS,
        scope: PartitionScope = any_partition,
        write_cache: bool = True,
        fence: Fence | None = None,
        stop: Callable[[str], NoReturn] = fail_stop,
        source_topics: Collection[str] | None = None,
        gate: ChatwootGate | None = None,
        keyring: TableKeyRing | None = None,
        text_retention_ms: int | None = None,
    ) -> None:
        self.tables = tables
        self.sink = sink
        self.executor = executor
        self.book = book
        self.own_document = own_document
        self.load_book = load_book
        self.reader = reader
        self.lanes = lanes or Lanes()
        self.metrics = metrics or WorkerMetrics()
        self.now_ms = now_ms
        # fencing (handlers/worker/fencing.py): a worker that may have lost its group writes nothing more and stops
        self.fence = fence or Fence(DEFAULT_SESSION_TIMEOUT_S)
        self.stop = stop
        # nothing is run against a Chatwoot too old for the router, or whose version is unknown (issue 30)
        self.gate = gate or ChatwootGate.always_open()
        self.keyring = keyring  # the data keys (issue 32): `forget` replaces one with the erasure fence
        # ROUTER_TEXT_RETENTION_DAYS: which conversations' text to erase (None: text is kept until `forget`)
        self.retention = (
            TextRetention(keyring, text_retention_ms) if keyring is not None and text_retention_ms is not None else None
        )
        # the topics whose offsets the service owns (None: every committed topic is one)
        self.source_topics = frozenset(source_topics) if source_topics is not None else None
        # tells this process's commands from those of a dead or departed one
        self.instance_id = instance_id or uuid.uuid4().hex
        # the fold states, decoded once (handlers/worker/state_cache.py); with `write_cache`, the states and `timers`
        # entries are written back once per commit (docs/architecture.md "The commit protocol"), else at once
        self.scope = scope
        self.write_cache = write_cache
        self.states = ModelCache(tables.states, ConversationState, write_back=write_cache)
        self.sweep_states = ModelCache(tables.sweep_states, SweepState, write_back=write_cache)
        self.timers = Timers(tables.timers, self.states, self.sweep_states, write_back=write_cache)
        # conversation key -> command id -> the chained read this process runs (or ran) before the fold issues it
        self.chained: dict[str, dict[str, EffectCommand]] = {}
        if not 0 <= max_chain < MAX_CHAINED_OUTCOMES:
            raise ValueError(f"max_chain must be between 0 and {MAX_CHAINED_OUTCOMES - 1} (one ChainedOutcomes record)")
        self.max_chain = max_chain
        self.fresh_read_ms = fresh_read_ms
        self.offsets = OffsetTracker()
        self._clamps_logged: dict[tuple[str, int], int | None] = {}  # partition -> held-back offset last logged
        self.catch_up = CatchUp()
        # cleared while an assignment's starting offsets are looked up (streams/worker/app.py): a record folded
        # before them would be folded untracked, and the lookup's result would then move it back
        self.assignment_known = asyncio.Event()
        self.assignment_known.set()
        self._versions: dict[str, Any] = {}  # partition_configs slot -> version, as read (document_in_force)
        self._handlers: dict[str, Handler] = {
            "router": self.on_conversation_record,
            "effects": self.dispatch_command,
            "sweeper": self.on_sweep_record,
        }

    # --- every record: in order, guarded --------------------------------------------------------------------

    async def on_record(self, agent: str, record: SourceRecord) -> None:
        """The whole of an agent's work for one record of its topic."""
        if not self.assignment_known.is_set():
            await self.assignment_known.wait()
        await self.in_order(agent, record, self._handlers[agent])

    async def in_order(self, agent: str, record: SourceRecord, handler: Handler) -> None:
        """Handle `record` exactly once and in offset order: skip what was handled, read and handle a gap first."""
        verdict, expected = self.offsets.check(record.tp, record.offset)
        if verdict == "duplicate":
            self.metrics.records_skipped.labels(record.topic).inc()
            return
        if verdict == "gap" and expected is not None:
            await self._fill_gap(agent, record.tp, expected, record.offset, handler)
        await self.guarded(agent, record, handler)
        self._advance(agent, record.tp, record.offset)

    def _advance(self, agent: str, tp: TP, offset: int) -> None:
        self.offsets.advance(tp, offset)
        if agent == "router":
            self.catch_up.advanced(tp[1], offset + 1)

    async def _fill_gap(self, agent: str, tp: TP, start: int, end: int, handler: Handler) -> None:
        """Read offsets start..end-1 of `tp` past the consumer and handle them in order (never ignored)."""
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
            await self.guarded(agent, record, handler)
            self._advance(agent, tp, record.offset)
            self.metrics.gap_records.labels(topic).inc()

    async def guarded(self, agent: str, record: SourceRecord, handler: Handler) -> None:
        """Run one record's handler; anything that escapes sends the record to the DLQ (never stalls)."""
        started = time.monotonic()
        try:
            await handler(record)
            self.metrics.handle_seconds.labels(agent).observe(time.monotonic() - started)
        except Undecodable as exc:
            await self.to_dlq(record, str(exc))
        except asyncio.CancelledError:
            raise
        except BarrierBroken as exc:  # weather, not poison: the record is folded again after a fresh start
            self.stop(f"a write this record depends on was not acknowledged ({exc})")
        except (KafkaError, OSError) as exc:
            self.stop(f"a broker or store error while handling a record ({type(exc).__name__})")
        except Exception as exc:
            self.metrics.agent_errors.labels(agent).inc()
            log.error(
                "record could not be processed",
                extra={
                    "agent": agent,
                    "topic": record.topic,
                    "partition": record.partition,
                    "offset": record.offset,
                    "error_type": type(exc).__name__,
                },
            )
            await self.to_dlq(record, f"{type(exc).__name__}: processing failed")

    async def to_dlq(self, record: SourceRecord, error: str) -> None:
        self.metrics.dlq.labels(record.topic).inc()
        log.warning(
            "record sent to the DLQ",
            extra={"topic": record.topic, "partition": record.partition, "offset": record.offset, "reason": error},
        )
        key = record.key.decode(errors="replace") if record.key is not None else ""
        headers = dlq_headers(error, record.topic, record.partition, record.offset)
        await self.sink.send("dlq", key, record.value if record.value is not None else b"", headers)

    # --- the commit protocol (docs/architecture.md) -------------------------------------------------------------

    async def before_offsets_commit(self, offsets: Mapping[Any, int]) -> dict[Any, int]:
        """The commit protocol at each offset commit (streams/worker/transport.py): write the cache, wait at the
        barrier until every write so far is acknowledged, and never commit a source partition past the last
        record this process folded (Faust acks records it skipped). Stops the worker when it is in doubt."""
        await self.commit_cache()
        committable: dict[Any, int] = {}
        for tp, offset in offsets.items():
            key = (tp[0], tp[1])
            if self.source_topics is not None and key[0] not in self.source_topics:
                committable[tp] = offset
                continue
            expected = self.offsets.expected(key)
            if expected is None or offset > expected:
                self._report_clamp(key, offset, expected)
            if expected is None:
                continue  # nothing folded here yet: Faust's offset covers records no agent folded
            committable[tp] = min(offset, expected)
        return committable

    def _report_clamp(self, key: tuple[str, int], offset: int, expected: int | None) -> None:
        """Count a commit held back; log it once per partition and held-back offset (it repeats at every commit
        until the worker has folded up to Faust's offset)."""
        self.metrics.commits_clamped.labels(key[0]).inc()
        if self._clamps_logged.get(key) != expected:
            self._clamps_logged[key] = expected
            log.info(
                "offset commit held back to the last record folded",
                extra={"topic": key[0], "partition": key[1], "offset": offset, "expected": expected},
            )

    async def keys_durable(self) -> None:
        """Wait until a new data key (issue 32) is acknowledged, with everything written before it; a broken
        barrier stops the worker, so nothing sealed under a key that may be lost ever leaves it."""
        try:
            await self.sink.flush()
        except BarrierBroken as exc:
            self.stop(f"the commit barrier broke: {exc}")

    def check_fence(self, what: str) -> None:
        """Stop before `what` when the worker may have lost its partitions (handlers/worker/fencing.py)."""
        if self.fence.in_doubt():
            self.stop(f"{self.fence.reason()}; not making {what}")

    def before_commit(self) -> int:
        """Write every state and `timers` entry changed since the last commit, each once, to its partition.

        The caller then flushes the producer (so these changelog records are acknowledged) and only then commits
        the input offsets: an offset is never committed before the states of the records below it are durable.
        Returns how many records that wrote."""
        written = self.states.write_dirty(self.scope)
        written += self.sweep_states.write_dirty(self.scope)
        written += self.timers.write_dirty(self.scope)
        if written:
            self.metrics.cache_writes.inc(written)
        return written

    async def commit_cache(self) -> None:
        """Write the cache and wait until it is acknowledged (with everything sent before): before a reply may be
        sent, before a configuration switch, before offsets are committed, and before partitions are given up or
        the process stops. A worker in doubt writes nothing; a broken barrier stops it (never a commit after)."""
        self.check_fence("a changelog write")
        self.before_commit()
        try:
            await self.sink.flush()
        except BarrierBroken as exc:
            self.stop(f"the commit barrier broke: {exc}")

    def forget_states(self) -> None:
        """At a rebalance: decoded states are read again from the tables (a partition that comes back may have
        been written by another owner), and chained reads in flight lose their claim (at worst a read twice).
        Call `commit_cache` first: values not yet written are kept, never dropped."""
        self.states.clear()
        self.sweep_states.clear()
        self.chained.clear()
        self._versions.clear()

    # --- configuration versions (DESIGN §8) ------------------------------------------------------------------

    def document_in_force(self, source: str, partition: int) -> ConfigDocument:
        """The configuration partition `partition` of `source` ("conversations" or "sweeps") is folded under.

        Read from `partition_configs` once per partition and kept: only `switch_config` changes a slot while the
        partition is owned here, and `forget_states` drops what is kept at a rebalance (another owner may have
        switched it meanwhile). Every record asks, and the table's get is a RocksDB read and a JSON decode."""
        slot = partition_slot(source, partition)
        version = self._versions.get(slot, _UNREAD)
        if version is _UNREAD:
            version = self._versions[slot] = self.tables.partition_configs.get(slot)
        return self.book.in_force(version) or self.own_document

    def latest_document(self) -> ConfigDocument:
        return self.book.latest or self.own_document

    async def learn_version(self, version: str) -> None:
        """Read the configs topic until it holds `version` (retried in place, a marker is never dead-lettered: the
        partition would keep the old configuration for good); past CONFIG_READ_DEADLINE_S the worker stops, and
        its next start reads the marker again."""
        deadline = time.monotonic() + CONFIG_READ_DEADLINE_S
        attempt = 0
        while version not in self.book:
            try:
                for document in (await self.load_book()).documents():
                    self.book.add(document)
            except (KafkaError, OSError) as exc:
                log.warning("configs topic not readable", extra={"attempt": attempt, "error_type": type(exc).__name__})
            if version in self.book:
                return
            if time.monotonic() >= deadline:
                self.stop(f"configuration version {version} is not on the configs topic")
            attempt += 1
            await asyncio.sleep(min(0.5 * 2**attempt, 5.0))

    async def switch_config(self, source: str, partition: int, marker: ConfigApplied) -> None:
        """Fold a `ConfigApplied` marker: from the next record on, the partition uses its version."""
        await self.learn_version(marker.version)
        # the states folded under the old version are durable before the new one is: a crash then never folds
        # a record before the marker again under the new version (the fold stays deterministic)
        await self.commit_cache()
        self.tables.partition_configs.set(partition_slot(source, partition), marker.version)
        self._versions[partition_slot(source, partition)] = marker.version
        self.metrics.config_switches.inc()
        log.info(
            "configuration version in force", extra={"topic": source, "partition": partition, "version": marker.version}
        )

    # --- the folds ---------------------------------------------------------------------------------------------

    async def on_conversation_record(self, record: SourceRecord) -> None:
        await self.fold_record("conversations", record, self.states, decode_conversation_event, conversation_step)

    async def on_sweep_record(self, record: SourceRecord) -> None:
        await self.fold_record("sweeps", record, self.sweep_states, decode_sweep_event, sweep_step)

    async def fold_record(
        self,
        source: str,
        record: SourceRecord,
        table: ModelCache[Any],
        decode: Callable[[bytes | None], Any],
        step_of: Callable[[Any, Any, ConfigDocument, int], Step],
    ) -> None:
        """Fold a record, persist the state, send what it issued, set the key's timer (both folds)."""
        marker = decode_marker(record.value)
        if marker is not None:
            await self.switch_config(source, record.partition, marker)
            return
        event = decode(record.value)
        check_key(record.key, event.key)
        key = event.key
        stored = table.get(key)
        step = step_of(stored, event, self.document_in_force(source, record.partition), record.offset)
        # A redelivered record (already applied) re-writes the state it finds: after a SIGKILL the local store can
        # hold a value whose changelog record never left, and the changelog must get it before the offset moves
        # past this record (docs/consumer-gaps.md §2); the same for the key's entry in the timers table.
        redelivered = not step.changed and stored is not None
        if step.changed:
            table.set(key, step.state, record.partition)
            self.metrics.events_folded.labels(source, event.type).inc()
        elif redelivered:
            table.rewrite(key, record.partition)
        if any(command.op == "create_message" for command in step.commands):
            await self.commit_cache()  # the ledger entry is written and durable before the reply may be sent
        await self.send_commands(self.unchained(key, step))
        if not step.commands and not step.waiting:
            self.lanes.end_hold(key)  # its lane's slots go to the next conversation (handlers/worker/lanes.py)
        for found in step.found:
            await self.send("conversations", found.key, found)
        self.timers.set(
            record.partition,
            key,
            step.wakeup_ms,
            waiting=step.waiting,
            issued=bool(step.commands),
            rewrite=redelivered,
        )
        for outcome in step.outcomes:
            report_turn(self.metrics, outcome)
        if isinstance(event, ForgetRequested):
            forgotten_ms = getattr(step.state, "forgotten_ms", None)
            if event.scope == "text":
                await self.expire_text(event, step.state)
            elif forgotten_ms is None:
                await self.erase(key, event.reason, event.request_id)
            else:  # forgotten before: the request gets its proof (the fence stays as it is), or `forget` waits in vain
                await self.prove_forgotten(key, forgotten_ms, event.reason, event.request_id)
        elif source == "conversations" and self.says_missing(key, event, step, redelivered):
            # Chatwoot says the conversation no longer exists (§10.3; a contact deleted with its conversations
            # sends no webhook): nothing of it is kept readable (issue 32, automatic erasure)
            await self.erase(key, "conversation_missing", None)

    def says_missing(self, key: str, event: Event, step: Step, redelivered: bool) -> bool:
        """The record ends the conversation's run because Chatwoot answered that it does not exist; or, delivered
        again after a crash, answered so while the conversation's key still lives (the crash came before the
        erasure was durable: the fold applied the record then, and finds nothing to do now)."""
        if self.keyring is None:
            return False
        if any(o.reason in ("conversation_deleted", "conversation_missing") for o in step.outcomes):
            return True
        if not redelivered:
            return False
        missing = any(
            isinstance(part, EffectOutcome) and part.error is not None and part.error.kind == "missing"
            for part in parts_of(event)
        )
        return missing and isinstance(self.keyring.record(key), WrappedDataKey)

    async def expire_text(self, request: ForgetRequested, state: object) -> None:
        """ROUTER_TEXT_RETENTION_DAYS (handlers/privacy/retention.py): destroy the key of a conversation whose text
        outlived the retention, if it still has (it may have started a turn since the scan asked), then write the
        proof. Delivered again after a crash that came between the fence and the proof, the proof is written again."""
        key = request.key
        if self.keyring is None or self.retention is None:
            log.info("text retention not applied: this worker keeps text forever", extra={"key": key})
            return
        now = self.now_ms()
        record = self.keyring.record(key)
        again = isinstance(record, ErasedKey) and record.request_id == request.request_id
        if not again:
            if not self.retention.due(key, state if isinstance(state, ConversationState) else None, now):
                log.info("text retention not applied: the conversation was active since", extra={"key": key})
                return
            self.keyring.erase(key, now, request.reason, scope="text", request_id=request.request_id)
        await self.prove_forgotten(key, now, request.reason, request.request_id, scope="text")
        log.info("conversation text erased", extra={"key": key, "reason": request.reason})

    async def request_text_expiry(self, owned: Collection[int]) -> int:
        """Write a `ForgetRequested` of scope `text` for each idle conversation of `owned` partitions whose text
        outlived ROUTER_TEXT_RETENTION_DAYS (a batch per call); returns how many."""
        if self.retention is None:
            return 0
        requests = await self.retention.requests(owned, self.states.get, self.now_ms())
        for request in requests:
            await self.send("conversations", request.key, request)
        return len(requests)

    async def erase(self, key: str, reason: str, request_id: str | None) -> None:
        """Issue 32: destroy the conversation's data key (the erasure fence replaces it on `<app>.keys`), drop
        what still runs for it, and write `Forgotten`; both durable before the request's offset is committed. A
        redelivered request does it again (the fence is idempotent; the fold keeps the first `Forgotten`)."""
        if self.keyring is None:
            raise RuntimeError("this worker has no key ring: it cannot erase")
        self.keyring.erase(key, self.now_ms(), reason)
        self.executor.forget(key)
        dropped = await self.lanes.cancel(lambda lane: lane == key)
        await self.prove_forgotten(key, self.now_ms(), reason, request_id)
        log.info("conversation forgotten", extra={"key": key, "request_id": request_id, "dropped": dropped})

    async def prove_forgotten(
        self, key: str, at_ms: int, reason: str, request_id: str | None, *, scope: ForgetScope = "conversation"
    ) -> None:
        """Write the `Forgotten` proof of an erasure and wait until it (and the fence before it) is acknowledged."""
        parsed = conversation_key_of(key)
        forgotten = Forgotten(
            at_ms=at_ms,
            account_id=parsed.account_id,
            conversation_id=parsed.conversation_id,
            reason=reason,
            request_id=request_id,
            scope=scope,
        )
        await self.send("conversations", key, forgotten)
        await self.commit_cache()  # the fence and the proof acknowledged, or the worker stops

    def unchained(self, key: str, step: Step) -> list[EffectCommand]:
        """The step's commands less the chained read this process already runs for that very copy."""
        chained = self.chained.get(key)
        if chained is None:
            return step.commands
        commands = []
        for command in step.commands:
            if chained.pop(command.command_id, None) == command:
                continue  # counted when it ran
            commands.append(command)
        if not chained or not step.waiting:
            del self.chained[key]
        return commands

    async def send_commands(self, commands: list[EffectCommand]) -> None:
        for command in commands:
            await self.send("effects", command.key, command)
            self.metrics.commands.labels(command.op).inc()

    async def send(self, topic: str, key: str, record: Record) -> None:
        await self.sink.send(topic, key, encode(record))

    # --- effects -----------------------------------------------------------------------------------------------

    def awaited_command(self, key: str) -> EffectCommand | None:
        """The command the key's run (or sweep page) waits for now, as the fold recorded it."""
        if is_conversation_key(key):
            state = self.states.get(key)
            run = state.run if state is not None else None
            return run.pending if run is not None else None
        sweep = self.sweep_states.get(key)
        return sweep.pending if sweep is not None else None

    async def dispatch_command(self, record: SourceRecord) -> None:
        """Hand a command to its lane only while its run awaits it and no execution of it started (DESIGN §6)."""
        command = decode_command(record.value)
        check_key(record.key, command.key)
        if self.keyring is not None and self.keyring.is_forgotten(command.key):
            # issued before the erasure, consumed after it, and before this worker folded its own `Forgotten`: the
            # fold still awaits it, but nothing is done for a forgotten conversation any more (issue 32)
            self.metrics.commands_dropped.labels(command.op, "forgotten").inc()
            log.info(
                "command not executed",
                extra={"command_id": command.command_id, "op": command.op, "reason": "forgotten"},
            )
            return
        stored = self.tables.effect_attempts.get(command.key)
        attempted = Attempt.model_validate(stored) if isinstance(stored, dict) else None
        verdict = admit(command, self.awaited_command(command.key), attempted)
        if verdict != "execute":
            self.metrics.commands_dropped.labels(command.op, verdict).inc()
            log.info(
                "command not executed", extra={"command_id": command.command_id, "op": command.op, "reason": verdict}
            )
            if verdict == "redelivered" and command.op == "create_message":
                # the POST may have happened, so it is never made twice (§9.7); the run checks history
                await self.lanes.submit(command.key, command.account_id, lambda: self.report_unconfirmed(command))
            return
        if needs_attempt_record(command):
            self.tables.effect_attempts.set(command.key, Attempt.of(command, self.instance_id).model_dump(mode="json"))
            await self.sink.flush()  # the attempt is durable before the call can happen
        document = self.document_in_force("conversations", record.partition)
        if command.op in MUTATIONS:
            work = lambda: self.execute_mutation(command, document, record.partition)  # noqa: E731
        else:
            work = lambda: self.execute(command, document)  # noqa: E731
        await self.lanes.submit(command.key, command.account_id, work)

    async def execute_mutation(self, command: EffectCommand, document: ConfigDocument, partition: int) -> None:
        """Make a mutation only on a fresh read (DESIGN §6): once the fold has passed what was on the log when this
        worker took the partition (a person's takeover on it stops the mutation), while the run still awaits this
        very copy, and while the read it depends on is younger than `fresh_read_ms` (worker clock against the
        read's outcome time on the log, which is the command's issue time: every mutation is issued by folding the
        outcome of a read). Otherwise it is not made: `stale` when the run moved on, else a `stale_read` outcome,
        and the run makes the fresh read again (a reply is never re-sent: §9.7)."""
        await self.wait_for_chatwoot()  # first: the checks below must hold when the call is made, not before a wait
        remaining_s = (command.at_ms + self.fresh_read_ms - self.now_ms()) / 1000
        reason: str | None = None
        if not await self.catch_up.wait(partition, remaining_s):
            reason = "catching_up"
        elif self.awaited_command(command.key) != command:
            reason = "stale"
        elif changed_since_read(self.states.get(command.key)):
            reason = "changed_since_read"
        else:
            now = self.now_ms()
            self.metrics.read_age.labels(command.op).observe(max(now - command.at_ms, 0) / 1000)
            if not read_is_fresh(command, now, self.fresh_read_ms):
                reason = "stale_read"
        if reason is None:
            self.check_fence(f"the {command.op} call")  # right before it: a fenced worker makes no mutation
            # the executor reads once more right before the call and makes it only if nothing changed since
            await self.execute(command, document, unchanged_since=self.read_updated_at(command.key))
            return
        self.metrics.commands_dropped.labels(command.op, reason).inc()
        log.info(
            "mutation not made",
            extra={
                "command_id": command.command_id,
                "op": command.op,
                "reason": reason,
                "read_age_ms": self.now_ms() - command.at_ms,
                "behind": self.catch_up.behind(partition),
            },
        )
        if reason != "stale":
            await self.report_stale_read(command, reason)

    async def report_stale_read(self, command: EffectCommand, reason: str) -> None:
        """The outcome of a mutation that was not made because its read was not fresh: the run reads again."""
        why = {
            "stale_read": "fresh read too old",
            "changed_since_read": "status changed since the read",
        }.get(reason, "partition not folded up to its head yet")
        outcome = EffectOutcome(
            key=command.key,
            account_id=command.account_id,
            command_id=command.command_id,
            op=command.op,
            error=EffectError(kind="stale_read", reason=why),
            at_ms=self.now_ms(),
        )
        self.metrics.count_outcome(outcome, 0.0)
        await self.send("conversations", command.key, outcome)

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
        await self.send("conversations", command.key, outcome)

    def read_updated_at(self, key: str) -> float | None:
        """Chatwoot's `updated_at` as the key's run last read the conversation (None: unknown)."""
        state = self.states.get(key)
        return state.run.read_updated_at if state is not None and state.run is not None else None

    async def execute(
        self, command: EffectCommand, document: ConfigDocument | None = None, *, unchanged_since: float | None = None
    ) -> None:
        """Run one command in its lane and record its outcome as an event on the command's key; for a
        conversation, then run the reads the fold will issue next (`chain_reads`)."""
        outcome = await self.run_command(command, document, unchanged_since)
        if command.op == "list_conversations":
            await self.send("sweeps", command.key, outcome)
        elif document is None or not is_conversation_key(command.key):
            await self.send("conversations", command.key, outcome)
        else:
            await self.chain_reads(command, outcome, document)

    async def wait_for_chatwoot(self) -> None:
        """Hold here while Chatwoot's version is below the minimum or unknown (handlers/worker/chatwoot_gate.py)."""
        if not self.gate.is_open:
            self.metrics.commands_held.inc()
            await self.gate.wait()

    async def run_command(
        self, command: EffectCommand, document: ConfigDocument | None, unchanged_since: float | None = None
    ) -> EffectOutcome:
        await self.wait_for_chatwoot()
        started = time.monotonic()
        config = document.config if document is not None else None
        if unchanged_since is None:
            outcome = await self.executor.execute(command, config)
        else:
            outcome = await self.executor.execute(command, config, unchanged_since=unchanged_since)
        self.metrics.count_outcome(outcome, time.monotonic() - started)
        return outcome

    async def chain_reads(self, command: EffectCommand, outcome: EffectOutcome, document: ConfigDocument) -> None:
        """Record `outcome`; while folding it (in memory, on the stored state) issues exactly one more read, run
        that read at once. Only reads are run this way (running one twice is harmless); the command before them
        may be any (a reply, System One's decision, …).

        The outcome of anything but a read is sent at once, as its own event (a crash must not make it run again),
        and the first read after it is registered in `chained` first, so that `fold_record` does not send that
        command when the real fold issues it. The outcomes of reads are held back and sent together as one
        `ChainedOutcomes` event when the chain ends: the fold applies them in order, as if each were its own
        event. Each chained read names the command copy it answers (`EffectOutcome.answers`): if the real fold
        took another step (an event came in between), the chained outcome is stale and the fold's own command
        goes out.
        """
        key = command.key
        try:
            state = self.states.get(key)
        except ValidationError:  # the fold sends such a record to the DLQ; the outcome still goes out
            state = None
        offset = state.offset if state is not None else -1
        reads: list[EffectOutcome] = []
        for _ in range(self.max_chain):
            offset += 1  # any offset past the state's: what the fold issues does not depend on it
            step = self._step_after(state, command, outcome, document, offset)
            following = step.commands[0] if step is not None and len(step.commands) == 1 else None
            if step is None or following is None or following.op not in CONVERSATION_READS:
                break
            if command.op in CONVERSATION_READS:
                reads.append(outcome)
            else:
                self.chained.setdefault(key, {})[following.command_id] = following
                await self.send("conversations", key, outcome)
            self.metrics.commands.labels(following.op).inc()
            self.metrics.commands_chained.labels(following.op).inc()
            result = await self.run_command(following, document)
            state = cast(ConversationState, step.state)
            command, outcome = following, result.model_copy(update={"answers": following.digest()})
        await self.send("conversations", key, ChainedOutcomes.of([*reads, outcome]) if reads else outcome)

    def _step_after(
        self,
        state: ConversationState | None,
        command: EffectCommand,
        outcome: EffectOutcome,
        document: ConfigDocument,
        offset: int,
    ) -> Step | None:
        """The fold of `outcome` on `state` if the state's run awaits `command`; None (no chaining) otherwise."""
        run = state.run if state is not None else None
        if run is None or run.pending != command:
            return None
        try:
            return conversation_step(state, outcome, document, offset)
        except Exception as exc:  # the real fold will meet it too (and send the record to the DLQ); not here
            log.warning("chained read not run", extra={"key": command.key, "error_type": type(exc).__name__})
            return None

    async def drain_effects(self, timeout_s: float, why: str) -> None:
        """Let running effects finish (bounded), so their outcomes reach Kafka before partitions move or stop."""
        if not self.lanes.pending:
            return
        try:
            async with asyncio.timeout(timeout_s):
                await self.lanes.drain()
        except TimeoutError:
            log.warning(f"effects still running {why}", extra={"pending": self.lanes.pending})

    # --- timers and sweeps ------------------------------------------------------------------------------------

    async def fire_due_timers(self, owned: frozenset[int], generation: int | None) -> None:
        """Emit `TimerFired` for what is due in the owned partitions, and resume runs another process left."""
        resume = self.timers.refresh(owned, generation)
        now = self.now_ms()
        for key, due_ms in resume:
            await self.send("conversations", key, TimerFired(key=key, due_ms=due_ms, at_ms=now, resume=True))
            self.metrics.runs_resumed.inc()
        for key, due_ms in self.timers.pop_due(now, owned):
            conversation = is_conversation_key(key)
            source = "conversations" if conversation else "sweeps"
            await self.send(source, key, TimerFired(key=key, due_ms=due_ms, at_ms=now))
            self.metrics.timers_fired.labels(source).inc()

    def sweep_requests(self, account: int | None = None) -> list[SweepRequested]:
        now = self.now_ms()
        accounts = [account] if account is not None else sorted(self.latest_document().config.routing.accounts)
        return [SweepRequested(account_id=a, status=s, at_ms=now) for a in accounts for s in SWEEP_STATUSES]

    async def request_sweeps(self) -> None:
        """A pass per routed account and status (the leader asks every ROUTER_SWEEP_INTERVAL_S)."""
        for request in self.sweep_requests():
            await self.send("sweeps", request.key, request)
            self.metrics.sweeps_requested.inc()
        log.info("sweep requested", extra={"accounts": len(self.latest_document().config.routing.accounts)})


def report_turn(metrics: WorkerMetrics, outcome: TurnOutcome) -> None:
    """One log line per turn outcome (ids and classes only, behavior.md §11) and its metrics."""
    metrics.count_turn(outcome)
    if outcome.result == "retry":
        failures = outcome.failures or 0
        log.log(
            logging.ERROR if failures >= 3 else logging.WARNING,
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
        log.info(f"turn {outcome.result}", extra=fields)
