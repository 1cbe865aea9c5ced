"""The demo's player: plays scripted conversations through the sandbox and watches the router's event log.

The player acts as customers and agents through the sandbox's control API (so Chatwoot's webhooks reach the
router exactly as they would in production), and follows the router by replaying `<app>.conversations` with the
same fold the worker runs (projections.logs.audit). A step "settles" when every webhook the sandbox sent has been
folded and the conversation's replayed state is idle (no job, no run in progress).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from dataclasses import dataclass, field
from importlib import resources
from typing import Any

import httpx
import yaml
from aiokafka import AIOKafkaConsumer, TopicPartition

from handlers.kafka.security import client_options
from handlers.kafka.topic_io import topic_partitions
from handlers.privacy.reader_keys import KeysFollower
from projections.logs.audit import ConversationTrail, LogReplay
from schemas.config import RouterConfig
from schemas.keys import conversation_key
from schemas.records import TurnOutcome

FINAL_RESULTS = ("assigned", "ended", "handed_off", "waited", "nothing", "dropped")
# Outcomes that only confirm a turn already ended (the router's own status change coming back as a webhook).
QUIET_RESULTS = ("nothing", "deferred", "retry")


def load_bundled(name: str) -> Any:
    """A YAML file shipped in streams/demo/."""
    text = resources.files("streams").joinpath("demo", name).read_text(encoding="utf-8")
    return yaml.safe_load(text)


class LogWatcher:
    """Replays `<app>.conversations` from the start, continuously, into one audit trail per conversation."""

    def __init__(
        self, bootstrap: str, topic: str, config: RouterConfig, retry_base_ms: int, keys: KeysFollower | None = None
    ) -> None:
        self.topic = topic
        self.keys = keys  # the demo's own key-encryption key opens what the worker sealed (issue 32)
        self.replay = LogReplay(
            config, retry_base_ms=retry_base_ms, opener=keys.keys.open_decide if keys is not None else None
        )
        self.positions: dict[int, int] = {}
        self._bootstrap = bootstrap
        self._consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False, **client_options())
        self._task: asyncio.Task[None] | None = None
        self._partitions: list[TopicPartition] = []

    async def start(self) -> None:
        self._partitions = await topic_partitions(self._bootstrap, self.topic)
        await self._consumer.start()
        self._consumer.assign(self._partitions)
        await self._consumer.seek_to_beginning(*self._partitions)
        self._task = asyncio.create_task(self._run())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        await self._consumer.stop()
        if self.keys is not None:
            await self.keys.close()

    async def _run(self) -> None:
        while True:
            batches = await self._consumer.getmany(timeout_ms=200)
            if batches and self.keys is not None:
                await self.keys.refresh()  # every data key written before these records were
            for tp, records in batches.items():
                for record in records:
                    self.replay.feed(record.value, record.offset)
                    self.positions[tp.partition] = record.offset + 1

    async def caught_up(self) -> bool:
        """True when everything on the topic right now has been replayed."""
        ends = await self._consumer.end_offsets(self._partitions)
        return all(self.positions.get(tp.partition, 0) >= end for tp, end in ends.items())

    def trail(self, key: str) -> ConversationTrail:
        return self.replay.trail(key)


def main_outcome(outcomes: list[TurnOutcome]) -> TurnOutcome | None:
    """The outcome that tells what happened: the last one that did something, else the last one."""
    for outcome in reversed(outcomes):
        if outcome.result not in QUIET_RESULTS:
            return outcome
    return outcomes[-1] if outcomes else None


@dataclass
class Played:
    """One conversation as played: its script, its ids, and how long it took."""

    script: dict[str, Any]
    account_id: int = 0
    conversation_id: int = 0
    started: float = 0.0
    finished: float = 0.0
    error: str | None = None

    @property
    def key(self) -> str:
        return conversation_key(self.account_id, self.conversation_id)


@dataclass
class DemoPlayer:
    """Plays scripts against the sandbox's control API and waits on the router through the log watcher."""

    sandbox_url: str
    watcher: LogWatcher
    settle_timeout_s: float = 90.0
    http: httpx.AsyncClient = field(default_factory=lambda: httpx.AsyncClient(timeout=30))
    _sandbox_lock: asyncio.Lock = field(default_factory=asyncio.Lock)

    async def control(self, method: str, path: str, body: dict[str, Any] | None = None) -> Any:
        response = await self.http.request(method, f"{self.sandbox_url}/_sandbox{path}", json=body)
        response.raise_for_status()
        return response.json()

    async def play(self, script: dict[str, Any]) -> Played:
        played = Played(script=script, started=time.monotonic())
        contact = script.get("contact", {})
        conversation = await self.control(
            "POST",
            "/conversations",
            {
                "account_id": script["account"],
                "inbox_id": script["inbox"],
                "contact_name": contact.get("name"),
                "contact_email": contact.get("email"),
            },
        )
        played.account_id, played.conversation_id = int(script["account"]), int(conversation["id"])
        try:
            for step in script["steps"]:
                await self._step(played, step)
        except Exception as exc:  # a failed script is reported, the others go on
            played.error = f"{type(exc).__name__}: {exc}"
        played.finished = time.monotonic()
        return played

    async def _step(self, played: Played, step: Any) -> None:
        base = f"/conversations/{played.account_id}/{played.conversation_id}"
        if step == "settle":
            await self.settle(played.key)
        elif step == "delete":
            await self.control("DELETE", base)
        elif "customer" in step:
            message = step["customer"]
            body = {"content": message} if isinstance(message, str) else message
            await self.control("POST", f"{base}/incoming", body)
        elif "human_reply" in step:
            reply = step["human_reply"]
            await self.control("POST", f"{base}/reply", {"user_id": reply["user"], "content": reply["content"]})
        elif "human_status" in step:
            change = step["human_status"]
            await self.control("POST", f"{base}/status", {"user_id": change["user"], "status": change["status"]})
        elif "fault" in step:
            rule = {**step["fault"], "account_id": played.account_id, "conversation_id": played.conversation_id}
            await self.control("POST", "/faults", rule)
        else:
            raise ValueError(f"unknown step {step!r}")

    async def settle(self, key: str) -> None:
        """Wait until the sandbox delivered its webhooks, the log is replayed, and the conversation is idle."""
        deadline = time.monotonic() + self.settle_timeout_s
        stable = 0
        while time.monotonic() < deadline:
            async with self._sandbox_lock:
                await self.control("POST", "/settle", {"timeout_s": 10})
            if await self.watcher.caught_up():
                trail = self.watcher.trail(key)
                idle = trail.state.job is None and trail.state.run is None
                if idle and any(o.result in FINAL_RESULTS for o in trail.outcomes):
                    stable += 1
                    if stable >= 2:  # idle twice in a row: nothing the router did started another run
                        return
                else:
                    stable = 0
            await asyncio.sleep(0.3)
        raise TimeoutError(f"conversation {key} did not settle within {self.settle_timeout_s:.0f} s")

    async def aclose(self) -> None:
        await self.http.aclose()


def conversation_report(played: Played, trail: ConversationTrail, live: dict[str, Any] | None) -> dict[str, Any]:
    """What the report shows for one conversation, as plain data (also written as JSON)."""
    main = main_outcome(trail.outcomes)
    messages = (live or {}).get("messages", [])
    bot_replies = [
        m for m in messages if m.get("message_type") == 1 and (m.get("sender") or {}).get("type") == "agent_bot"
    ]
    decision = trail.decisions[-1] if trail.decisions else None
    return {
        "id": played.script["id"],
        "title": played.script.get("title", played.script["id"]),
        "key": played.key,
        "input": trail.inputs[-1] if trail.inputs else None,
        "decision": decision.model_dump() if decision else None,
        "result": main.result if main else None,
        "reason": main.reason if main else None,
        "outcomes": [o.result for o in trail.outcomes],
        "labels": (live or {}).get("labels", []),
        "reply_sent": len(bot_replies) > 0,
        "replies": len(bot_replies),
        "status": (live or {}).get("status", "deleted"),
        "assignee_id": (live or {}).get("assignee_id"),
        "seconds": round(played.finished - played.started, 2),
        "error": played.error,
        "expect": played.script.get("expect"),
    }


def check_expectation(row: dict[str, Any]) -> list[str]:
    """Differences between what the script expected and what the router did (empty = as expected)."""
    expect = row.get("expect") or {}
    problems = []
    if "result" in expect and row["result"] != expect["result"]:
        problems.append(f"result {row['result']} != {expect['result']}")
    if "reason" in expect and row["reason"] != expect["reason"]:
        problems.append(f"reason {row['reason']} != {expect['reason']}")
    if "assignee" in expect and row["assignee_id"] != expect["assignee"]:
        problems.append(f"assignee {row['assignee_id']} != {expect['assignee']}")
    if "status" in expect and row["status"] != expect["status"]:
        problems.append(f"status {row['status']} != {expect['status']}")
    if "reply" in expect and row["reply_sent"] != expect["reply"]:
        problems.append(f"reply {row['reply_sent']} != {expect['reply']}")
    if row["replies"] > 1:
        problems.append(f"{row['replies']} replies sent")
    if row["error"]:
        problems.append(row["error"])
    return problems
