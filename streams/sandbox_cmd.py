"""`chatwoot-router sandbox`: serve the simulated Chatwoot and System One until interrupted.

Seeded from `--scenario` (a scenario file) or derived from `--config` (the router's configuration, with the
tokens and secrets from the same environment variables the router reads, so both sides agree). Prints one line
`ready url=http://HOST:PORT` once it accepts requests.

By default the sandbox is kind: no rate limit, one conversation's webhooks in order, no extra events. The flags
below switch on a real Chatwoot's rough edges one by one, `--realistic` all of them at their realistic values
(sandbox/realism.py); a single flag given with `--realistic` overrides its value (`--realistic --rate-limit 20`,
`--realistic --no-concurrent-webhooks`). Each is also a field of `POST /_sandbox/settings`, and of a scenario's
`settings`; the flags given on the command line win over the scenario's.
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
from sandbox.realism import KIND, REALISTIC, Realism
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
        help=f"the Chatwoot release to imitate on GET /api and in its behaviour (default {NEWEST_CHATWOOT})",
    )
    realism = parser.add_argument_group("a real Chatwoot's rough edges (default: off; --realistic: all on)")
    realism.add_argument(
        "--realistic",
        action="store_true",
        help="every rough edge below at its realistic value (each flag given beside it overrides its own)",
    )
    realism.add_argument(
        "--rate-limit",
        type=int,
        metavar="N",
        help=f"Rack::Attack: N requests a minute per client IP, then 429 'Retry later' without Retry-After "
        f"(0 = none; realistic {REALISTIC['rate_limit']}, Chatwoot's RACK_ATTACK_LIMIT default)",
    )
    realism.add_argument(
        "--concurrent-webhooks",
        action=argparse.BooleanOptionalAction,
        help="post every webhook as its own Sidekiq job, in parallel with its conversation's others (realistic: on)",
    )
    realism.add_argument(
        "--webhook-jitter-ms",
        type=float,
        metavar="MS",
        help=f"start each webhook job after a random delay up to MS, so they arrive reordered "
        f"(realistic {REALISTIC['webhook_jitter_ms']:g})",
    )
    realism.add_argument(
        "--webhook-duplicates",
        type=float,
        metavar="P",
        help=f"probability that a webhook job runs twice, same payload and X-Chatwoot-Delivery, as after a "
        f"Sidekiq crash (realistic {REALISTIC['webhook_duplicates']:g})",
    )
    realism.add_argument(
        "--waiting-since-updates",
        action=argparse.BooleanOptionalAction,
        help="a bot's public reply clears waiting_since and sends conversation_updated (realistic: on)",
    )
    realism.add_argument("--seed", type=int, help="seed for the jitter and duplicate draws (a repeatable run)")


def given_settings(args: argparse.Namespace) -> dict[str, Any]:
    """The settings (as `POST /_sandbox/settings` takes them) of the flags given on the command line."""
    settings: dict[str, Any] = {"realistic": True} if args.realistic else {}
    for name in (*KIND, "seed", "chatwoot_version"):
        if getattr(args, name, None) is not None:
            settings[name] = getattr(args, name)
    return settings


def realism_of(args: argparse.Namespace) -> Realism:
    """The rough edges the flags ask for: `--realistic`'s values (or none), then each flag given."""
    realism = Realism()
    realism.update(given_settings(args))
    return realism


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


async def _serve(args: argparse.Namespace, scenario: dict[str, Any] | None, realism: Realism) -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, stop.set)
    async with run_sandbox(
        args.host,
        args.port,
        scenario=scenario,
        webhook_url=args.webhook_url,
        retry_delay_s=args.retry_delay,
        realism=realism,
    ) as sandbox:
        sandbox.configure(given_settings(args))  # over the scenario's `settings`, if it has any
        print(f"ready url={sandbox.url}", flush=True)
        if sandbox.realism.switches() != KIND:
            edges = " ".join(f"{name}={value}" for name, value in sandbox.realism.switches().items())
            print(f"rough edges on: {edges} (GET /_sandbox/stats counts them)", flush=True)
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
        realism = realism_of(args)
    except (ConfigError, OSError, yaml.YAMLError, ValueError) as exc:
        print(str(exc), file=sys.stderr)
        return EXIT_INVALID_CONFIG
    asyncio.run(_serve(args, scenario, realism))
    return 0
