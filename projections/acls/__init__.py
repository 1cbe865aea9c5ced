"""The ACLs each role of the router needs on a secured cluster (issue 31), as data: `roles` holds the table,
`command_lines` prints it as `kafka-acls` commands. Pure; `handlers.kafka.acl_admin` creates them;
`refusals` says which right the authorizer refused."""

from projections.acls.command_lines import kafka_acls_commands
from projections.acls.refusals import Refusal, refusal_line
from projections.acls.roles import (
    CLUSTER_NAME,
    SERVICE_ROLES,
    Acl,
    Grant,
    Operation,
    Pattern,
    Resource,
    Role,
    acls_for,
    grants,
)

__all__ = [
    "CLUSTER_NAME",
    "SERVICE_ROLES",
    "Acl",
    "Grant",
    "Operation",
    "Pattern",
    "Refusal",
    "Resource",
    "Role",
    "acls_for",
    "grants",
    "kafka_acls_commands",
    "refusal_line",
]
