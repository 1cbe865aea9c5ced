"""What the router did with one conversation, as that conversation's own records on the log say.

End-to-end tests share one running stack, so a process-wide signal (a Prometheus counter, "the sandbox settled")
can be satisfied by another conversation, a sweep or a restarted worker's own folds. A test waits on its own
subject instead: the records of its conversation on `<app>.conversations` (read from its partition only, the
way `audit --conversation` reads them), replayed through the same fold, and the workers' committed offset on that
partition. A conversation is *settled* when the workers have committed past its last record (so they folded
everything the log holds for it) and the replay of those records leaves no run and no job: nothing is in flight
and nothing is due, so an absence checked then is an absence, not "not yet".
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from typing import Any

import pytest
from aiokafka import TopicPartition
from aiokafka.admin import AIOKafkaAdminClient

from handlers.kafka.config_store import read_book
from handlers.logs.audit import conversation_partition, read_conversation
from projections.logs.audit import ConversationTrail, LogReplay
from schemas.codec import decode_conversation_event
from schemas.config import RouterConfig
from schemas.records import ChainedOutcomes, EffectOutcome, TimerFired, TurnOutcome


@dataclass
class Seen:
    """One conversation's records, replayed, and how far the workers' group has committed on its partition."""

    key: str
    partition: int
    trail: ConversationTrail
    offsets: list[int] = field(default_factory=list)
    """The offset of each of the conversation's records, in order."""
    outcomes_at: list[tuple[int, TurnOutcome]] = field(default_factory=list)
    """Each turn outcome with the offset of the record whose fold produced it."""
    effects: list[tuple[int, EffectOutcome]] = field(default_factory=list)
    """Each effect outcome on the log (chained ones one by one) with its record's offset."""
    timers: list[TimerFired] = field(default_factory=list)
    """The conversation's `TimerFired` records."""
    committed: int = -1

    @property
    def last_offset(self) -> int:
        return self.offsets[-1] if self.offsets else -1

    @property
    def consumed(self) -> bool:
        """The workers have folded (and committed) every record the log holds for this conversation."""
        return bool(self.offsets) and self.committed > self.last_offset

    @property
    def idle(self) -> bool:
        """No run is waiting for an outcome and no job is due later."""
        return self.trail.state.run is None and self.trail.state.job is None

    @property
    def settled(self) -> bool:
        return self.consumed and self.idle

    def outcomes_since(self, offset: int) -> list[TurnOutcome]:
        """Turn outcomes folded from records after `offset`."""
        return [o for at, o in self.outcomes_at if at > offset]

    def describe(self) -> str:
        """What a failed wait prints: how far the log and the workers are, and what the replay left."""
        state = self.trail.state
        run = f"run {state.run.number} at {state.run.phase}" if state.run else "no run"
        pending = f", awaiting {state.run.pending.params.op}" if state.run and state.run.pending else ""
        outcomes = [f"{o.result}({o.reason})" for o in self.trail.outcomes]
        return (
            f"records at {self.offsets[-5:]}, committed {self.committed}, {run}{pending}, "
            f"job {'due ' + str(state.job.not_before) if state.job else 'none'}, outcomes {outcomes}"
        )

    def failed(self, op: str) -> list[EffectOutcome]:
        """Effect outcomes of `op` that recorded an error."""
        return [o for _, o in self.effects if o.op == op and o.error is not None]


class ConversationLog:
    """Reads one app's event log a conversation at a time (each call reads only that conversation's partition)."""

    def __init__(self, bootstrap: str, app_id: str, config: RouterConfig | None = None, retry_base_ms: int = 0):
        self.bootstrap = bootstrap
        self.app_id = app_id
        self.config = config
        self.retry_base_ms = retry_base_ms

    def seen(self, account: int, conversation: int) -> Seen:
        return asyncio.run(self._seen(f"{account}:{conversation}"))

    async def _seen(self, key: str) -> Seen:
        topic = f"{self.app_id}.conversations"
        book = await read_book(self.bootstrap, self.app_id)
        replay = LogReplay(book=book) if len(book) else LogReplay(self.config, retry_base_ms=self.retry_base_ms)
        partition = await conversation_partition(self.bootstrap, topic, key)
        seen = Seen(key, partition, replay.trail(key))

        def feed(value: bytes | None, offset: int, p: int, record_key: bytes | None) -> None:
            before = len(replay.trail(key).outcomes)
            replay.feed(value, offset, p)
            if record_key != key.encode():
                return  # a configuration marker of the partition
            seen.offsets.append(offset)
            trail = replay.trail(key)
            seen.outcomes_at += [(offset, o) for o in trail.outcomes[before:]]
            try:
                event: Any = decode_conversation_event(value or b"")
            except ValueError:
                return
            if isinstance(event, TimerFired):
                seen.timers.append(event)
            parts = event.outcomes if isinstance(event, ChainedOutcomes) else [event]
            seen.effects += [(offset, o) for o in parts if isinstance(o, EffectOutcome)]

        await read_conversation(self.bootstrap, self.app_id, key, [feed], [replay.scan])
        seen.trail = replay.trail(key)
        seen.committed = await self._committed(TopicPartition(topic, partition))
        return seen

    async def _committed(self, tp: TopicPartition) -> int:
        admin = AIOKafkaAdminClient(bootstrap_servers=self.bootstrap)
        await admin.start()
        try:
            offsets = await admin.list_consumer_group_offsets(self.app_id, partitions=[tp])
        finally:
            await admin.close()
        found = offsets.get(tp)
        return found.offset if found is not None else -1

    def wait(self, account: int, conversation: int, what: str, check: Any, deadline_s: float = 90) -> Seen:
        """Poll the conversation's records until `check(seen)` holds; at the deadline, fail saying what was seen."""
        deadline = time.monotonic() + deadline_s
        last: Seen | None = None
        while time.monotonic() < deadline:
            last = self.seen(account, conversation)
            if check(last):
                return last
            time.sleep(0.3)  # polling interval, bounded by the deadline
        pytest.fail(
            f"timed out waiting for {account}:{conversation} {what}; last seen: {last.describe() if last else None}"
        )

    def wait_settled(
        self, account: int, conversation: int, what: str = "settled", *, after: int = -1, deadline_s: float = 90
    ) -> Seen:
        """Wait until the workers folded every record of the conversation, its last record is past `after` (a
        stimulus remembered by the caller) and nothing is in flight or due for it."""
        return self.wait(
            account, conversation, what, lambda s: s.settled and s.last_offset > after, deadline_s=deadline_s
        )


def sandbox_calls(stack: Any, conversation: int, *, since_seq: int = 0, account: int = 1) -> list[dict[str, Any]]:
    """The API calls the sandbox received for one conversation after sequence number `since_seq`."""
    log = stack.control("GET", f"/log?since_seq={since_seq}&include=api_calls")
    path = f"/api/v1/accounts/{account}/conversations/{conversation}"
    return [c for c in log["api_calls"] if c["path"] == path or c["path"].startswith(path + "/")]


def last_seq(stack: Any) -> int:
    """The sandbox log's newest sequence number, to remember before a stimulus."""
    return int(stack.control("GET", f"/log?since_seq={2**62}&include=person_actions")["last_seq"])
