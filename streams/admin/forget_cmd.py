"""`chatwoot-router forget --conversation A:C | --contact A:ID --reason TEXT` (issue 32): erase a conversation, or
every conversation of a contact, by destroying its data key.

Each conversation gets a `ForgetRequested` on `<app>.conversations` (acks=all); the worker that owns it replaces
the data key with the erasure fence on `<app>.keys`, drops what still runs for it and writes `Forgotten` (the
proof), both acknowledged by Kafka before it goes on. The command waits for every `Forgotten` it asked for and
exits 0 only then, printing by when compaction will have removed the old key from every broker: the proof's time
plus the erasure deadline, ROUTER_ERASURE_DEADLINE_MS (the `max.compaction.lag.ms` the router gives `<app>.keys`),
or the topic's own `max.compaction.lag.ms` when the brokers say it is longer (then it says so, and `topics --fix`
sets it). A contact's conversations are found on `<app>.keys` by the contact id kept beside each data key. Exit 1
when the erasure was not confirmed in time (no worker running?), 2 on bad arguments.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
import uuid
from datetime import UTC, datetime

from aiokafka import AIOKafkaConsumer, TopicPartition
from pydantic import ValidationError

from handlers.kafka.retry import KafkaUnusable
from handlers.kafka.security import client_options
from handlers.kafka.topic_io import durable_producer
from handlers.kafka.topics import configured_erasure_deadline_ms, keys_compaction_lag_ms
from handlers.privacy.keyring import fence_roll_every_ms
from handlers.privacy.reader_keys import read_reader_keys
from projections.topic_settings import human_ms
from schemas.keys import ConversationKey, parse_key
from schemas.records import ForgetRequested, Forgotten
from streams.worker.env import WorkerEnv
from streams.worker_cmd import env_or_exit

EXIT_INVALID = 2
DEFAULT_TIMEOUT_S = 120.0


def add_arguments(parser: argparse.ArgumentParser) -> None:
    which = parser.add_mutually_exclusive_group(required=True)
    which.add_argument("--conversation", metavar="A:C", help="the conversation: account id and conversation id")
    which.add_argument("--contact", metavar="A:ID", help="every conversation of this contact (account id, contact id)")
    parser.add_argument("--reason", required=True, help="why (kept on the log as the proof's reason; no personal data)")
    parser.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT_S, help="seconds to wait for the workers")


def _pair(text: str, what: str) -> tuple[int, int]:
    left, _, right = text.partition(":")
    if not (left.isdigit() and right.isdigit()):
        raise ValueError(f"{what} must be ACCOUNT:ID (two numbers), got {text!r}")
    return int(left), int(right)


async def conversations_of_contact(env: WorkerEnv, account: int, contact: int) -> list[str]:
    """The conversations whose latest key record names this contact: a data key, or the fence of a text erasure
    (ROUTER_TEXT_RETENTION_DAYS: its text is gone, but the conversation is not forgotten yet)."""
    keys = await read_reader_keys(env.bootstrap, env.app_id)
    found = []
    for key, contact_id in keys.contacts.items():
        parsed = parse_key(key)
        if isinstance(parsed, ConversationKey) and parsed.account_id == account and contact_id == contact:
            found.append(key)
    return sorted(found)


def proof_in(value: bytes | None) -> Forgotten | None:
    """The `Forgotten` record `value` holds, or None: any other record (an outcome may name the reason "forgotten"),
    or one this release cannot read, is passed over, never a crash."""
    if value is None or b'"forgotten"' not in value:
        return None
    try:
        return Forgotten.model_validate_json(value)
    except ValidationError:
        return None


async def forget(env: WorkerEnv, keys: list[str], reason: str, timeout_s: float) -> dict[str, Forgotten]:
    """Ask for each erasure, then wait for each proof; returns the proofs found (by conversation key)."""
    topic = env.topic("conversations")
    asked: dict[str, str] = {}
    starts: dict[TopicPartition, int] = {}
    async with durable_producer(env.bootstrap) as producer:
        for key in keys:
            parsed = parse_key(key)
            assert isinstance(parsed, ConversationKey)
            request = ForgetRequested(
                at_ms=time.time_ns() // 1_000_000,
                account_id=parsed.account_id,
                conversation_id=parsed.conversation_id,
                reason=reason,
                request_id=uuid.uuid4().hex,
            )
            sent = await producer.send_and_wait(topic, value=request.model_dump_json().encode(), key=key.encode())
            asked[request.request_id] = key
            tp = TopicPartition(topic, sent.partition)
            starts[tp] = min(starts.get(tp, sent.offset), sent.offset)
    proofs: dict[str, Forgotten] = {}
    consumer = AIOKafkaConsumer(bootstrap_servers=env.bootstrap, enable_auto_commit=False, **client_options())
    await consumer.start()
    try:
        consumer.assign(list(starts))
        for tp, offset in starts.items():
            consumer.seek(tp, offset)
        async with asyncio.timeout(timeout_s):
            while len(proofs) < len(asked):
                for records in (await consumer.getmany(timeout_ms=500)).values():
                    for record in records:
                        proof = proof_in(record.value)
                        if proof is not None and proof.request_id in asked:
                            proofs[asked[proof.request_id]] = proof
    except TimeoutError:
        pass
    finally:
        await consumer.stop()
    return proofs


def _when(ms: int) -> str:
    return datetime.fromtimestamp(ms / 1000, tz=UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def erasure_deadline(configured_ms: int, topic_ms: int | None) -> tuple[int, str | None]:
    """The deadline to promise: the configured one, unless the brokers compact `<app>.keys` later than that
    (then theirs, and a line saying so); a topic that compacts sooner keeps the promise all the same."""
    if topic_ms is None or topic_ms <= configured_ms:
        return configured_ms, None
    return topic_ms, (
        f"warning: the brokers compact the keys topic within max.compaction.lag.ms={human_ms(str(topic_ms))}, "
        f"longer than ROUTER_ERASURE_DEADLINE_MS={human_ms(str(configured_ms))}: run `chatwoot-router topics --fix`"
    )


async def _topic_lag_ms(env: WorkerEnv) -> int | None:
    """The keys topic's `max.compaction.lag.ms` as the brokers describe it (None when they cannot say)."""
    try:
        async with asyncio.timeout(10):
            return await keys_compaction_lag_ms(env.bootstrap, env.app_id)
    except Exception:  # not allowed to describe it, or a broker gone: the setting is what is promised
        return None


def run(args: argparse.Namespace) -> int:
    env = env_or_exit()  # exit 2 on a bad variable, ROUTER_ERASURE_DEADLINE_MS too
    configured_ms = configured_erasure_deadline_ms()
    try:
        if args.conversation is not None:
            account, conversation = _pair(args.conversation, "--conversation")
            keys = [f"{account}:{conversation}"]
        else:
            account, contact = _pair(args.contact, "--contact")
            keys = asyncio.run(conversations_of_contact(env, account, contact))
    except ValueError as exc:
        print(f"Invalid argument: {exc}", file=sys.stderr)
        return EXIT_INVALID
    if len(args.reason) > 200 or not args.reason.strip():
        print("Invalid argument: --reason must be 1 to 200 characters", file=sys.stderr)
        return EXIT_INVALID
    if not keys:
        print(f"no conversation of contact {args.contact} has a data key: nothing of it is stored sealed")
        return 0
    try:
        proofs = asyncio.run(forget(env, keys, args.reason.strip(), args.timeout))
    except KafkaUnusable as exc:
        print(f"forget not durable: {exc}", file=sys.stderr)
        return 1
    missing = [key for key in keys if key not in proofs]
    deadline_ms, warning = erasure_deadline(configured_ms, asyncio.run(_topic_lag_ms(env)) if proofs else None)
    if warning is not None:
        print(warning, file=sys.stderr)
    for key in keys:
        proof = proofs.get(key)
        if proof is not None:
            # the brokers' deadline, plus the time the owner may take to write the fence again past it (a quiet
            # keys partition's segment rolls only then: handlers/privacy/keyring.py `roll_fences`)
            gone = _when(proof.at_ms + deadline_ms + fence_roll_every_ms(configured_ms))
            print(f"forgotten {key} at {_when(proof.at_ms)}; its old data key is compacted away by {gone}")
    if missing:
        print(
            f"not confirmed within {args.timeout:g} s: {', '.join(missing)} (is a worker running? the request stays on "
            "the log and is carried out when one is)",
            file=sys.stderr,
        )
        return 1
    return 0
