"""The revoke order the worker relies on, driven through faust-streaming's real `App._on_partitions_revoked` and
its real `Consumer.wait_empty` (issue 34 item 5); only the broker-facing parts are recorded instead of run.

The worker's own revoke (`WorkerApp._on_revoked`, connected to the `on_partitions_revoked` signal) writes its cache,
forgets its decoded states and cancels the effects of the revoked partitions. That is safe only if, by the time
the signal is sent, Faust has stopped handing records to the agents (so nothing is folded into a state the worker
just forgot) and has committed the offsets through the worker's commit hook (so the group's offset never passes a
record whose state is not yet durable: the hook writes the cache and waits at the barrier first)."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

import faust
from faust.types import TP

from streams.worker import transport

T = TP("router.conversations", 0)


class _Log:
    def __getattr__(self, name: str) -> Any:
        return lambda *args, **kwargs: None


async def test_faust_stops_the_flow_and_commits_before_the_worker_revokes() -> None:
    steps: list[str] = []
    app = faust.App("revoke-order", broker="kafka://127.0.0.1:1")  # never started: nothing connects

    def step(name: str) -> Any:
        def record(*args: Any, **kwargs: Any) -> None:
            steps.append(name)

        return record

    async def commit() -> bool:
        steps.append("commit (the worker's hook runs here)")
        return True

    consumer = transport.Consumer.__new__(transport.Consumer)  # Faust's real wait_empty, nothing started
    for name, value in {
        "_unacked_messages": set(),
        "_stopped": asyncio.Event(),
        "_crashed": asyncio.Event(),
        "commit_and_end_transactions": commit,
        "assignment": lambda: {T},
        "stop_flow": step("stop_flow"),
        "pause_partitions": step("pause_partitions"),
        "log": _Log(),
        "diag": SimpleNamespace(set_flag=lambda flag: None, unset_flag=lambda flag: None),
    }.items():
        object.__setattr__(consumer, name, value)
    app.consumer = consumer
    app.__dict__["tables"] = SimpleNamespace(on_partitions_revoked=step("tables revoked"))  # a cached property
    app.flow_control.suspend = step("flow suspended")  # type: ignore[method-assign]
    app.flow_control.clear = step("agent buffers cleared")  # type: ignore[method-assign]

    async def worker_revoke(sender: Any, revoked: Any, **kwargs: Any) -> None:
        steps.append("the worker's revoke")

    app.on_partitions_revoked.connect(worker_revoke)
    await app._on_partitions_revoked({T})

    assert "the worker's revoke" in steps, steps
    revoke = steps.index("the worker's revoke")
    for before in ("tables revoked", "stop_flow", "flow suspended", "pause_partitions", "agent buffers cleared"):
        assert steps.index(before) < revoke, steps
    assert steps.index("commit (the worker's hook runs here)") < revoke, steps
    assert steps[-1] == "the worker's revoke", steps
