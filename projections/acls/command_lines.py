"""The ACLs as `kafka-acls` command lines an administrator can read, review and run as they are."""

from __future__ import annotations

import shlex
from collections.abc import Iterable

from projections.acls.roles import Acl, Operation, Pattern, Resource


def kafka_acls_commands(
    acls: Iterable[Acl], *, bootstrap: str = "$KAFKA_BOOTSTRAP_SERVERS", command_config: str = "admin.properties"
) -> list[str]:
    """One `kafka-acls --add` line per principal and resource pattern, its operations together, in the ACLs'
    order. `bootstrap` and `command_config` are written as given, so a `$VARIABLE` is left for the shell."""
    grouped: dict[tuple[str, Resource, str, Pattern], list[Operation]] = {}
    for acl in acls:
        operations = grouped.setdefault((acl.principal, acl.resource, acl.name, acl.pattern), [])
        if acl.operation not in operations:
            operations.append(acl.operation)
    return [
        " ".join(
            [
                "kafka-acls",
                "--bootstrap-server",
                _word(bootstrap),
                "--command-config",
                _word(command_config),
                "--add",
                "--allow-principal",
                shlex.quote(principal),
                *(f"--operation {operation.value}" for operation in operations),
                *_resource(resource, name, pattern),
            ]
        )
        for (principal, resource, name, pattern), operations in grouped.items()
    ]


def _resource(resource: Resource, name: str, pattern: Pattern) -> list[str]:
    if resource is Resource.CLUSTER:
        return ["--cluster"]
    return [f"--{resource.value}", shlex.quote(name), "--resource-pattern-type", pattern.value]


def _word(text: str) -> str:
    """Quoted for the shell, except a lone `$VARIABLE`, which the shell is meant to expand."""
    if text.startswith("$") and text[1:].replace("_", "").isalnum():
        return f'"{text}"'
    return shlex.quote(text)
