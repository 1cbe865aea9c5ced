"""Whether the router agent has folded what was on the log when this worker took a partition (DESIGN §6).

After a crash or a partition move the new owner's two agents start side by side: the router agent folds
`conversations` from its committed offset, the effect agent reads `effects` from its own. The effect agent can
reach a mutation before the router agent has folded the webhook that shows a person took the conversation over
while the partition had no owner: the state it admits the command against is then behind the log. So the head
(end offset) of each owned `conversations` partition is taken at assignment, and a mutation of that partition
waits until the fold has passed it; only then is its run's state as new as the log the worker found.

A head that could not be looked up at assignment (a broker away) is not a reason to skip the wait: the partition
counts as behind until a later lookup (`learn_heads`) finds it, and its mutations wait at most until their fresh
read's bound runs out, then read again.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Mapping


class CatchUp:
    """The `conversations` heads seen at assignment, per partition, and waiters for the fold to pass them."""

    def __init__(self) -> None:
        self._owned: frozenset[int] | None = None  # None: never assigned (a service without a consumer, in tests)
        self._heads: dict[int, int] = {}
        self._folded: dict[int, int] = {}
        self._events: dict[int, asyncio.Event] = {}

    def assign(self, owned: frozenset[int], heads: Mapping[int, int], starts: Mapping[int, int]) -> None:
        """A rebalance ended: the `owned` partitions, their end offsets now (`heads`) and where the fold resumes
        (`starts`). An owned partition whose head is unknown is behind until `learn_heads` gives it."""
        self.revoke()
        self._owned = owned
        self._heads = dict(heads)
        self._folded = dict(starts)

    def unknown(self) -> frozenset[int]:
        """The owned partitions whose head has not been looked up yet."""
        return frozenset(p for p in (self._owned or ()) if p not in self._heads)

    def learn_heads(self, heads: Mapping[int, int]) -> None:
        """Heads looked up after the assignment (the lookup then failed); a partition no longer owned is ignored."""
        for partition, head in heads.items():
            if self._owned is not None and partition in self._owned and partition not in self._heads:
                self._heads[partition] = head
                self.advanced(partition, self._folded.get(partition, 0))

    def revoke(self) -> None:
        """Partitions move: nothing is caught up until the next assignment; every waiter wakes and gives up."""
        self._owned = frozenset()
        self._heads = {}
        self._folded = {}
        for event in self._events.values():
            event.set()
        self._events.clear()

    def advanced(self, partition: int, next_offset: int) -> None:
        """The fold applied everything before `next_offset` of `partition`."""
        if next_offset > self._folded.get(partition, -1):
            self._folded[partition] = next_offset
        if self.caught_up(partition):
            event = self._events.pop(partition, None)
            if event is not None:
                event.set()

    def caught_up(self, partition: int) -> bool:
        if self._owned is None:
            return True
        head = self._heads.get(partition)
        return partition in self._owned and head is not None and self._folded.get(partition, 0) >= head

    def behind(self, partition: int) -> int:
        """How many records of the head seen at assignment the fold has still to apply (0 when caught up or when
        the head is not known yet)."""
        head = self._heads.get(partition)
        return 0 if head is None else max(0, head - self._folded.get(partition, 0))

    async def wait(self, partition: int, timeout_s: float) -> bool:
        """Wait (at most `timeout_s`) until the fold of `partition` has passed its head; whether it has."""
        if self.caught_up(partition):
            return True
        if timeout_s <= 0:
            return False
        event = self._events.setdefault(partition, asyncio.Event())
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(timeout_s):
                await event.wait()
        return self.caught_up(partition)
