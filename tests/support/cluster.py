"""The three-node cluster from a test (`streams.kafka.cluster`): faults on a timeline, the partitions' leaders and
in-sync replicas over time, samples of a `/healthz`, a steady feed of conversations through the sandbox, and what
the webhooks' answers say about the door.

Times are wall-clock seconds (`time.time()`), the clock the sandbox stamps its webhook attempts with.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Self

import httpx
from aiokafka.admin import AIOKafkaAdminClient

from schemas.keys import partition_for
from streams.kafka.cluster import MIN_INSYNC_REPLICAS, LocalCluster

QUESTION = "I was charged twice on my invoice, please refund the payment"
FOLLOW_UP = "Any news about my refund?"


# --- faults -------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class NodeEvent:
    at: float
    node_id: int
    up: bool
    how: str  # SIGKILL, SIGTERM, restart


class Faults:
    """Kills, stops and restarts of the cluster's nodes, with when each node was down.

    A node counts as down from the moment it is signalled (a SIGTERMed node hands its leaderships over while it
    shuts down) until its restart returned, i.e. until it serves clients again.
    """

    def __init__(self, cluster: LocalCluster) -> None:
        self.cluster = cluster
        self.events: list[NodeEvent] = []

    def kill(self, index: int) -> None:
        self.events.append(NodeEvent(time.time(), self.cluster.nodes[index].node_id, False, "SIGKILL"))
        self.cluster.kill(index)

    def terminate(self, index: int) -> None:
        self.events.append(NodeEvent(time.time(), self.cluster.nodes[index].node_id, False, "SIGTERM"))
        self.cluster.terminate(index)

    def restart(self, index: int) -> None:
        self.cluster.restart(index)
        self.events.append(NodeEvent(time.time(), self.cluster.nodes[index].node_id, True, "restart"))

    def down_at(self, at: float) -> set[int]:
        down: set[int] = set()
        for event in self.events:
            if event.at > at:
                break
            (down.discard if event.up else down.add)(event.node_id)
        return down

    def changed_between(self, start: float, end: float) -> bool:
        return any(start <= event.at <= end for event in self.events)


# --- what the cluster says over time -------------------------------------------------------------------------

PartitionView = tuple[int, tuple[int, ...]]  # (leader, in-sync replicas)


@dataclass(frozen=True)
class Snapshot:
    at: float
    partitions: dict[int, PartitionView]


class _Poller(threading.Thread):
    """Calls `poll()` every `every_s` until stopped; its own asyncio loop."""

    def __init__(self, every_s: float) -> None:
        super().__init__(daemon=True)
        self.every_s = every_s
        self._stop_event = threading.Event()

    def run(self) -> None:
        asyncio.run(self._loop())

    async def _loop(self) -> None:
        await self.setup()
        try:
            while not self._stop_event.is_set():
                await self.poll()
                await asyncio.sleep(self.every_s)  # the sampling interval of a measurement, not a wait for luck
        finally:
            await self.teardown()

    def stop(self) -> None:
        self._stop_event.set()
        self.join(30)

    async def setup(self) -> None:
        return None

    async def poll(self) -> None:
        raise NotImplementedError

    async def teardown(self) -> None:
        return None

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


class MetadataWatch(_Poller):
    """Each partition's leader and in-sync replicas of `topic`, as the cluster reports them, every `every_s`."""

    def __init__(self, bootstrap: str, topic: str, every_s: float = 0.2) -> None:
        super().__init__(every_s)
        self.bootstrap, self.topic = bootstrap, topic
        self.snapshots: list[Snapshot] = []
        self._admin: AIOKafkaAdminClient | None = None

    async def setup(self) -> None:
        self._admin = AIOKafkaAdminClient(bootstrap_servers=self.bootstrap, request_timeout_ms=2000)
        await self._admin.start()

    async def poll(self) -> None:
        assert self._admin is not None
        try:  # a request sent to a node that just died fails: the next poll asks another one
            described = await asyncio.wait_for(self._admin.describe_topics([self.topic]), 2)
        except Exception:
            return
        for topic in described:
            if topic["topic"] == self.topic and topic["error_code"] == 0:
                views = {p["partition"]: (p["leader"], tuple(p["isr"])) for p in topic["partitions"]}
                self.snapshots.append(Snapshot(time.time(), views))

    async def teardown(self) -> None:
        if self._admin is not None:
            with contextlib.suppress(Exception):
                await self._admin.close()

    def first_after(self, at: float) -> Snapshot | None:
        return next((s for s in self.snapshots if s.at >= at), None)


class HealthSampler(_Poller):
    """The status of GET `url` every `every_s` (0 when it does not answer)."""

    def __init__(self, url: str, every_s: float = 0.2) -> None:
        super().__init__(every_s)
        self.url = url
        self.samples: list[tuple[float, int]] = []
        self._http: httpx.AsyncClient | None = None

    async def setup(self) -> None:
        self._http = httpx.AsyncClient(timeout=2)

    async def poll(self) -> None:
        assert self._http is not None
        try:
            status = (await self._http.get(self.url)).status_code
        except httpx.HTTPError:
            status = 0
        self.samples.append((time.time(), status))

    async def teardown(self) -> None:
        if self._http is not None:
            await self._http.aclose()


class Feed(_Poller):
    """A steady stream of customers through the sandbox: `new_per_s` new conversations with a billing question
    (each routed by the workers, several webhooks each) and `follow_ups_per_s` further messages on conversations
    of this feed (one webhook each). Each action runs as its own task, so a slow sandbox never slows the pace."""

    def __init__(
        self, sandbox_url: str, inbox: int, new_per_s: float, follow_ups_per_s: float, tick_s: float = 0.1
    ) -> None:
        super().__init__(tick_s)
        self.sandbox_url, self.inbox, self.tick_s = sandbox_url, inbox, tick_s
        self.new_per_s, self.follow_ups_per_s = new_per_s, follow_ups_per_s
        self.conversations: list[int] = []
        self.failures: list[str] = []
        self._http: httpx.AsyncClient | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self._due = {"new": 0.0, "follow_up": 0.0}
        self._rng = random.Random(7)

    async def setup(self) -> None:
        self._http = httpx.AsyncClient(base_url=f"{self.sandbox_url}/_sandbox", timeout=30)

    async def poll(self) -> None:
        self._due["new"] += self.new_per_s * self.tick_s
        self._due["follow_up"] += self.follow_ups_per_s * self.tick_s
        while self._due["new"] >= 1:
            self._due["new"] -= 1
            self._spawn(self._new())
        while self._due["follow_up"] >= 1 and self.conversations:
            self._due["follow_up"] -= 1
            self._spawn(self._follow_up(self._rng.choice(self.conversations)))

    def _spawn(self, coroutine: Any) -> None:
        task = asyncio.ensure_future(coroutine)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _new(self) -> None:
        assert self._http is not None
        try:
            created = await self._http.post("/conversations", json={"account_id": 1, "inbox_id": self.inbox})
            conversation = int(created.json()["id"])
            await self._http.post(f"/conversations/1/{conversation}/incoming", json={"content": QUESTION})
        except (httpx.HTTPError, KeyError, ValueError) as exc:
            self.failures.append(f"new conversation: {type(exc).__name__}")
            return
        self.conversations.append(conversation)

    async def _follow_up(self, conversation: int) -> None:
        assert self._http is not None
        try:
            await self._http.post(f"/conversations/1/{conversation}/incoming", json={"content": FOLLOW_UP})
        except httpx.HTTPError as exc:
            self.failures.append(f"follow-up: {type(exc).__name__}")

    async def teardown(self) -> None:
        await asyncio.gather(*self._tasks, return_exceptions=True)
        if self._http is not None:
            await self._http.aclose()


# --- what the webhooks' answers say ----------------------------------------------------------------------------


@dataclass(frozen=True)
class Attempt:
    """One delivery attempt of a webhook to the ingress, as the sandbox (Chatwoot) saw it."""

    delivery_id: str
    key: str
    partition: int
    at: float  # when the answer (or the error) came
    status: int  # 0: no answer
    accepted: bool  # 2xx and written (not "ignored")

    @property
    def refused(self) -> bool:
        return not 200 <= self.status < 300


def attempts_of(deliveries: Iterable[dict[str, Any]], conversations: set[int], partitions: int) -> list[Attempt]:
    """Every attempt of the deliveries for account 1's `conversations`, in the order of their answers."""
    attempts = []
    for delivery in deliveries:
        if delivery["account_id"] != 1 or delivery["conversation_id"] not in conversations:
            continue
        key = f"{delivery['account_id']}:{delivery['conversation_id']}"
        for attempt in delivery["attempts"]:
            status = int(attempt.get("status") or 0)
            accepted = 200 <= status < 300 and not str(attempt.get("response", "")).startswith('{"ok":true,"ignored"')
            attempts.append(
                Attempt(delivery["delivery_id"], key, partition_for(key, partitions), attempt["at"], status, accepted)
            )
    return sorted(attempts, key=lambda a: a.at)


def writable(view: PartitionView | None, down: set[int]) -> bool:
    """An acks=all write can be acknowledged: a live leader, and every in-sync replica (at least min ISR) live."""
    if view is None:
        return False
    leader, isr = view
    return leader >= 0 and leader not in down and not set(isr) & down and len(isr) >= MIN_INSYNC_REPLICAS


REQUEST_S = 1.0  # an answered attempt took at most the produce timeout (ROUTER_PRODUCE_TIMEOUT_MS's default)
NO_ANSWER_S = 5.0  # one without an answer took the sandbox's (Chatwoot's) client timeout
CHATWOOT_TIMEOUT_S = NO_ANSWER_S  # Chatwoot's webhook timeout: the door answers within it (behavior.md Decisions 6)
SETTLE_S = 2.0  # after a leader moves: the producer learns it (a metadata refresh), the followers follow it


def refused_while_writable(attempts: Iterable[Attempt], watch: MetadataWatch, faults: Faults) -> list[Attempt]:
    """Refused attempts whose partition was writable, and stayed as it was, from SETTLE_S before the request was
    sent until its answer (every snapshot in that window, and the last one before it), with no node signalled or
    restarted in that window: a leader that just moved, even to a live broker, needs a moment before writes flow."""
    wrong = []
    for attempt in attempts:
        if not attempt.refused:
            continue
        start = attempt.at - (REQUEST_S if attempt.status else NO_ANSWER_S) - SETTLE_S
        if faults.changed_between(start, attempt.at):
            continue
        before = [s for s in watch.snapshots if s.at < start][-1:]
        seen = before + [s for s in watch.snapshots if start <= s.at <= attempt.at]
        views = {s.partitions.get(attempt.partition) for s in seen}
        if len(seen) >= 2 and len(views) == 1 and all(
            writable(s.partitions.get(attempt.partition), faults.down_at(s.at)) for s in seen
        ):
            wrong.append(attempt)
    return wrong


def unanswered(attempts: Iterable[Attempt]) -> list[Attempt]:
    """Attempts not answered 2xx or 500 within Chatwoot's 5 s timeout (the sandbox's client timeout): no answer at
    all (0), or a status Chatwoot does not retry. What Chatwoot needs from the door (behavior.md Decisions 6)."""
    return [a for a in attempts if a.refused and a.status != 500]


def given_up(attempts: Iterable[Attempt], start: float = 0.0, end: float = float("inf")) -> list[str]:
    """Deliveries with every attempt between `start` and `end` refused: the ones Chatwoot gave up on (its fallback
    then opens the pending conversation), which a user notices; a 500 it retried and then got in is not."""
    tries: dict[str, list[Attempt]] = {}
    for attempt in attempts:
        tries.setdefault(attempt.delivery_id, []).append(attempt)
    return sorted(
        delivery
        for delivery, seen in tries.items()
        if all(a.refused for a in seen) and all(start <= a.at <= end for a in seen)
    )


def given_up_while_writable(attempts: list[Attempt], watch: MetadataWatch, faults: Faults) -> list[str]:
    """Deliveries Chatwoot gave up on although each of their attempts was refused while the partition was writable
    (`refused_while_writable`): a door that closed what it did not have to, for long enough to lose a webhook."""
    wrongly = set(refused_while_writable(attempts, watch, faults))
    failed = set(given_up(attempts))
    return sorted(delivery for delivery in failed if all(a in wrongly for a in attempts if a.delivery_id == delivery))


@dataclass(frozen=True)
class Window:
    """The refused attempts between two times: how many, and from when to when."""

    refused: int
    answered: int
    first: float | None
    last: float | None

    def describe(self, origin: float) -> str:
        if self.first is None or self.last is None:
            return f"0 of {self.answered} attempts refused"
        return (
            f"{self.refused} of {self.answered} attempts refused, from {self.first - origin:+.1f} s to "
            f"{self.last - origin:+.1f} s ({self.last - self.first:.1f} s)"
        )


def refusals_between(attempts: Iterable[Attempt], start: float, end: float) -> Window:
    inside = [a for a in attempts if start <= a.at <= end]
    refused = [a.at for a in inside if a.refused]
    return Window(len(refused), len(inside), min(refused, default=None), max(refused, default=None))


def longest_refused_streak(attempts: list[Attempt]) -> tuple[int, float]:
    """The longest run of consecutive refused answers (in answer order): how many, over how many seconds."""
    best, best_s, run_start, run = 0, 0.0, 0.0, 0
    for attempt in attempts:
        if attempt.refused:
            run_start = attempt.at if run == 0 else run_start
            run += 1
            if run > best:
                best, best_s = run, attempt.at - run_start
        else:
            run = 0
    return best, best_s


def healthy_while_every_write_failed(
    samples: Iterable[tuple[float, int]], attempts: list[Attempt], before_s: float = 1.5, after_s: float = 0.5
) -> list[float]:
    """Times of /healthz 200 samples around which (`before_s` earlier to `after_s` later) every webhook answered
    was refused, at least five of them."""
    wrong = []
    for at, status in samples:
        if status != 200:
            continue
        around = [a for a in attempts if at - before_s <= a.at <= at + after_s]
        if len(around) >= 5 and all(a.refused for a in around):
            wrong.append(at)
    return wrong
