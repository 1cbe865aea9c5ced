"""The worker's per-record steps on a bare aiokafka consumer and producer, without Faust (issue 23; not run by CI).

How much of the worker's CPU per conversation is Faust's and how much is ours? This replays the
`<app>.conversations` log a `bench/worker_bench.py --keep DIR` run left on the broker (its webhooks and the
outcomes the effect side logged) through the same per-record work as the worker, in three stages, each timed
with `time.process_time()` (this process only; aiokafka has no threads):

1. `fold`: in memory, no Kafka: decode the record (`schemas.codec`), fold it on the key's state
   (`projections.worker.steps.conversation_step`, i.e. `projections.fold`), encode the commands it issued, and once
   per 1000 records or at the end ("a commit") dump each changed state to JSON once. Run twice; the second
   pass is reported (the first fills caches, as a long-running worker has).
2. `router`: the same on a bare `AIOKafkaConsumer` (manual commits) of a copy of that log (written before the
   clock starts, 4 partitions like the worker's): the commands are produced to `<run>.effects` and each commit
   produces every changed state once to `<run>.state-changelog` (same partition), flushes the producer (acks)
   and only then commits the input offsets, every 1 s or 1000 records, as the worker does.
3. `effects`: a bare consumer of those commands: decode each, and for every command that is not a read write
   its attempt to `<run>.effect_attempts` and flush before "the call" (no HTTP: nothing is called), then
   produce an outcome-sized record to `<run>.outcomes`; commits as in 2.

Stages 2 and 3 run twice: batched (up to 1000 records a fetch, sends not awaited one by one) and unbatched (one
record a fetch, each send waited for: one produce request per record, as a worker that takes each hop as soon as
it comes mostly sends; the worker's real pattern lies between the two).

What this leaves out: HTTP (the effect side's reads and mutations, the chained reads run in process), the
admission checks, metrics and logging. The worker's number for the same run comes from `worker_bench.py`
("baseline CPU ms per conversation"), which covers a burst (half the log's conversations), so the per
conversation figures below divide by the conversations in the log.

    .venv/bin/python bench/worker_bench.py --bootstrap 127.0.0.1:31423 --conversations 200 --keep /tmp/w
    .venv/bin/python bench/bare_pipeline_bench.py --bootstrap 127.0.0.1:31423 --app bench-isolation-<ts>
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer

from handlers.kafka.config_store import read_book
from handlers.kafka.topic_io import topic_partitions
from handlers.kafka.topics import ensure_topics
from projections.worker.admission import needs_attempt_record
from projections.worker.steps import conversation_step
from schemas.codec import decode_command, decode_conversation_event, decode_marker, encode
from schemas.configs import ConfigDocument
from schemas.keys import is_conversation_key
from schemas.state import ConversationState

PARTITIONS = 4
COMMIT_INTERVAL_S = 1.0  # streams/worker/app.py
COMMIT_EVERY = 1000
Record = tuple[int, bytes | None, bytes | None]  # partition, key, value


async def read_log(bootstrap: str, topic: str) -> list[Record]:
    """Every record of `topic`, in offset order per partition (partitions one after another)."""
    partitions = await topic_partitions(bootstrap, topic)
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False, auto_offset_reset="earliest")
    await consumer.start()
    try:
        ends = await consumer.end_offsets(partitions)
        consumer.assign(partitions)
        records: list[Record] = []
        for tp in partitions:
            consumer.seek(tp, 0)
        left = {tp for tp in partitions if ends[tp] > 0}
        while left:
            batch = await consumer.getmany(*left, timeout_ms=1000)
            for tp, messages in batch.items():
                records.extend((tp.partition, m.key, m.value) for m in messages)
                if messages and messages[-1].offset + 1 >= ends[tp]:
                    left.discard(tp)
    finally:
        await consumer.stop()
    return records


class Fold:
    """The worker's fold step (WorkerService.fold_record) without Faust: states in a dict, written per commit."""

    def __init__(self, document: ConfigDocument) -> None:
        self.document = document
        self.states: dict[str, ConversationState] = {}
        self.dirty: dict[str, int] = {}
        self.commands = 0

    def step(self, partition: int, offset: int, value: bytes | None) -> list[tuple[str, bytes]]:
        """Fold one record; the commands it issued as (key, encoded command)."""
        if decode_marker(value) is not None:
            return []  # one configuration in these runs
        event = decode_conversation_event(value)
        if not is_conversation_key(event.key):
            return []
        stored = self.states.get(event.key)
        step = conversation_step(stored, event, self.document, offset)
        if step.changed:
            assert isinstance(step.state, ConversationState)
            self.states[event.key] = step.state
            self.dirty[event.key] = partition
        self.commands += len(step.commands)
        return [(command.key, encode(command)) for command in step.commands]

    def changed(self) -> list[tuple[str, int, bytes]]:
        """Each key changed since the last commit, once, as (key, partition, state JSON)."""
        out = [(k, p, self.states[k].model_dump_json().encode()) for k, p in self.dirty.items()]
        self.dirty.clear()
        return out


def stage_fold(records: list[Record], document: ConfigDocument) -> tuple[float, int, int]:
    """Stage 1: CPU seconds, commands issued, state records "written"."""
    fold = Fold(document)
    offsets = [0] * PARTITIONS
    written = 0
    start = time.process_time()
    for n, (partition, _key, value) in enumerate(records, 1):
        fold.step(partition, offsets[partition], value)
        offsets[partition] += 1
        if n % COMMIT_EVERY == 0:
            written += len(fold.changed())
    written += len(fold.changed())
    return time.process_time() - start, fold.commands, written


async def consume_all(
    bootstrap: str,
    topic: str,
    group: str,
    expected: int,
    handle: Callable[[int, int, bytes | None], Awaitable[None]],
    commit: Callable[[], Awaitable[None]],
    max_records: int = 1000,
) -> None:
    """Consume `expected` records of `topic` as a group member; `commit` every 1 s or 1000 records and at the end
    (it must flush before `consumer.commit`, which runs after it)."""
    consumer = AIOKafkaConsumer(
        topic,
        bootstrap_servers=bootstrap,
        group_id=group,
        enable_auto_commit=False,
        auto_offset_reset="earliest",
        fetch_max_wait_ms=50,  # streams/worker/transport.py
    )
    await consumer.start()
    try:
        seen, since, last = 0, 0, time.monotonic()
        while seen < expected:
            batch = await consumer.getmany(timeout_ms=100, max_records=max_records)
            for tp, messages in batch.items():
                for m in messages:
                    await handle(tp.partition, m.offset, m.value)
                seen += len(messages)
                since += len(messages)
            if since >= COMMIT_EVERY or time.monotonic() - last >= COMMIT_INTERVAL_S or seen >= expected:
                await commit()
                await consumer.commit()  # the positions of everything handled: all below it is durable
                since, last = 0, time.monotonic()
    finally:
        await consumer.stop()


async def sent(
    producer: AIOKafkaProducer, unbatched: bool, topic: str, value: bytes, key: bytes, partition: int
) -> None:
    """Send a record; `unbatched`: wait for its acknowledgement, so each record is a produce request of its own."""
    delivery = await producer.send(topic, value=value, key=key, partition=partition)
    if unbatched:
        await delivery


async def stage_router(
    bootstrap: str, run: str, records: list[Record], document: ConfigDocument, unbatched: bool
) -> dict[str, Any]:
    """Stage 2: copy the log to `<run>.in`, then fold it from a bare consumer, writing states once per commit."""
    topics = {f"{run}.{name}": PARTITIONS for name in ("in", "effects", "state-changelog", "attempts", "outcomes")}
    await ensure_topics(bootstrap, topics)
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all", enable_idempotence=True)
    await producer.start()
    try:
        for partition, key, value in records:
            await producer.send(f"{run}.in", value=value, key=key, partition=partition)
        await producer.flush()
        fold = Fold(document)
        states = 0

        async def handle(partition: int, offset: int, value: bytes | None) -> None:
            for key, command in fold.step(partition, offset, value):
                await sent(producer, unbatched, f"{run}.effects", command, key.encode(), partition)

        async def commit() -> None:
            nonlocal states
            for key, partition, state in fold.changed():
                await producer.send(f"{run}.state-changelog", value=state, key=key.encode(), partition=partition)
                states += 1
            await producer.flush()

        start = time.process_time()
        batch = 1 if unbatched else 1000
        await consume_all(bootstrap, f"{run}.in", f"{run}.router", len(records), handle, commit, batch)
        cpu = time.process_time() - start
    finally:
        await producer.stop()
    return {"cpu_s": cpu, "commands": fold.commands, "states": states}


async def stage_effects(bootstrap: str, run: str, commands: int, unbatched: bool) -> dict[str, Any]:
    """Stage 3: consume the commands; an attempt written and flushed before each non-read; an outcome after."""
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all", enable_idempotence=True)
    await producer.start()
    attempts = 0
    try:

        async def handle(partition: int, offset: int, value: bytes | None) -> None:
            nonlocal attempts
            command = decode_command(value)
            if needs_attempt_record(command):
                attempt = b'{"command_id":"%s","at_ms":%d}' % (command.command_id.encode(), command.at_ms)
                await producer.send(f"{run}.attempts", value=attempt, key=command.key.encode(), partition=partition)
                await producer.flush()  # the attempt is durable before the call can happen
                attempts += 1
            outcome = encode(command)  # an outcome of about a command's size (no call is made)
            await sent(producer, unbatched, f"{run}.outcomes", outcome, command.key.encode(), partition)

        async def commit() -> None:
            await producer.flush()

        start = time.process_time()
        batch = 1 if unbatched else 1000
        await consume_all(bootstrap, f"{run}.effects", f"{run}.effect-side", commands, handle, commit, batch)
        cpu = time.process_time() - start
    finally:
        await producer.stop()
    return {"cpu_s": cpu, "attempts": attempts}


async def main_async(args: argparse.Namespace) -> None:
    book = await read_book(args.bootstrap, args.app)
    document = book.latest
    if document is None:
        raise SystemExit(f"{args.app}.configs holds no configuration")
    records = await read_log(args.bootstrap, f"{args.app}.conversations")
    keys = {decode_conversation_event(v).key for _, _, v in records if decode_marker(v) is None}
    conversations = sum(1 for k in keys if is_conversation_key(k))
    print(f"{len(records)} records of {args.app}.conversations, {conversations} conversations", flush=True)

    def per(seconds: float) -> str:
        return f"{1000 * seconds / conversations:.2f} ms/conversation"

    cold, commands, states = stage_fold(records, document)  # the first pass fills pydantic's and the fold's caches
    cpu, _, _ = stage_fold(records, document)
    print(f"fold (in memory): {per(cpu)} ({per(cold)} the first time); {commands} commands, {states} state records")
    for unbatched in (False, True):
        how = "one record per fetch and per produce request" if unbatched else "batched"
        run = f"bare-{int(time.time())}-{'unbatched' if unbatched else 'batched'}"
        router = await stage_router(args.bootstrap, run, records, document, unbatched)
        print(f"router, {how}: {per(router['cpu_s'])}; {router['commands']} commands, {router['states']} states")
        effects = await stage_effects(args.bootstrap, run, router["commands"], unbatched)
        print(f"effects, {how} (no HTTP): {per(effects['cpu_s'])}; {effects['attempts']} attempts", flush=True)
        total = router["cpu_s"] + effects["cpu_s"]
        print(f"bare pipeline, {how}: {per(total)} (Kafka I/O and ours; the fold alone {per(cpu)})", flush=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bootstrap", required=True)
    parser.add_argument("--app", required=True, help="the ROUTER_APP_ID of a worker_bench.py run on that broker")
    asyncio.run(main_async(parser.parse_args()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
