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


async def test_the_cache_is_written_before_faust_flushes_the_producer_and_commits(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    calls: list[str] = []

    async def faust_commit(self: Any, offsets: Any, start_new_transaction: bool = True) -> bool:
        calls.append("flush and commit")  # Faust's own: producer.flush(), then the offset commit
        return True

    monkeypatch.setattr(faust_aiokafka.Consumer, "_commit_offsets", faust_commit)
    consumer = transport.Consumer.__new__(transport.Consumer)  # nothing of it is started
    app = type("App", (), {})()
    object.__setattr__(consumer, "app", app)
    transport.set_pre_commit(app, lambda: calls.append("write cache"))
    assert await consumer._commit_offsets({TP("t", 0): 5}) is True
    assert calls == ["write cache", "flush and commit"]


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
