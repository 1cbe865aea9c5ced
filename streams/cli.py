"""The `chatwoot-router` command: one subcommand per process of DESIGN §3.

Each subcommand lives in its own module and is imported only when it runs, so `--help` stays fast and a
missing optional piece never breaks the others.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

from schemas.config import ConfigError

EXIT_INVALID_CONFIG = 2
EXIT_REFUSED = 1  # the cluster refused this principal a right the command needs (handlers/kafka/authorization.py)

# name -> (module that defines `add_arguments(parser)` and `run(args) -> int`, one-line help)
# Only commands that exist are listed here.
SUBCOMMANDS: dict[str, tuple[str, str]] = {
    "kafka": ("streams.kafka.command", "run a local Apache Kafka (KRaft), one node or three, for development, tests"),
    "config": ("streams.config_cmd", "validate configuration and secrets (`config check`)"),
    "sandbox": ("streams.sandbox_cmd", "serve a simulated Chatwoot and System One (with fault injection)"),
    "demo": ("streams.demo_cmd", "run the whole router on this machine with sample conversations, then report"),
    "ingress": ("streams.ingress_cmd", "serve the Chatwoot agent-bot webhook door (writes to Kafka)"),
    "worker": ("streams.worker_cmd", "run the Faust worker: routing folds, effects, sweeps, durable timers"),
    "audit": ("streams.audit_cmd", "replay the event log: a conversation's timeline, or --verify the live tables"),
    "replay": ("streams.replay_cmd", "re-publish dead-lettered records to their source topic (`replay dlq`)"),
    "sweep": ("streams.sweep_cmd", "request a sweep pass now (durable in Kafka before exit 0)"),
    "console": ("streams.console_cmd", "serve the read-only operator console (overview, conversation timelines)"),
    "whatif": ("streams.whatif_cmd", "re-decide recorded turns under a candidate configuration (no side effects)"),
    "topics": ("streams.topics_cmd", "list the app's topics with their settings and what is wrong (`--fix` corrects)"),
    "forget": ("streams.admin.forget_cmd", "erase a conversation or a contact's conversations (crypto-shredding)"),
    "acls": ("streams.admin.acls_cmd", "print the ACLs each role needs as kafka-acls lines (`--apply` creates them)"),
    "kafka-secrets": ("streams.kafka.secrets_cmd", "write a secured Kafka's CA, certificates and role properties"),
}
NO_KAFKA_CLIENT = {"kafka", "kafka-secrets", "sandbox"}  # local brokers, their files, the simulated Chatwoot
KEEP_TRYING = {"ingress", "worker"}  # refused by the cluster, they say so and keep trying (/healthz 503 with why)


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    """The whole command line; with `only`, the arguments of that subcommand alone are loaded (a command's start
    does not pay for importing every other one: `audit --conversation` answers in about a second)."""
    parser = argparse.ArgumentParser(
        prog="chatwoot-router",
        description="Routing brain for a Chatwoot help desk, on Apache Kafka.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name, (module_name, help_text) in SUBCOMMANDS.items():
        command = sub.add_parser(name, help=help_text, description=help_text)
        command.set_defaults(_module=module_name)
        if only is None or name == only:
            importlib.import_module(module_name).add_arguments(command)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    given = list(sys.argv[1:] if argv is None else argv)
    chosen = next((a for a in given if not a.startswith("-")), None)
    args = build_parser(chosen if chosen in SUBCOMMANDS else None).parse_args(given)
    module = importlib.import_module(args._module)
    from handlers.kafka.rebootstrap import InternalsChanged, install

    try:
        install()  # every Kafka client of the command goes back to the bootstrap servers when no known broker answers
    except InternalsChanged as exc:  # refuse to run on an aiokafka the patch was not written for: one line
        print(f"chatwoot-router: {exc}", file=sys.stderr, flush=True)
        return EXIT_INVALID_CONFIG
    try:
        refused = check_kafka_security(args)
        if refused is not None:
            return refused
        code: int = module.run(args)
    except ConfigError as exc:  # any command: an invalid configuration or environment is one line and exit 2
        print(str(exc), file=sys.stderr, flush=True)
        return EXIT_INVALID_CONFIG
    except Exception as exc:  # a right the cluster's authorizer refused: one line naming it, never a traceback
        from handlers.kafka.authorization import refusal_reason

        line = refusal_reason(exc)
        if line is None:
            raise
        print(f"chatwoot-router {args.command}: {line}", file=sys.stderr, flush=True)
        return EXIT_REFUSED
    return code


def check_kafka_security(args: argparse.Namespace) -> int | None:
    """Every command that talks to Kafka checks its client security first (handlers/kafka/security.py): a bad
    setting raises ConfigError (exit 2); with TLS or SASL, a broker that refuses the login or the certificate is
    one line, and exit 2 for a command that would otherwise wait for it."""
    if args.command in NO_KAFKA_CLIENT or (args.command == "acls" and not args.apply):
        return None
    from handlers.kafka.security import check_at_start, settings

    keeps_trying = args.command in KEEP_TRYING
    plaintext = settings().protocol == "PLAINTEXT"
    if (plaintext and keeps_trying) or (args.command == "config" and args.action != "apply"):
        return None  # a plaintext ingress or worker says "waiting for kafka" and keeps trying
    from schemas.config import read_env

    failure = check_at_start(read_env().bootstrap)
    if failure is None:
        return None
    print(
        f"chatwoot-router {args.command}: {failure}{'; retrying' if keeps_trying else ''}", file=sys.stderr, flush=True
    )
    return None if keeps_trying else EXIT_INVALID_CONFIG


if __name__ == "__main__":
    sys.exit(main())
