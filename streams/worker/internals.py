"""What the worker relies on in faust-streaming and aiokafka beyond their documented API, checked at start
(issue 34): a worker on a release that changed one of them refuses to start with one line saying which.

- the releases read: faust-streaming 0.15, aiokafka 0.14 (pyproject.toml pins them);
- a table write takes its partition from `faust.streams.current_event()` (`Table.partition_for_key`), which the
  write cache sets through the private ContextVar `faust.streams._current_event` (`FaustPartitionScope`);
- every table write goes through `Table.send_changelog(partition, key, value, ...)`, whose future the commit
  barrier awaits and whose record the worker stamps with its generation (`streams/worker/tables.py`, which
  keeps Faust's `_on_changelog_sent` callback);
- the consumer's `_commit_offsets(offsets, start_new_transaction)` is where the commit protocol runs, and the
  consumer thread's `_create_worker_consumer` where the fetch long-poll is set (`streams/worker/transport.py`);
- the consumer thread's `_commit` commits through the aiokafka consumer's `commit` attribute (which the transport
  wraps to learn that the group expelled this member) and takes a CommitFailedError as a rebalance;
- `_new_offset` compares the acked records with `_committed_offset`, which the transport sets to Faust's own
  offset when the commit protocol commits a lower one (else Faust would see a gap and never commit again).

`check_scoped_write` is the behaviour test behind the second point, on the worker's own table once it owns
partitions: a key written inside `scope(p)` goes to partition p.
"""

from __future__ import annotations

import inspect
from typing import Any

import aiokafka
import faust
from faust import streams as faust_streams
from faust.tables.base import Collection
from faust.transport.drivers import aiokafka as faust_aiokafka

SUPPORTED = {"faust-streaming": ("0.15.",), "aiokafka": ("0.14.",)}


class InternalsChanged(RuntimeError):
    """An internal the worker relies on is not as it was read: the line names it."""


def _parameters(function: Any) -> list[str]:
    return list(inspect.signature(function).parameters)


def check_internals() -> None:
    """Raise `InternalsChanged` naming the first internal that differs from what the worker was written against."""
    versions = {"faust-streaming": faust.__version__, "aiokafka": aiokafka.__version__}
    for name, version in versions.items():
        if not version.startswith(SUPPORTED[name]):
            raise InternalsChanged(f"{name} {version} is installed; the worker supports {SUPPORTED[name]}")
    if not hasattr(faust_streams, "_current_event"):
        raise InternalsChanged("faust.streams has no _current_event (the write cache's partition scope)")
    if "current_event()" not in inspect.getsource(Collection.partition_for_key):
        raise InternalsChanged("faust's Table.partition_for_key no longer reads current_event()")
    if _parameters(Collection.send_changelog)[:4] != ["self", "partition", "key", "value"]:
        raise InternalsChanged("faust's Table.send_changelog is not (partition, key, value, ...)")
    if not hasattr(Collection, "_on_changelog_sent"):  # the callback the stamped send_changelog keeps
        raise InternalsChanged("faust's Table has no _on_changelog_sent")
    if _parameters(faust_aiokafka.Consumer._commit_offsets) != ["self", "offsets", "start_new_transaction"]:
        raise InternalsChanged("faust's Consumer._commit_offsets is not (offsets, start_new_transaction)")
    new_offset = inspect.getsource(faust_aiokafka.Consumer._new_offset)
    if "self._committed_offset[tp]" not in new_offset or "min(acked) - committed_offset > 1" not in new_offset:
        raise InternalsChanged("faust's Consumer._new_offset no longer checks acked records against _committed_offset")
    thread_commit = inspect.getsource(faust_aiokafka.AIOKafkaConsumerThread._commit)
    if "await consumer.commit(" not in thread_commit or "except CommitFailedError" not in thread_commit:
        raise InternalsChanged("faust's consumer thread no longer commits through consumer.commit (the fenced commit)")
    if not hasattr(faust_aiokafka.AIOKafkaConsumerThread, "_create_worker_consumer"):
        raise InternalsChanged("faust's AIOKafkaConsumerThread has no _create_worker_consumer")


def check_scoped_write(table: Any, scope: Any, partitions: frozenset[int]) -> None:
    """A key written inside `scope(p)` goes to partition p of `table`, for each owned p (the table's own
    `partition_for_key`, which both the RocksDB put and the changelog record use)."""
    for partition in sorted(partitions):
        with scope(partition):
            landed = table.partition_for_key("router-self-test")
        if landed != partition:
            raise InternalsChanged(f"a table write scoped to partition {partition} went to partition {landed}")
