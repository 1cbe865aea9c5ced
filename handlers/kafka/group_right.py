"""Whether this process's principal may be a member of a consumer group (Read on the group), asked without joining
it and without committing anything (issue 31).

Faust's consumer cannot tell: aiokafka raises `GroupAuthorizationFailedError` inside its coordinator task when the
broker refuses JoinGroup or a heartbeat, hands it to the user only through `getmany()` (which Faust's fetcher never
calls) and waits for it to be picked up, so a worker refused its group hangs without a word, and stays so after a
grant. The worker asks this first instead, and again while it runs.

The question is an OffsetCommit for a topic that cannot exist (its name is not a legal topic name) under the app's
prefix. The broker checks Read on the group before anything else and answers every partition of a refused
request with GROUP_AUTHORIZATION_FAILED; a granted one gets TOPIC_AUTHORIZATION_FAILED or UNKNOWN_TOPIC_OR_PARTITION
for the topic and, with no partition left to commit, is answered without the group coordinator being asked
(Kafka's `KafkaApis.handleOffsetCommitRequest`): no offset is written, no member joins, no rebalance starts, and
any broker can answer. An OffsetFetch or a DescribeGroups would not do: they need only Describe on the group,
which a reader holds. Only the refused group is news here; any other answer counts as granted, and a broker that
does not answer raises as any Kafka request does.
"""

from __future__ import annotations

from aiokafka.client import AIOKafkaClient
from aiokafka.errors import GroupAuthorizationFailedError
from aiokafka.protocol.commit import OffsetCommitRequest

from handlers.kafka.probe_client import ProbeClient

PROBE_TOPIC = "group right probe"
"""Appended to the app's topic prefix (`<app>.`, which every role that may join holds Read on, so a granted probe
is not an authorizer denial in the brokers' logs); spaces are not legal in a topic name, so it never exists."""
GROUP_AUTHORIZATION_FAILED = 30
REQUEST_TIMEOUT_MS = 5000


def probe_topic(topic_prefix: str) -> str:
    """The topic the probe commits to: `<prefix>group right probe`, e.g. `chatwoot-router.group right probe`."""
    return f"{topic_prefix}{PROBE_TOPIC}"


async def refused(client: AIOKafkaClient, group: str, topic: str) -> bool:
    """Whether the broker refuses this client's principal Read on `group` (see the module's docstring)."""
    request = OffsetCommitRequest(group, -1, "", OffsetCommitRequest.DEFAULT_RETENTION_TIME, [(topic, [(0, 0, "")])])
    response = await client.send(client.get_random_node(), request)
    return any(code == GROUP_AUTHORIZATION_FAILED for _, partitions in response.topics for _, code in partitions)


class GroupRight:
    """Asks the question above for one group, on a client of its own kept between questions (a running worker asks
    every few seconds)."""

    def __init__(self, bootstrap: str, group: str, topic: str) -> None:
        self.bootstrap = bootstrap
        self.group = group
        self.topic = topic
        self._client = ProbeClient(bootstrap, request_timeout_ms=REQUEST_TIMEOUT_MS)

    async def check(self) -> None:
        """Return when the group is granted; raise `GroupAuthorizationFailedError(group)` when it is refused (what
        aiokafka raises for a refused JoinGroup: `handlers.kafka.authorization` names it in one line)."""
        client = await self._client()
        if await refused(client, self.group, self.topic):
            raise GroupAuthorizationFailedError(self.group)

    async def close(self) -> None:
        await self._client.close()


async def check_once(bootstrap: str, group: str, topic: str) -> None:
    """`GroupRight.check` on a client made and closed for this one question (a worker about to start)."""
    right = GroupRight(bootstrap, group, topic)
    try:
        await right.check()
    finally:
        await right.close()
