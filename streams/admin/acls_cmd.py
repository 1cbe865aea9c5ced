"""`chatwoot-router acls [--ingress P] [--worker P] [--reader P] [--privacy P] [--admin P]
[--replay P --to-app TARGET] [--apply]`: the ACLs each role of the app in force (ROUTER_APP_ID) needs, as
`kafka-acls` command lines (issue 31 item 2).

The table is `projections.acls` (docs/operations.md "Securing the router" explains each right). A principal is
`Type:name` (`User:worker`); a role whose option is not given is skipped, and a comment line says so, so the
output is a shell script that grants exactly the roles named (one principal may hold several roles). Patterns are
PREFIXED (`<app>.` and `<app>-`) for the topics, LITERAL for the group (`<app>`) and the cluster.

`--apply` creates them through the Admin API (CreateAcls, `handlers.kafka.acl_admin`) with this process's client
settings (KAFKA_CLIENT_PROPERTIES: an administrator's, with Alter on the cluster or a super user) and waits until
every broker enforces them; creating an ACL that exists changes nothing, so it may run again. Exit status: 0 done,
1 when Kafka refused or could not be reached (one line), 2 on invalid options or environment.
"""

from __future__ import annotations

import argparse
import asyncio
import sys

from aiokafka.errors import KafkaError

from projections.acls import Role, acls_for, kafka_acls_commands
from schemas.config import _APP_ID as APP_ID
from streams.config_cmd import env_or_exit

EXIT_FAILED = 1
EXIT_INVALID = 2
ROLE_OPTIONS = (Role.INGRESS, Role.WORKER, Role.READER, Role.PRIVACY, Role.ADMIN, Role.REPLAY)
HELP = {
    Role.INGRESS: "the ingress: writes <app>.conversations",
    Role.WORKER: "the workers: their topics and group, no Create",
    Role.READER: "console, audit, whatif: read and describe only",
    Role.PRIVACY: "forget: writes and reads <app>.conversations, reads <app>.keys",
    Role.ADMIN: "config apply, topics --fix, acls --apply (if not a super user)",
    Role.REPLAY: "replay state --to-app TARGET: reads this app, owns TARGET (needs --to-app)",
}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    for role in ROLE_OPTIONS:
        parser.add_argument(f"--{role.value}", metavar="PRINCIPAL", help=f"{HELP[role]} (e.g. User:{role.value})")
    parser.add_argument("--to-app", metavar="TARGET", help="the target app id of --replay")
    parser.add_argument(
        "--command-config",
        default="admin.properties",
        help="the --command-config the printed lines name (default admin.properties)",
    )
    parser.add_argument("--apply", action="store_true", help="create the ACLs now (Admin API, as an administrator)")


def principals_of(args: argparse.Namespace) -> dict[Role, str]:
    return {role: value for role in ROLE_OPTIONS if (value := getattr(args, role.value)) is not None}


def script(
    app_id: str, principals: dict[Role, str], to_app: str | None, bootstrap: str, command_config: str
) -> list[str]:
    """The lines printed: a header, a comment per role skipped, then the `kafka-acls` commands."""
    lines = [f"# ACLs of {app_id} (chatwoot-router acls): PREFIXED topic patterns {app_id}. and {app_id}-"]
    lines += [
        f"# {role.value}: skipped (no principal: --{role.value} User:NAME)"
        for role in ROLE_OPTIONS
        if role not in principals
    ]
    acls = acls_for(app_id, principals, replay_target=to_app if Role.REPLAY in principals else None)
    return [*lines, *kafka_acls_commands(acls, bootstrap=bootstrap, command_config=command_config)]


def run(args: argparse.Namespace) -> int:
    env = env_or_exit()
    principals = principals_of(args)
    if not principals:
        print(
            "chatwoot-router acls: name at least one role's principal (--ingress/--worker/--reader/--privacy/--admin"
            "/--replay User:NAME)",
            file=sys.stderr,
        )
        return EXIT_INVALID
    if args.to_app is not None and (Role.REPLAY not in principals or not APP_ID.fullmatch(args.to_app)):
        print(f"chatwoot-router acls: --to-app: an app id ({APP_ID.pattern}) for --replay", file=sys.stderr)
        return EXIT_INVALID
    if Role.REPLAY in principals and (args.to_app is None or args.to_app == env.app_id):
        print(
            "chatwoot-router acls: --replay needs --to-app TARGET, an app id other than ROUTER_APP_ID", file=sys.stderr
        )
        return EXIT_INVALID
    try:
        lines = script(env.app_id, principals, args.to_app, env.bootstrap, args.command_config)
    except ValueError as exc:  # a principal that is not Type:name
        print(f"chatwoot-router acls: {exc}", file=sys.stderr)
        return EXIT_INVALID
    for line in lines:
        print(line)
    if not args.apply:
        return 0
    return apply(env.bootstrap, env.app_id, principals, args.to_app)


def apply(bootstrap: str, app_id: str, principals: dict[Role, str], to_app: str | None) -> int:
    """Create the ACLs as this process's principal and wait until every broker enforces them."""
    from handlers.kafka.acl_admin import AclError, grant
    from handlers.kafka.security import client_options

    acls = acls_for(app_id, principals, replay_target=to_app if Role.REPLAY in principals else None)
    try:
        asyncio.run(grant(bootstrap, client_options(), acls))
    except (AclError, KafkaError, OSError, TimeoutError) as exc:
        print(f"chatwoot-router acls: kafka at {bootstrap}: {type(exc).__name__}: {exc}", file=sys.stderr)
        return EXIT_FAILED
    print(f"applied {len(acls)} ACL(s) for {app_id} at {bootstrap}", file=sys.stderr)
    return 0
