"""`chatwoot-router config check`: validate configuration, secrets and environment without starting anything.

Every command that needs them loads them through `load_or_exit` / `env_or_exit`, so an invalid file or variable
is reported the same way everywhere: one line on stderr naming the key path or variable, exit status 2.
"""

from __future__ import annotations

import argparse
import sys

from schemas.config import ConfigError, RouterEnv, Settings, load_settings, read_env

EXIT_INVALID_CONFIG = 2


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("action", choices=["check"], help="what to do with the configuration")
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


def run(args: argparse.Namespace) -> int:
    settings = load_or_exit(args.config)
    accounts = ", ".join(str(a) for a in settings.config.routing.accounts)
    print(f"configuration ok: routed accounts {accounts}")
    return 0
