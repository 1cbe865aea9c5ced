"""`chatwoot-router config check`: validate configuration, secrets and environment without starting anything.
`chatwoot-router config apply FILE`: make FILE the configuration in force (DESIGN §8 "Configuration is an event").

Every command that needs them loads them through `load_or_exit` / `env_or_exit`, so an invalid file or variable
is reported the same way everywhere: one line on stderr naming the key path or variable, exit status 2.
"""

from __future__ import annotations

import argparse
import sys

from projections.acls import Operation
from schemas.config import ConfigError, RouterEnv, Settings, load_config_file, load_settings, read_env

EXIT_INVALID_CONFIG = 2


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("action", choices=["check", "apply"], help="what to do with the configuration")
    parser.add_argument("file", nargs="?", help="with apply: the configuration file to apply")
    parser.add_argument("--config", help="configuration file (JSON or YAML); default $ROUTER_CONFIG")
    parser.add_argument(
        "--offline",
        action="store_true",
        help="with check: do not ask Chatwoot for its version (GET /api), e.g. when validating in a pipeline",
    )


def fail(exc: ConfigError) -> SystemExit:
    """Print the error as one line on stderr; the caller raises the returned SystemExit(2)."""
    print(str(exc), file=sys.stderr, flush=True)
    return SystemExit(EXIT_INVALID_CONFIG)


def env_or_exit() -> RouterEnv:
    """The validated environment, or exit 2 with one line naming the variable."""
    try:
        return read_env()
    except ConfigError as exc:
        raise fail(exc) from None


def load_or_exit(config_path: str | None, env: RouterEnv | None = None) -> Settings:
    """Load settings for a process that must refuse to start on an invalid configuration or environment (exit 2)."""
    try:
        return load_settings(config_path, env if env is not None else read_env())
    except ConfigError as exc:
        raise fail(exc) from None


def apply_file(path: str) -> int:
    """Store the file's configuration (no secrets) under its version and mark every partition with it.

    Works as the operator's first step on an empty cluster: the app's topics are created first, with
    ROUTER_PARTITIONS and the settings a worker would give them; transient broker states are waited out.
    """
    import asyncio

    from aiokafka.errors import KafkaError

    from handlers.kafka.config_store import apply, read_book
    from handlers.kafka.retry import KafkaUnusable, print_waiting, retrying
    from handlers.kafka.topics import ensure_app_topics
    from schemas.configs import ConfigDocument, FoldSettings

    env = env_or_exit()
    try:
        config = load_config_file(path)
    except ConfigError as exc:
        raise fail(exc) from None
    document = ConfigDocument.of(config, FoldSettings(retry_base_ms=env.retry_base_ms))

    async def apply_once() -> int | None:
        """The markers written, or None when the version is in force; safe to repeat (the same version twice)."""
        # the operator's first step may come before any worker: create the app's topics as a worker would
        await ensure_app_topics(env.bootstrap, env.app_id, env.partitions, log_retention_ms=env.log_retention_ms)
        latest = (await read_book(env.bootstrap, env.app_id)).latest
        if latest is not None and latest.version == document.version:
            return None
        return await apply(env.bootstrap, env.app_id, document)

    try:
        waiting = print_waiting("config apply", env.bootstrap)
        markers = asyncio.run(retrying(apply_once, bootstrap=env.bootstrap, on_wait=waiting))
    except KafkaUnusable as exc:
        print(f"configuration not applied: {exc}", file=sys.stderr)
        return 1
    except (LookupError, KafkaError, OSError) as exc:
        from handlers.kafka.authorization import refusal_reason

        refused = refusal_reason(exc, topic_operation=Operation.WRITE)  # which right, for whom, in one line
        detail = refused or f"{type(exc).__name__}: {exc}"
        print(f"configuration not applied: kafka at {env.bootstrap}: {detail}", file=sys.stderr)
        return 1
    if markers is None:
        print(f"configuration version {document.version} is already in force")
        return 0
    print(f"applied configuration version {document.version}: {markers} partitions marked")
    return 0


def run(args: argparse.Namespace) -> int:
    if args.action == "apply":
        if not args.file:
            print("chatwoot-router config apply: name the configuration FILE to apply", file=sys.stderr)
            return EXIT_INVALID_CONFIG
        return apply_file(args.file)
    env = env_or_exit()
    settings = load_or_exit(args.config, env)
    accounts = ", ".join(str(a) for a in settings.config.routing.accounts)
    print(f"configuration ok: routed accounts {accounts}")
    if args.offline:
        return 0
    return check_chatwoot_version(settings.config.chatwoot.base_url, env.chatwoot_version)


def check_chatwoot_version(base_url: str, stated: str | None) -> int:
    """Ask Chatwoot for its version as a worker does (or take ROUTER_CHATWOOT_VERSION): exit 1 when a worker would
    route nothing for it (too old); a Chatwoot that cannot be asked is a warning only (exit 0): the check may run
    where Chatwoot is not reachable, and the worker waits for an answer anyway."""
    import asyncio

    from handlers.clients.chatwoot import ChatwootClient, ChatwootError
    from projections.chatwoot_version import version_problem

    async def ask() -> str:
        async with ChatwootClient(base_url, "", {}, timeout_s=10) as client:
            return await client.server_version()

    if stated is not None:
        version, source = stated, "ROUTER_CHATWOOT_VERSION"
    else:
        try:
            version, source = asyncio.run(ask()), "GET /api"
        except ChatwootError as exc:
            print(
                f"warning: Chatwoot at {base_url} could not be asked for its version ({exc}); a worker routes nothing "
                "until it answers (or set ROUTER_CHATWOOT_VERSION when a proxy hides GET /api)",
                file=sys.stderr,
            )
            return 0
    problem = version_problem(version)
    if problem is not None:
        print(f"Chatwoot at {base_url}: {problem} ({source}); a worker routes nothing for it", file=sys.stderr)
        return 1
    print(f"chatwoot ok: {base_url} version {version} ({source})")
    return 0
