"""Least privilege for the router's processes: what each role may do to which of an app's resources.

An app's resources are its topics, named `<app>.<kind>` (`projections.topic_settings`) and `<app>-<table>-changelog`
(Faust's tables, and Faust's own `<app>-__assignor-__leader`), and its consumer group, named `<app>` (Faust's group
id is the app id; `replay state` commits there too). Every grant is ALLOW from any host; nothing is denied, so a
right not granted here is refused (`allow.everyone.if.no.acl.found=false`). PREFIXED patterns cover the topics an
app adds later. Note that the prefix `<app>-` also matches the topics of an app whose id starts with `<app>-`: give
apps on one cluster ids that are not such prefixes of each other.

- ingress: writes `<app>.conversations` (idempotent producer) and reads that topic's `min.insync.replicas`
  (DescribeConfigs) for its health; nothing else, so it can neither read the log nor touch another topic.
- worker: reads and writes every topic of the app, reads their settings (the topics check at start), joins and
  commits in the app's group; no Create: topics are made ahead by an administrator (`config apply`, `topics --fix`).
- reader (console, audit, whatif): reads and describes every topic of the app, and describes the group (the console
  shows the workers' lag from its committed offsets); it cannot write, nor join the group (that needs Read on it).
- replay (`replay state --to-app TARGET`): reads and describes the source app's topics, and may do anything (All)
  on the target app's topics (`TARGET.`, `TARGET-`) and its group, which it creates and fills; an idempotent
  producer. Nothing on the source is written, nor its group touched.
- privacy (`forget`): writes `ForgetRequested` to `<app>.conversations` (idempotent producer) and reads that topic
  back for the proofs; reads `<app>.keys` (which conversations a contact has) and its `max.compaction.lag.ms` (the
  deadline it promises). It can read no other topic, open nothing (no KEK), nor touch the group.
- admin (`config apply`, `topics --fix`, `acls --apply`) on a cluster where it is no super user: creates and alters
  the app's topics and their settings, writes `configs`, and alters the cluster's ACLs (Alter on the cluster, which
  is as much as a super user: give it to an administrator only).

The Kafka APIs behind each right are in docs/operations.md "Securing the router".
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum

from projections.topic_settings import Kind

CLUSTER_NAME = "kafka-cluster"  # the one name of the CLUSTER resource


class Role(StrEnum):
    """Who a process runs as; also the SCRAM user names of the secured local Kafka."""

    ADMIN = "admin"
    INGRESS = "ingress"
    WORKER = "worker"
    READER = "reader"
    REPLAY = "replay"
    PRIVACY = "privacy"


SERVICE_ROLES = (Role.ADMIN, Role.INGRESS, Role.WORKER, Role.READER, Role.PRIVACY)
"""The roles of the running router's processes and of `forget`, a help desk's routine (the secured local Kafka makes
a user for each); `replay` is an operator's occasional task and needs a target app id."""


class Resource(StrEnum):
    TOPIC = "topic"
    GROUP = "group"
    CLUSTER = "cluster"


class Pattern(StrEnum):
    LITERAL = "literal"
    PREFIXED = "prefixed"


class Operation(StrEnum):
    """Kafka's ACL operations the roles use, spelled as `kafka-acls --operation` takes them."""

    ALL = "All"
    READ = "Read"
    WRITE = "Write"
    CREATE = "Create"
    ALTER = "Alter"
    DESCRIBE = "Describe"
    DESCRIBE_CONFIGS = "DescribeConfigs"
    ALTER_CONFIGS = "AlterConfigs"
    IDEMPOTENT_WRITE = "IdempotentWrite"


@dataclass(frozen=True)
class Grant:
    """One row of a role's table: these operations on the resources the pattern names."""

    resource: Resource
    name: str
    pattern: Pattern
    operations: tuple[Operation, ...]


@dataclass(frozen=True, order=True)
class Acl:
    """One ACL binding: ALLOW `operation` on the resource to `principal` from any host."""

    principal: str
    resource: Resource
    name: str
    pattern: Pattern
    operation: Operation


def _topics(app_id: str, *operations: Operation) -> list[Grant]:
    """The app's topics: `<app>.` (its own) and `<app>-` (Faust's changelogs and leader topic)."""
    return [Grant(Resource.TOPIC, f"{app_id}{sep}", Pattern.PREFIXED, operations) for sep in (".", "-")]


def _cluster(*operations: Operation) -> Grant:
    return Grant(Resource.CLUSTER, CLUSTER_NAME, Pattern.LITERAL, operations)


def grants(role: Role, app_id: str, target: str | None = None) -> list[Grant]:
    """The table of `role` for the app `app_id`; `target` is the app id `replay state --to-app` builds (needed
    by, and only by, the replay role)."""
    op = Operation
    if (role is Role.REPLAY) != (target is not None):
        raise ValueError("the replay role, and only it, needs the target app id (replay state --to-app)")
    if role is Role.REPLAY:
        assert target is not None
        return [
            *_topics(app_id, op.READ, op.DESCRIBE, op.DESCRIBE_CONFIGS),
            *_topics(target, op.ALL),
            Grant(Resource.GROUP, target, Pattern.LITERAL, (op.ALL,)),
            _cluster(op.IDEMPOTENT_WRITE),
        ]
    if role is Role.INGRESS:
        return [
            Grant(
                Resource.TOPIC,
                f"{app_id}.conversations",
                Pattern.LITERAL,
                (op.WRITE, op.DESCRIBE, op.DESCRIBE_CONFIGS),
            ),
            _cluster(op.IDEMPOTENT_WRITE),
        ]
    if role is Role.WORKER:
        return [
            *_topics(app_id, op.READ, op.WRITE, op.DESCRIBE, op.DESCRIBE_CONFIGS),
            Grant(Resource.GROUP, app_id, Pattern.LITERAL, (op.READ,)),
            _cluster(op.IDEMPOTENT_WRITE),
        ]
    if role is Role.PRIVACY:
        return [
            Grant(
                Resource.TOPIC,
                f"{app_id}.{Kind.CONVERSATIONS.value}",
                Pattern.LITERAL,
                (op.READ, op.WRITE, op.DESCRIBE),
            ),
            Grant(
                Resource.TOPIC,
                f"{app_id}.{Kind.KEYS.value}",
                Pattern.LITERAL,
                (op.READ, op.DESCRIBE, op.DESCRIBE_CONFIGS),
            ),
            _cluster(op.IDEMPOTENT_WRITE),
        ]
    if role is Role.READER:
        return [
            *_topics(app_id, op.READ, op.DESCRIBE),
            Grant(Resource.GROUP, app_id, Pattern.LITERAL, (op.DESCRIBE,)),
        ]
    return [
        *_topics(
            app_id,
            op.CREATE,
            op.READ,
            op.WRITE,
            op.DESCRIBE,
            op.DESCRIBE_CONFIGS,
            op.ALTER,
            op.ALTER_CONFIGS,
        ),
        _cluster(op.DESCRIBE, op.ALTER, op.IDEMPOTENT_WRITE),
    ]


def check_principal(principal: str) -> str:
    """`Type:name` as Kafka writes principals (`User:ingress`); a ValueError names what is wrong."""
    kind, colon, name = principal.partition(":")
    if not colon or not kind or not name or any(c.isspace() or not c.isprintable() for c in principal):
        raise ValueError("a principal is Type:name without spaces, such as User:ingress")
    return principal


def acls_for(app_id: str, principals: Mapping[Role, str], *, replay_target: str | None = None) -> list[Acl]:
    """Every ACL the given roles' principals need for `app_id`, one per operation, in a stable order;
    `replay_target` is the target app id of the replay role (a ValueError when that role is given without it)."""
    found = {
        Acl(check_principal(principal), grant.resource, grant.name, grant.pattern, operation)
        for role, principal in principals.items()
        for grant in grants(role, app_id, replay_target if role is Role.REPLAY else None)
        for operation in grant.operations
    }
    return sorted(found)
