"""The Faust side of the commit protocol: the pre-commit hook runs before Faust flushes and commits, and the
partition scope gives a table write outside an event the partition it names."""

from __future__ import annotations

from typing import Any

import pytest
from faust.streams import current_event
from faust.transport.drivers import aiokafka as faust_aiokafka
from faust.types import TP

from streams.worker import transport
from streams.worker.adapters import FaustPartitionScope


async def test_faust_commits_only_what_the_hook_allows_after_the_hook_returns(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The transport's order: the worker's hook (cache, barrier, clamp) runs to its end before Faust's commit, which
    gets the hook's offsets, not its own; with nothing allowed, Faust commits nothing."""
    calls: list[object] = []

    async def faust_commit(self: Any, offsets: Any, start_new_transaction: bool = True) -> bool:
        calls.append(dict(offsets))  # Faust's own: producer.flush(), then the offset commit
        return True

    async def hook(offsets: Any) -> Any:
        calls.append("hook")
        return {tp: offset - 2 for tp, offset in offsets.items() if tp.partition == 0}

    monkeypatch.setattr(faust_aiokafka.Consumer, "_commit_offsets", faust_commit)
    consumer = transport.Consumer.__new__(transport.Consumer)  # nothing of it is started
    app = type("App", (), {})()
    object.__setattr__(consumer, "app", app)
    object.__setattr__(consumer, "assignment", lambda: {TP("t", 0), TP("t", 1)})
    object.__setattr__(consumer, "_committed_offset", {})
    transport.set_pre_commit(app, hook)
    assert await consumer._commit_offsets({TP("t", 0): 5, TP("t", 1): 7}) is True
    assert calls == ["hook", {TP("t", 0): 3}]
    # Faust keeps its own offsets as committed (test_commit_contract.py says why); the group got the hook's
    assert consumer._committed_offset == {TP("t", 0): 5, TP("t", 1): 7}
    assert await consumer._commit_offsets({TP("t", 1): 9}) is False
    assert calls[-1] == "hook"


def test_a_write_in_a_partition_scope_sees_an_event_of_that_partition() -> None:
    scope = FaustPartitionScope("router.conversations")
    assert current_event() is None
    with scope(3):
        event = current_event()
        assert event is not None and (event.message.topic, event.message.partition) == ("router.conversations", 3)
        with scope(1):
            inner = current_event()
            assert inner is not None and inner.message.partition == 1
        again = current_event()
        assert again is not None and again.message.partition == 3
    assert current_event() is None
