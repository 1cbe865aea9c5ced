"""`chatwoot-router audit`: a conversation's timeline, or a check of the live tables, from the event log.

    chatwoot-router audit --conversation 1:42 [--html FILE]
    chatwoot-router audit --verify [--conversation 1:42] [--jobs N]

Both replay `<app>.conversations` with the same fold the worker runs, in memory, without executing effects.
`--conversation` reads only that conversation's partition (handlers/logs/audit.py). `--verify` rebuilds every
conversation's state and compares it with the live table (its changelog topic), partition by partition and
`--jobs` partitions at a time; any difference is a bug and is reported by key. A log whose head was deleted is
said to be partial, with how many records are gone and from when the history is kept.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import sys
from pathlib import Path
from typing import Any

from handlers.console.render import render_conversation
from handlers.kafka.config_store import read_book
from handlers.logs.audit import (
    Feed,
    VerifyJob,
    conversation_partition,
    read_conversation,
    table_key,
    verify_partition,
    verify_plan,
)
from handlers.logs.progress import ReadProgress
from handlers.logs.reader import key_shares
from handlers.logs.shards import ShardFailed, jobs_for, run_sharded
from handlers.privacy.reader_keys import read_reader_keys
from projections.logs.audit import LogReplay, render_text
from projections.logs.scan import History, LogScan
from projections.logs.verify import Verified, diff_states
from schemas.config import ConfigError, RouterConfig, load_config_file
from schemas.configs import ConfigBook
from streams.config_cmd import env_or_exit

__all__ = ["_table_key", "diff_states", "run"]

_table_key = table_key  # kept under its old name (tests import it from here)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--conversation", metavar="ACCOUNT:CONVERSATION", help="print this conversation's timeline")
    parser.add_argument(
        "--verify",
        action="store_true",
        help="compare replayed states with the live table (only --conversation's, when given)",
    )
    parser.add_argument(
        "--html", type=Path, metavar="FILE", help="also write the console's conversation page as a standalone file"
    )
    parser.add_argument(
        "--config",
        help="configuration file, only for a log without applied configuration versions (default $ROUTER_CONFIG)",
    )
    parser.add_argument(
        "--jobs",
        type=_jobs,
        metavar="N",
        help="--verify of everything: partitions compared at a time, one process each (default: the machine's cores)",
    )


def _jobs(text: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError("a number of processes, 1 or more")
    return int(text)


def _settings() -> tuple[str, str, int]:
    env = env_or_exit()  # the one settings model of every command (exit 2 on a bad variable)
    return env.bootstrap, env.app_id, env.retry_base_ms


def configurations(
    args: argparse.Namespace, bootstrap: str, app_id: str, retry_base_ms: int
) -> tuple[ConfigBook, RouterConfig | None] | None:
    """The applied configuration versions; the file and the environment only for a log without any."""
    book = asyncio.run(read_book(bootstrap, app_id))
    if len(book):
        return book, None
    try:
        config = load_config_file(args.config or env_or_exit().config_path or "")
    except ConfigError as exc:
        print(f"no configuration version was ever applied on {app_id}.configs; {exc}", file=sys.stderr)
        return None
    return book, config


def new_replay(book: ConfigBook, config: RouterConfig | None, retry_base_ms: int) -> LogReplay:
    return LogReplay(book=book) if len(book) else LogReplay(config, retry_base_ms=retry_base_ms)


def render_html(key: str, replay: LogReplay) -> str:
    """The console's conversation page for `key`, as a standalone file (inline CSS, no script, no server links),
    drawn from the timeline the text is printed from; None when the log has no record of it."""
    trail = replay.trails.get(key)
    return render_conversation(key, trail.timeline if trail is not None else None, standalone=True)


def say_partial(history: History) -> None:
    if history.is_partial:
        print(f"audit: note: {history.describe()}", file=sys.stderr, flush=True)


def timeline(args: argparse.Namespace, bootstrap: str, app_id: str, replay: LogReplay) -> int:
    key = args.conversation
    partition = asyncio.run(conversation_partition(bootstrap, f"{app_id}.conversations", key))
    # its data key is in the partition of the same number of `<app>.keys`: opens its inputs with the KEK
    replay.opener = asyncio.run(read_reader_keys(bootstrap, app_id, only={key}, partitions=[partition])).open_decide
    feeds: list[Feed] = [lambda value, offset, partition, _key: replay.feed(value, offset, partition)]
    scans: list[LogScan[Any]] = [replay.scan]
    read = asyncio.run(read_conversation(bootstrap, app_id, key, feeds, scans))
    if read.partial:
        say_partial(read.history)
    print(render_text(replay.trail(key)), end="")
    if args.html:
        args.html.write_text(render_html(key, replay), encoding="utf-8")
    return 0


def verify(
    args: argparse.Namespace, bootstrap: str, app_id: str, book: ConfigBook, legacy: tuple[RouterConfig, int] | None
) -> int:
    job = VerifyJob(bootstrap, app_id, book, legacy, only_key=args.conversation)
    if args.conversation:
        topic = f"{app_id}.conversations"
        partition = asyncio.run(conversation_partition(bootstrap, topic, args.conversation))
        verified = asyncio.run(verify_partition(job, partition))
        say_partial(asyncio.run(verify_plan(bootstrap, app_id)).history.only([partition]))
    else:
        planned = asyncio.run(verify_plan(bootstrap, app_id))
        say_partial(planned.history)
        sizes = {span.partition: span.size for span in planned.spans}
        jobs = jobs_for(planned.records, args.jobs)
        progress = ReadProgress("audit --verify", {p: n * len(key_shares(n)) for p, n in sizes.items()})
        try:
            parts = run_sharded(functools.partial(verify_partition, job), sizes, jobs, progress)
        except ShardFailed as exc:
            print(f"audit --verify: {exc}", file=sys.stderr)
            return 1
        finally:
            progress.close()
        verified = Verified()
        for part in parts.values():
            verified.merge(part)
    for line in verified.lines():
        print(line)
    return 1 if verified.differences else 0


def run(args: argparse.Namespace) -> int:
    if not (args.conversation or args.verify):
        print("chatwoot-router audit: give --conversation ACCOUNT:CONVERSATION, --verify, or both", file=sys.stderr)
        return 2
    bootstrap, app_id, retry_base = _settings()
    found = configurations(args, bootstrap, app_id, retry_base)
    if found is None:
        return 2
    book, config = found
    if args.conversation and not args.verify:
        return timeline(args, bootstrap, app_id, new_replay(book, config, retry_base))
    legacy = (config, retry_base) if config is not None else None
    return verify(args, bootstrap, app_id, book, legacy)
