"""Create ACLs through the Admin API (CreateAcls), as an administrator, and wait until every broker enforces them.

aiokafka 0.14's admin client has no `create_acls`, and the Kafka jars the local nodes run carry no `kafka-acls`
tool, so the requests are built from aiokafka's protocol classes (`CreateAclsRequest`, `DescribeAclsRequest`,
version 1: the first with PREFIXED patterns) and sent with its plain client. Creating an ACL that exists is a
no-op, so this runs at every start. A created ACL reaches each broker through the metadata log a moment later;
`wait_enforced` asks each broker (DescribeAcls answers from the broker's own authorizer) until all list them, so
nothing that starts after the ready line finds a right missing.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Iterable, Mapping
from typing import Any

from aiokafka.client import AIOKafkaClient
from aiokafka.protocol.admin import CreateAclsRequest, DescribeAclsRequest

from projections.acls import Acl, Operation, Pattern, Resource

# the wire codes of org.apache.kafka.common.{resource.ResourceType, resource.PatternType, acl.AclOperation,
# acl.AclPermissionType}
RESOURCE_CODES = {Resource.TOPIC: 2, Resource.GROUP: 3, Resource.CLUSTER: 4}
PATTERN_CODES = {Pattern.LITERAL: 3, Pattern.PREFIXED: 4}
OPERATION_CODES = {
    Operation.ALL: 2,
    Operation.READ: 3,
    Operation.WRITE: 4,
    Operation.CREATE: 5,
    Operation.ALTER: 7,
    Operation.DESCRIBE: 8,
    Operation.DESCRIBE_CONFIGS: 10,
    Operation.ALTER_CONFIGS: 11,
    Operation.IDEMPOTENT_WRITE: 12,
}
ANY = 1
ALLOW = 3
ANY_HOST = "*"
RETRY_S = 0.2


class AclError(RuntimeError):
    """An ACL could not be created or did not reach every broker in time."""


def _wire(acl: Acl) -> tuple[int, str, int, int]:
    return RESOURCE_CODES[acl.resource], acl.name, PATTERN_CODES[acl.pattern], OPERATION_CODES[acl.operation]


async def create(client: AIOKafkaClient, acls: Iterable[Acl]) -> None:
    """Send one CreateAcls per ACL (aiokafka's request carries one) to any broker; raise on the first refusal."""
    for acl in acls:
        resource, name, pattern, operation = _wire(acl)
        request = CreateAclsRequest(resource, name, pattern, acl.principal, ANY_HOST, operation, ALLOW)
        response = await client.send(client.get_random_node(), request)
        for error_code, error_message in response.creation_responses:
            if error_code:
                raise AclError(f"creating {_describe(acl)} failed: error {error_code} ({error_message})")


async def enforced(client: AIOKafkaClient, node_id: int) -> set[tuple[str, int, str, int, int]]:
    """Every ALLOW binding broker `node_id` holds, as (principal, resource, name, pattern, operation) codes."""
    request = DescribeAclsRequest(ANY, None, ANY, None, None, ANY, ANY)  # a null name, principal, host: any
    response = await client.send(node_id, request)
    if response.error_code:
        raise AclError(f"listing the ACLs of broker {node_id} failed: {response.error_message}")
    return {
        (principal, resource, name, pattern, operation)
        for resource, name, pattern, bindings in response.resources
        for principal, _host, operation, permission in bindings
        if permission == ALLOW
    }


async def grant(bootstrap: str, client_options: Mapping[str, Any], acls: list[Acl], timeout: float = 60.0) -> None:
    """Create `acls` as the principal of `client_options` (an administrator), then wait until every broker of the
    cluster enforces them."""
    client = AIOKafkaClient(bootstrap_servers=bootstrap, request_timeout_ms=10_000, **client_options)
    deadline = time.monotonic() + timeout
    try:
        async with asyncio.timeout(timeout):
            await client.bootstrap()
        async with asyncio.timeout(max(1.0, deadline - time.monotonic())):
            await create(client, acls)
        wanted = {(acl.principal, *_wire(acl)) for acl in acls}
        for broker in sorted(client.cluster.brokers(), key=lambda b: b.nodeId):
            while True:
                missing = wanted - await enforced(client, broker.nodeId)
                if not missing:
                    break
                if time.monotonic() > deadline:
                    raise AclError(f"broker {broker.nodeId} still lacks {len(missing)} ACL(s) after {timeout:.0f} s")
                await asyncio.sleep(RETRY_S)  # the metadata log reaches the broker soon; bounded by the deadline
    finally:
        with contextlib.suppress(Exception):
            await client.close()


def _describe(acl: Acl) -> str:
    return f"{acl.operation.value} on {acl.resource.value} {acl.name!r} ({acl.pattern.value}) for {acl.principal}"
