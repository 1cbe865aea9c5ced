"""`chatwoot-router whatif`: what recorded turns would have done under a candidate configuration (DESIGN §8).

    chatwoot-router whatif --config CANDIDATE [--since 7d | --from 2025-01-01T00:00:00Z] [--account N]
                           [--conversation A:C] [--ask [--cache DIR]] [--json FILE] [--html FILE]

Replays `<app>.conversations` under the configuration versions that were in force (`<app>.configs`; only for a
log without any, `ROUTER_CONFIG`) and re-decides every run that reached a decision under the candidate with the
router's own fold (projections/whatif/replay.py). It never calls Chatwoot. With `--ask` it puts the candidate's new
System One questions to the candidate's endpoint and model (`TYPESAFE_API_KEY`), answers cached under `--cache`.
An invalid candidate is reported like `config check` (exit 2).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

from aiokafka.errors import KafkaError

from handlers.clients.systemone import SystemOneClient
from handlers.kafka.config_store import read_book
from handlers.logs.progress import ReadProgress
from handlers.logs.reader import Plan
from handlers.logs.shards import ShardFailed
from handlers.logs.whatif import (
    DEFAULT_CACHE_DIR,
    DEFAULT_CONCURRENCY,
    AnswerCache,
    WhatifJob,
    ask,
    plan_for,
    replay,
    work_of,
)
from projections.whatif import tally as whatif_tally
from projections.whatif.render import render_html, render_text
from projections.whatif.report import Report
from projections.whatif.tally import Selection, TurnTally
from schemas.config import ConfigError, RouterConfig, load_config_file
from schemas.configs import ConfigBook, ConfigDocument, FoldSettings
from streams.config_cmd import EXIT_INVALID_CONFIG, env_or_exit, fail


def _argument(parse: Callable[[str], int]) -> Callable[[str], int]:
    """An option parser that argparse reports with the parser's hint."""

    def parsed(text: str) -> int:
        try:
            return parse(text)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None

    return parsed


duration_s = _argument(whatif_tally.duration_s)
instant_ms = _argument(whatif_tally.instant_ms)


def conversation_key(text: str) -> str:
    if not whatif_tally.is_conversation_key(text):
        raise argparse.ArgumentTypeError(whatif_tally.CONVERSATION_HINT)
    return text


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", required=True, metavar="CANDIDATE", help="the candidate configuration file")
    when = parser.add_mutually_exclusive_group()
    when.add_argument("--since", type=duration_s, metavar="DURATION", help="only turns of the last 30m, 24h, 7d, …")
    when.add_argument("--from", dest="from_ms", type=instant_ms, metavar="ISO", help="only turns from this time on")
    parser.add_argument("--account", type=int, metavar="N", help="only this account's turns")
    parser.add_argument("--conversation", type=conversation_key, metavar="A:C", help="only this conversation")
    parser.add_argument(
        "--ask", action="store_true", help="put the candidate's new questions to System One (its endpoint and model)"
    )
    parser.add_argument(
        "--cache",
        type=Path,
        default=DEFAULT_CACHE_DIR,
        metavar="DIR",
        help=f"where --ask keeps System One's answers (default {DEFAULT_CACHE_DIR}/)",
    )
    parser.add_argument("--concurrency", type=int, default=DEFAULT_CONCURRENCY, help=argparse.SUPPRESS)
    parser.add_argument("--json", type=Path, metavar="FILE", help="also write the report as JSON")
    parser.add_argument("--html", type=Path, metavar="FILE", help="also write the report as a standalone page")
    parser.add_argument(
        "--jobs",
        type=_jobs,
        metavar="N",
        help="partitions replayed at a time, one process each (default: the machine's cores)",
    )


def _jobs(text: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError("a number of processes, 1 or more")
    return int(text)


def _live_book(book: ConfigBook, retry_base_ms: int, config_path: str | None) -> ConfigBook:
    """The applied versions; for a log that never had one, the file in `ROUTER_CONFIG` as its only version."""
    if len(book):
        return book
    if not config_path:
        raise ConfigError("CONFIG", "", "no configuration version was ever applied and ROUTER_CONFIG is unset")
    return ConfigBook([ConfigDocument.of(load_config_file(config_path), FoldSettings(retry_base_ms=retry_base_ms))])


async def _ask(
    report: Report, candidate: RouterConfig, api_key: str, cache: AnswerCache, concurrency: int
) -> tuple[dict[str, object], int, int, int]:
    async with SystemOneClient(candidate.routing.endpoint, api_key) as client:
        asked = await ask(report.questions(), client, cache, concurrency=max(1, concurrency))
    for digest, error in asked.failed.items():
        print(f"System One: question {digest[:12]}: {error}", file=sys.stderr)
    return asked.answers, asked.asked, asked.cached, len(asked.failed)


def replay_all(job: WhatifJob, planned: Plan, jobs: int | None) -> TurnTally:
    """`handlers.logs.whatif.replay` with progress on stderr."""
    progress = ReadProgress("whatif", work_of(job, planned))
    try:
        return replay(job, planned, jobs, progress)
    finally:
        progress.close()


def run(args: argparse.Namespace) -> int:
    env = env_or_exit()
    try:
        candidate = load_config_file(args.config)
    except ConfigError as exc:
        raise fail(exc) from None
    api_key = env.typesafe_api_key
    if args.ask and not (api_key and api_key.strip()):
        print("Invalid secrets: TYPESAFE_API_KEY: whatif --ask needs it", file=sys.stderr)
        return EXIT_INVALID_CONFIG
    version = ConfigDocument.of(candidate, FoldSettings(retry_base_ms=env.retry_base_ms)).version
    try:
        book = asyncio.run(read_book(env.bootstrap, env.app_id))
        live = _live_book(book, env.retry_base_ms, env.config_path)
    except ConfigError as exc:
        raise fail(exc) from None
    except (LookupError, KafkaError, OSError) as exc:
        print(f"whatif: kafka at {env.bootstrap}: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    from_ms = args.from_ms
    if args.since is not None:
        from_ms = time.time_ns() // 1_000_000 - args.since * 1000
    selection = Selection(from_ms=from_ms, account_id=args.account, key=args.conversation)
    job = WhatifJob(env.bootstrap, env.topic("conversations"), live, candidate, selection, window=from_ms is not None)
    try:
        planned = asyncio.run(plan_for(job))
        if planned.history.is_partial:
            print(f"whatif: note: {planned.history.describe()}", file=sys.stderr, flush=True)
        tally = replay_all(job, planned, args.jobs)
    except (LookupError, KafkaError, OSError, ShardFailed) as exc:
        print(f"whatif: kafka at {env.bootstrap}: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    report = tally.report(version)
    if args.ask and report.questions():
        assert api_key is not None
        answers, asked, cached, failed = asyncio.run(
            _ask(report, candidate, api_key, AnswerCache(args.cache), args.concurrency)
        )
        try:  # again with System One's answers (the first pass kept only the questions, never the turns)
            report = replay_all(replace(job, answers=answers), planned, args.jobs).report(version)
        except (LookupError, KafkaError, OSError, ShardFailed) as exc:
            print(f"whatif: kafka at {env.bootstrap}: {type(exc).__name__}: {exc}", file=sys.stderr)
            return 1
        report.asked, report.cached, report.ask_failures = asked, cached, failed
    print(render_text(report), end="")
    if args.json:
        args.json.write_text(json.dumps(report.as_json(), ensure_ascii=False, indent=2) + "\n", encoding="utf-8")
    if args.html:
        args.html.write_text(render_html(report), encoding="utf-8")
    return 0
