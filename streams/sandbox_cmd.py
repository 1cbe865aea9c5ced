"""`chatwoot-router sandbox`: serve the simulated Chatwoot and System One until interrupted.

Seeded from `--scenario` (a scenario file) or derived from `--config` (the router's configuration, with the
tokens and secrets from the same environment variables the router reads, so both sides agree). Prints one line
`ready url=http://HOST:PORT` once it accepts requests.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import sys
from pathlib import Path
from typing import Any

import yaml

from sandbox import run_sandbox
from sandbox.scenario import DEFAULT_API_KEY, DEFAULT_USER_TOKEN, SAMPLE, from_config
from sandbox.world import NEWEST_CHATWOOT
from schemas.config import ConfigError, load_config_file

EXIT_INVALID_CONFIG = 2


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    parser.add_argument("--port", type=int, default=3000, help="port to listen on (default 3000; 0 = any)")
    parser.add_argument("--config", help="router configuration to derive the scenario from")
    parser.add_argument(
        "--scenario", help="scenario file (JSON or YAML); takes precedence over --config; default: the sample scenario"
    )
    parser.add_argument("--webhook-url", help="where agent-bot webhooks go (bots without an outgoing_url)")
    parser.add_argument("--retry-delay", type=float, default=3.0, help="seconds between webhook retries (default 3)")
    parser.add_argument(
        "--chatwoot-version",
        default=NEWEST_CHATWOOT,
        help=f"the Chatwoot release to imitate on GET /api and in its behaviour (default {NEWEST_CHATWOOT})",
    )


def _account_map(name: str) -> dict[int, str]:
    raw = os.environ.get(name)
    if not raw:
        return {}
    try:
        parsed = json.loads(raw)
    except ValueError:
        return {}
    return {int(k): str(v) for k, v in parsed.items()} if isinstance(parsed, dict) else {}


def _scenario(args: argparse.Namespace) -> dict[str, Any] | None:
    if args.scenario:
        document = yaml.safe_load(Path(args.scenario).read_text(encoding="utf-8"))
        if not isinstance(document, dict):
            raise ConfigError("scenario", "", f"{args.scenario} is not a mapping")
        return document
    if args.config:
        return from_config(
            load_config_file(args.config),
            user_token=os.environ.get("CHATWOOT_TOKEN") or DEFAULT_USER_TOKEN,
            bot_tokens=_account_map("CHATWOOT_AGENT_BOT_TOKENS"),
            bot_secrets=_account_map("CHATWOOT_AGENT_BOT_SECRETS"),
            api_key=os.environ.get("TYPESAFE_API_KEY") or DEFAULT_API_KEY,
        )
    return SAMPLE  # something to try at once: see sandbox/scenario.py for what it holds


async def _serve(args: argparse.Namespace, scenario: dict[str, Any] | None) -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, stop.set)
    async with run_sandbox(
        args.host, args.port, scenario=scenario, webhook_url=args.webhook_url, retry_delay_s=args.retry_delay
    ) as sandbox:
        sandbox.world.chatwoot_version = args.chatwoot_version
        print(f"ready url={sandbox.url}", flush=True)
        if scenario is SAMPLE:
            print(
                "sample scenario: account 1 (user token user-1, bot 5 with token bot-5 and secret secret-5, "
                "inbox 7 linked to it), account 2; state at /_sandbox/state",
                flush=True,
            )
        await stop.wait()


def run(args: argparse.Namespace) -> int:
    try:
        scenario = _scenario(args)
    except (ConfigError, OSError, yaml.YAMLError) as exc:
        print(str(exc), file=sys.stderr)
        return EXIT_INVALID_CONFIG
    asyncio.run(_serve(args, scenario))
    return 0
