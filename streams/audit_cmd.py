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
import html
import json
import os
import sys
from pathlib import Path

from aiokafka import ConsumerRecord
from pydantic import TypeAdapter, ValidationError

from handlers.log_reader import read_topic
from projections.audit import ConversationTrail, render_text
from projections.fold import DEFAULT_RETRY_BASE_MS
from schemas.config import ConfigError, RouterConfig, load_config_file
from schemas.records import ConversationEvent
from schemas.state import ConversationState

_EVENT = TypeAdapter(ConversationEvent)
STATE_TABLE = "conversation_state"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    what = parser.add_mutually_exclusive_group(required=True)
    what.add_argument("--conversation", metavar="ACCOUNT:CONVERSATION", help="print this conversation's timeline")
    what.add_argument("--verify", action="store_true", help="compare replayed states with the live table")
    parser.add_argument("--html", type=Path, metavar="FILE", help="also write the timeline as HTML")
    parser.add_argument("--config", help="configuration file (default $ROUTER_CONFIG)")


def _settings() -> tuple[str, str, int]:
    bootstrap = os.environ.get("KAFKA_BOOTSTRAP_SERVERS", "localhost:9092")
    app_id = os.environ.get("ROUTER_APP_ID", "chatwoot-router")
    retry_base = int(os.environ.get("ROUTER_RETRY_BASE_MS", DEFAULT_RETRY_BASE_MS))
    return bootstrap, app_id, retry_base


def _progress(count: int, rate: float) -> None:
    print(f"  … {count} records replayed ({rate:,.0f}/s)", file=sys.stderr, flush=True)


async def replay_all(
    bootstrap: str, topic: str, config: RouterConfig, retry_base_ms: int, only_key: str | None = None
) -> tuple[dict[str, ConversationTrail], int]:
    """Every conversation's trail rebuilt from the topic; returns the trails and the undecodable count."""
    trails: dict[str, ConversationTrail] = {}
    undecodable = 0

    def apply(record: ConsumerRecord[bytes, bytes]) -> None:
        nonlocal undecodable
        if only_key is not None and record.key != only_key.encode():
            return
        try:
            event = _EVENT.validate_json(record.value or b"")
        except ValidationError:
            undecodable += 1
            return
        trail = trails.setdefault(event.key, ConversationTrail(key=event.key))
        trail.apply(event, record.offset, config, retry_base_ms=retry_base_ms)

    await read_topic(bootstrap, topic, apply, progress=_progress)
    return trails, undecodable


def render_html(trail: ConversationTrail) -> str:
    rows = "\n".join(
        f"<tr><td>{e.at_ms}</td><td>{html.escape(e.what)}</td><td>{html.escape(e.detail)}</td></tr>"
        for e in trail.entries
    )
    return (
        f"<!doctype html><meta charset=utf-8><title>conversation {html.escape(trail.key)}</title>"
        f"<h1>conversation {html.escape(trail.key)}</h1><table border=1 cellpadding=4>"
        f"<tr><th>time (ms)</th><th>what</th><th>detail</th></tr>\n{rows}\n</table>\n"
    )


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
    try:
        config = load_config_file(args.config or os.environ.get("ROUTER_CONFIG") or "")
    except ConfigError as exc:
        print(str(exc), file=sys.stderr)
        return 2
    bootstrap, app_id, retry_base = _settings()
    topic = f"{app_id}.conversations"
    if args.conversation:
        trails, _ = asyncio.run(replay_all(bootstrap, topic, config, retry_base, only_key=args.conversation))
        trail = trails.get(args.conversation) or ConversationTrail(key=args.conversation)
        print(render_text(trail), end="")
        if args.html:
            args.html.write_text(render_html(trail), encoding="utf-8")
        return 0
    trails, undecodable = asyncio.run(replay_all(bootstrap, topic, config, retry_base))
    live = asyncio.run(read_live_states(bootstrap, app_id))
    problems = diff_states({k: t.state for k, t in trails.items()}, live)
    for line in problems:
        print(line)
    print(f"{len(trails)} conversations replayed, {undecodable} undecodable records, {len(problems)} differences")
    return 1 if problems else 0
