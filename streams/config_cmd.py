"""`chatwoot-router config check`: validate configuration, secrets and environment without starting anything.
`chatwoot-router config apply FILE`: make FILE the configuration in force (DESIGN §8 "Configuration is an event").

Every command that needs them loads them through `load_or_exit` / `env_or_exit`, so an invalid file or variable
is reported the same way everywhere: one line on stderr naming the key path or variable, exit status 2.
"""

from __future__ import annotations

import argparse
import sys

from schemas.config import ConfigError, RouterEnv, Settings, load_config_file, load_settings, read_env

EXIT_INVALID_CONFIG = 2


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("action", choices=["check", "apply"], help="what to do with the configuration")
    parser.add_argument("file", nargs="?", help="with apply: the configuration file to apply")
    parser.add_argument("--config", help="configuration file (JSON or YAML); default $ROUTER_CONFIG")


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
    """Store the file's configuration (no secrets) under its version and mark every partition with it."""
    import asyncio

    from aiokafka.errors import KafkaError

    from handlers.config_store import apply, read_book
    from schemas.configs import ConfigDocument, FoldSettings

    env = env_or_exit()
    try:
        config = load_config_file(path)
    except ConfigError as exc:
        raise fail(exc) from None
    document = ConfigDocument.of(config, FoldSettings(retry_base_ms=env.retry_base_ms))
    try:
        latest = asyncio.run(read_book(env.bootstrap, env.app_id)).latest
        if latest is not None and latest.version == document.version:
            print(f"configuration version {document.version} is already in force")
            return 0
        markers = asyncio.run(apply(env.bootstrap, env.app_id, document))
    except (LookupError, KafkaError, OSError) as exc:
        print(f"configuration not applied: kafka at {env.bootstrap}: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    print(f"applied configuration version {document.version}: {markers} partitions marked")
    return 0


def run(args: argparse.Namespace) -> int:
    if args.action == "apply":
        if not args.file:
            print("chatwoot-router config apply: name the configuration FILE to apply", file=sys.stderr)
            return EXIT_INVALID_CONFIG
        return apply_file(args.file)
    settings = load_or_exit(args.config)
    accounts = ", ".join(str(a) for a in settings.config.routing.accounts)
    print(f"configuration ok: routed accounts {accounts}")
    return 0
