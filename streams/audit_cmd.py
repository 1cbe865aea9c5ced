"""`chatwoot-router audit`: a conversation's timeline, or a check of the live tables, from the event log.

    chatwoot-router audit --conversation 1:42 [--html FILE]
    chatwoot-router audit --verify

Both replay `<app>.conversations` with the same fold the worker runs, in memory, without executing effects.
`--verify` rebuilds every conversation's state and compares it with the live table (its changelog topic);
any difference is a bug and is reported by key.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import sys
from pathlib import Path

from aiokafka import ConsumerRecord

from handlers.config_store import read_book
from handlers.console.render import render_conversation
from handlers.kafka_io import read_topic
from projections.audit import LogReplay, render_text
from projections.console_model import ConsoleModel
from schemas.config import ConfigError, load_config_file
from schemas.records import MARKER_KEY
from schemas.state import ConversationState
from streams.config_cmd import env_or_exit

STATE_TABLE = "conversation_state"


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


def _settings() -> tuple[str, str, int]:
    env = env_or_exit()  # the one settings model of every command (exit 2 on a bad variable)
    return env.bootstrap, env.app_id, env.retry_base_ms


def _progress(count: int, rate: float) -> None:
    print(f"  … {count} records replayed ({rate:,.0f}/s)", file=sys.stderr, flush=True)


async def replay_all(
    bootstrap: str, topic: str, replay: LogReplay, only_key: str | None = None, page: ConsoleModel | None = None
) -> LogReplay:
    """Every conversation's trail (or only `only_key`'s) rebuilt from the topic; markers always apply. `page`,
    when given, is fed the same records (the console's read model, for --html)."""
    wanted = {only_key.encode(), MARKER_KEY.encode()} if only_key is not None else None

    def apply(record: ConsumerRecord[bytes, bytes]) -> None:
        if wanted is None or record.key in wanted:
            replay.feed(record.value, record.offset, record.partition)
            if page is not None:
                page.feed(record.value, record.offset, record.partition, record.key)

    await read_topic(bootstrap, topic, apply, progress=_progress)
    return replay


def new_replay(args: argparse.Namespace, bootstrap: str, app_id: str, retry_base_ms: int) -> LogReplay | None:
    """A replay under the applied configuration versions; the file and the environment only for an old log."""
    book = asyncio.run(read_book(bootstrap, app_id))
    if len(book):
        return LogReplay(book=book)
    try:
        config = load_config_file(args.config or env_or_exit().config_path or "")
    except ConfigError as exc:
        print(f"no configuration version was ever applied on {app_id}.configs; {exc}", file=sys.stderr)
        return None
    return LogReplay(config, retry_base_ms=retry_base_ms)


def render_html(key: str, page: ConsoleModel) -> str:
    """The console's conversation page for `key`, as a standalone file (inline CSS, no script, no server links)."""
    return render_conversation(key, page.timeline(key), standalone=True)


def page_model(replay: LogReplay, key: str) -> ConsoleModel:
    """The console's read model of one conversation, folded under the same configurations as `replay`."""
    return ConsoleModel(replay.config, retry_base_ms=replay.retry_base_ms, book=replay.book, only_key=key)


async def read_live_states(bootstrap: str, app_id: str) -> dict[str, ConversationState]:
    """The live table, read back from its changelog topic (last value per key wins)."""
    states: dict[str, ConversationState] = {}

    def apply(record: ConsumerRecord[bytes, bytes]) -> None:
        key = _table_key(record.key)
        if record.value is None:
            states.pop(key, None)
        else:
            states[key] = ConversationState.model_validate_json(record.value)

    await read_topic(bootstrap, f"{app_id}-{STATE_TABLE}-changelog", apply)
    return states


def _table_key(raw: bytes | None) -> str:
    """Faust writes table keys to the changelog as JSON strings; accept raw keys too."""
    text = (raw or b"").decode()
    if text.startswith('"'):
        with contextlib.suppress(ValueError):
            decoded = json.loads(text)
            if isinstance(decoded, str):
                return decoded
    return text


def diff_states(replayed: dict[str, ConversationState], live: dict[str, ConversationState]) -> list[str]:
    """Keys whose replayed and live states differ, each with a short description."""
    problems = []
    for key in sorted(set(replayed) | set(live)):
        mine, theirs = replayed.get(key), live.get(key)
        if mine is None or theirs is None:
            problems.append(f"{key}: {'only in the live table' if mine is None else 'missing from the live table'}")
        elif mine != theirs:
            fields = [f for f in type(mine).model_fields if getattr(mine, f) != getattr(theirs, f)]
            problems.append(f"{key}: differs in {', '.join(fields)}")
    return problems


def run(args: argparse.Namespace) -> int:
    if not (args.conversation or args.verify):
        print("chatwoot-router audit: give --conversation ACCOUNT:CONVERSATION, --verify, or both", file=sys.stderr)
        return 2
    bootstrap, app_id, retry_base = _settings()
    topic = f"{app_id}.conversations"
    fresh = new_replay(args, bootstrap, app_id, retry_base)
    if fresh is None:
        return 2
    if args.conversation and not args.verify:
        page = page_model(fresh, args.conversation) if args.html else None
        replay = asyncio.run(replay_all(bootstrap, topic, fresh, only_key=args.conversation, page=page))
        trail = replay.trail(args.conversation)
        print(render_text(trail), end="")
        if args.html and page is not None:
            args.html.write_text(render_html(args.conversation, page), encoding="utf-8")
        return 0
    replay = asyncio.run(replay_all(bootstrap, topic, fresh, only_key=args.conversation))
    live = asyncio.run(read_live_states(bootstrap, app_id))
    if args.conversation:
        live = {k: v for k, v in live.items() if k == args.conversation}
    problems = diff_states({k: t.state for k, t in replay.trails.items()}, live)
    for line in problems:
        print(line)
    print(
        f"{len(replay.trails)} conversations replayed, {replay.undecodable} undecodable records, "
        f"{len(problems)} differences"
    )
    return 1 if problems else 0
