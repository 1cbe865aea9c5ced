"""The worker's start-up checks of the Faust and aiokafka internals it relies on (issue 34,
streams/worker/internals.py): the installed releases pass, a changed one is refused with a line naming it, and a
write in the write cache's partition scope lands in that partition of a real Faust table."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import pytest
from faust.tables.base import Collection

from streams.worker import internals
from streams.worker.adapters import FaustPartitionScope


def test_the_installed_faust_and_aiokafka_pass() -> None:
    internals.check_internals()


def test_another_release_is_refused_with_its_name(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(internals.SUPPORTED, "faust-streaming", ("0.16.",))
    with pytest.raises(internals.InternalsChanged, match=r"faust-streaming 0\.15\.\d+ is installed"):
        internals.check_internals()


def test_a_changed_commit_signature_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    async def commit(self: object, offsets: object) -> bool:
        return True

    monkeypatch.setattr(internals.faust_aiokafka.Consumer, "_commit_offsets", commit)
    with pytest.raises(internals.InternalsChanged, match="_commit_offsets"):
        internals.check_internals()


class FaustTableStandIn:
    """Just enough of a table for Faust's own `Collection.partition_for_key` (the real code: it reads the current
    event's partition); a real `faust.App` here would leave an event loop and its sockets behind in this process."""

    use_partitioner = False
    partition_for_key = Collection.partition_for_key

    def _verify_source_topic_partitions(self, topic: str) -> None:
        return None


def test_a_scoped_write_lands_in_the_scoped_partition_by_fausts_own_partition_for_key() -> None:
    internals.check_scoped_write(FaustTableStandIn(), FaustPartitionScope("router.conversations"), frozenset({0, 1, 3}))


def test_a_scope_that_does_not_reach_the_table_is_caught() -> None:
    outer = FaustPartitionScope("router.conversations")

    @contextmanager
    def off_by_one(partition: int) -> Iterator[None]:
        with outer(partition + 1):
            yield

    with pytest.raises(internals.InternalsChanged, match="scoped to partition 0 went to partition 1"):
        internals.check_scoped_write(FaustTableStandIn(), off_by_one, frozenset({0}))
