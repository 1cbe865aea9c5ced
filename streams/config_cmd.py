"""`chatwoot-router config check`: validate configuration and secrets without starting anything."""

from __future__ import annotations

import argparse
import sys

from schemas.config import ConfigError, Settings, load_settings

EXIT_INVALID_CONFIG = 2


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("action", choices=["check"], help="what to do with the configuration")
    parser.add_argument("--config", help="configuration file (JSON or YAML); default $ROUTER_CONFIG")


def load_or_exit(config_path: str | None) -> Settings:
    """Load settings for a process that must refuse to start on an invalid configuration (exit 2)."""
    try:
        return load_settings(config_path)
    except ConfigError as exc:
        print(str(exc), file=sys.stderr)
        raise SystemExit(EXIT_INVALID_CONFIG) from None


def run(args: argparse.Namespace) -> int:
    settings = load_or_exit(args.config)
    accounts = ", ".join(str(a) for a in settings.config.routing.accounts)
    print(f"configuration ok: routed accounts {accounts}")
    return 0
