"""`chatwoot-router replay dlq|state`: re-publish dead-lettered records, or rebuild the tables from the log.

`replay state [--to-app NEW] [--accept-partial-history] [--jobs N]` rebuilds the router's tables from the event
log with the current fold, without executing any effect (handlers/logs/state_rebuild.py; the cut-over procedure is in
README), one partition per process, `--jobs` at a time. A log that lost records from its head is refused (exit 2,
naming the partitions and how many records are gone) unless `--accept-partial-history`. `--to-app` copies the data
keys too, and seals what a log written before sealing holds in clear (that needs ROUTER_KEY_ENCRYPTION_KEY: without
it the copy stops at the first such field, exit 1, one line; docs/privacy.md "Logs written before sealing").

`replay dlq` re-publishes dead-lettered records to their source topic once their cause is fixed.

Each record on `<app>.dlq` carries its original key and value and the headers the worker wrote (error, source
topic/partition/offset, attempts). Re-publishing sends the original bytes back to the source topic with the same
key, so the conversation's single writer folds them in order with everything else; the fold's idempotence makes
a record that had in fact been applied a no-op. Progress is committed under the consumer group
`<app>.dlq-replay`, so running the command twice never re-publishes a record twice. `--dry-run` only lists.
"""

from __future__ import annotations

import argparse
import asyncio
import sys

from aiokafka import AIOKafkaConsumer

from handlers.kafka.security import client_options
from handlers.kafka.topic_io import durable_producer, topic_partitions
from schemas.config import _APP_ID as APP_ID
from streams.config_cmd import env_or_exit


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("what", choices=["dlq", "state"], help="what to replay")
    parser.add_argument("--dry-run", action="store_true", help="dlq: list what would be re-published, change nothing")
    parser.add_argument(
        "--to-app", metavar="NEW_APP_ID", help="state: rebuild into this new app id (blue/green) instead of in place"
    )
    parser.add_argument(
        "--accept-partial-history",
        action="store_true",
        help="state: rebuild even though records were deleted from the head of the event log (refused otherwise)",
    )
    parser.add_argument(
        "--jobs",
        type=_jobs,
        metavar="N",
        help="state: partitions folded at a time, one process each (default: the machine's cores)",
    )


def _jobs(text: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError("a number of processes, 1 or more")
    return int(text)


def _header(headers: tuple[tuple[str, bytes], ...] | list[tuple[str, bytes]], name: str) -> str | None:
    for key, value in headers:
        if key == name:
            return value.decode(errors="replace")
    return None


async def replay_dlq(bootstrap: str, app_id: str, *, dry_run: bool) -> tuple[int, int]:
    """Re-publish every not-yet-replayed DLQ record; returns (re-published, skipped without a source)."""
    dlq = f"{app_id}.dlq"
    partitions = await topic_partitions(bootstrap, dlq)
    consumer = AIOKafkaConsumer(
        bootstrap_servers=bootstrap,
        group_id=f"{app_id}.dlq-replay",
        enable_auto_commit=False,
        auto_offset_reset="earliest",
        **client_options(),
    )
    await consumer.start()
    published = skipped = 0
    try:
        async with durable_producer(bootstrap) as producer:
            consumer.assign(partitions)
            ends = await consumer.end_offsets(partitions)
            for tp in partitions:
                while await consumer.position(tp) < ends[tp]:
                    batch = await consumer.getmany(tp, timeout_ms=1000)
                    for record in batch.get(tp, []):
                        if record.offset >= ends[tp]:
                            break
                        source = _header(record.headers, "source_topic")
                        error = _header(record.headers, "error") or "?"
                        print(f"{dlq}[{tp.partition}]@{record.offset} → {source or 'no source'}: {error}")
                        if source is None or not source.startswith(f"{app_id}."):
                            skipped += 1
                            continue
                        if not dry_run:
                            await producer.send_and_wait(source, value=record.value, key=record.key)
                        published += 1
                    if not dry_run:
                        await consumer.commit()
    finally:
        await consumer.stop()
    return published, skipped


def replay_state(
    bootstrap: str,
    app_id: str,
    to_app: str | None,
    log_retention_ms: int | None = None,
    *,
    accept_partial_history: bool = False,
    jobs: int | None = None,
) -> int:
    import logging

    from aiokafka.errors import KafkaError

    from handlers.kafka.retry import KafkaUnusable, print_waiting, retrying
    from handlers.kafka.topics import log_topic_findings
    from handlers.logging_setup import configure_logging
    from handlers.logs.key_copy import KekNeeded
    from handlers.logs.shards import ShardFailed
    from handlers.logs.state_rebuild import PartialHistoryRefused, RebuildRefused, Summary, rebuild

    async def checked_rebuild() -> Summary:
        await log_topic_findings(bootstrap, app_id, log_retention_ms)  # one warning per finding; goes on anyway
        return await retrying(  # transient broker states are waited out; a rebuild resumes where it stopped
            lambda: rebuild(
                bootstrap,
                app_id,
                to_app=to_app,
                log_retention_ms=log_retention_ms,
                accept_partial_history=accept_partial_history,
                jobs=jobs,
            ),
            bootstrap=bootstrap,
            on_wait=print_waiting("replay state", bootstrap),
        )

    handler = configure_logging(logging.WARNING)  # the topic check's findings, as JSON lines on stderr
    try:
        summary = asyncio.run(checked_rebuild())
    except PartialHistoryRefused as exc:
        print(f"chatwoot-router replay state: refused: {exc}", file=sys.stderr)
        return 2
    except (RebuildRefused, KekNeeded, LookupError, KafkaUnusable, ShardFailed) as exc:
        print(f"chatwoot-router replay state: {exc}", file=sys.stderr)
        return 1
    except (KafkaError, OSError) as exc:
        print(f"chatwoot-router replay state: kafka at {bootstrap}: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    finally:
        handler.close()
    if summary.history is not None and summary.history.is_partial:
        print(f"chatwoot-router replay state: rebuilt from a partial history: {summary.history.describe()}")
    where = f"into {to_app}" if to_app else "in place"
    keys = f"{summary.keys_written} data keys written, {summary.sealed} records sealed, " if to_app else ""
    print(
        f"rebuilt {app_id} {where}: {summary.copied} records copied, {keys}{summary.records} records folded, "
        f"{summary.conversations} conversations, {summary.runs_in_flight} runs in flight, "
        f"{summary.undecodable} undecodable, {summary.seconds:.1f} s ({summary.jobs} job(s))"
    )
    return 0


def run(args: argparse.Namespace) -> int:
    env = env_or_exit()  # the one settings model of every command (exit 2 on a bad variable)
    bootstrap, app_id = env.bootstrap, env.app_id
    if args.what == "state":
        if args.to_app is not None and (args.to_app == app_id or not APP_ID.fullmatch(args.to_app)):
            print(f"chatwoot-router replay state: --to-app: must be a new app id ({APP_ID.pattern})", file=sys.stderr)
            return 2
        return replay_state(
            bootstrap,
            app_id,
            args.to_app,
            env.log_retention_ms,
            accept_partial_history=args.accept_partial_history,
            jobs=args.jobs,
        )
    try:
        published, skipped = asyncio.run(replay_dlq(bootstrap, app_id, dry_run=args.dry_run))
    except LookupError as exc:
        print(f"chatwoot-router replay: {exc}", file=sys.stderr)
        return 1
    verb = "would re-publish" if args.dry_run else "re-published"
    print(f"{verb} {published} record(s); {skipped} without a source topic of this app left alone")
    return 0
