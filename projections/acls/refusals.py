"""What a process refused by the cluster's authorizer says: which right, on which resource, for which principal,
in one line (issue 31). Pure; `handlers.kafka.authorization` finds the refusal in an aiokafka or Faust error."""

from __future__ import annotations

from dataclasses import dataclass

from projections.acls.roles import CLUSTER_NAME, Operation, Resource


@dataclass(frozen=True)
class Refusal:
    """The authorizer refused `operation` on the resource to `principal`."""

    principal: str
    operation: Operation
    resource: Resource
    name: str = CLUSTER_NAME


ADVICE = {
    Operation.CREATE: "an administrator creates the app's topics ahead (`config apply`)",
}
DEFAULT_ADVICE = "an administrator grants the role's ACLs (`chatwoot-router acls --apply`)"


def refusal_line(refusal: Refusal) -> str:
    """`kafka refused User:worker the right Create on topic 'x': …` (no password is ever part of a Refusal)."""
    where = "the cluster" if refusal.resource is Resource.CLUSTER else f"{refusal.resource.value} {refusal.name!r}"
    advice = ADVICE.get(refusal.operation, DEFAULT_ADVICE)
    return f"kafka refused {refusal.principal} the right {refusal.operation.value} on {where}: {advice}"
