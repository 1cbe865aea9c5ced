"""The pieces every log reader shares (DESIGN §8 "Readers at scale"): the scan, the history check, progress, the
capped verify report, the what-if tally and the sharding of partitions over processes."""

from __future__ import annotations

import asyncio
import functools
import io
import os
import pickle
import signal
import threading

from handlers.logs.progress import ReadProgress
from handlers.logs.shards import FORK_LOCK, run_sharded
from projections.logs.scan import History, PartitionHead, conversation_scan
from projections.logs.verify import Verified, diff_states
from projections.whatif.record import TurnRecorder
from projections.whatif.report import build_report
from projections.whatif.tally import Selection, TurnTally
from schemas.configs import ConfigBook, ConfigDocument, FoldSettings
from schemas.records import ConfigApplied
from schemas.state import ConversationState
from tests.support.waiting import within
from tests.unit.test_fold_driver import Driver, decision, incoming


def _document(driver: Driver) -> ConfigDocument:
    return ConfigDocument.of(driver.config, FoldSettings(retry_base_ms=driver.retry_base_ms))


def test_the_scan_switches_versions_counts_the_undecodable_and_resumes_mid_partition() -> None:
    driver = Driver()
    driver.chatwoot.messages = [incoming(1, "I was charged twice for my invoice")]
    driver.webhook()
    v1 = _document(driver)
    v2 = ConfigDocument.of(driver.config, FoldSettings(retry_base_ms=999))
    scan = conversation_scan(ConfigBook([v1, v2]))
    assert scan.document(0) == v1  # before any marker: the book's first
    assert scan.event(ConfigApplied(version=v2.version, at_ms=0).model_dump_json().encode(), 0) is None
    assert scan.document(0) == v2 and scan.document(1) == v1 and scan.version(0) == v2.version
    assert scan.event(b"not a record", 0) is None and scan.undecodable == 1
    _, event = driver.log[0]
    assert scan.event(event.model_dump_json().encode(), 1) == event
    scan.resume(1, v2.version)  # a read that starts where v2 was in force
    assert scan.document(1) == v2
    scan.resume(1, None)
    assert scan.document(1) == v1
    assert scan.records == 3 and dict(scan.by_partition) == {0: 2, 1: 1}


def test_the_fold_records_where_a_conversation_starts() -> None:
    driver = Driver()
    driver.chatwoot.messages = [incoming(1, "I was charged twice for my invoice")]
    driver.webhook()
    first, _ = driver.log[0]
    assert driver.state.first_offset == first and driver.state.first_version is None
    assert ConversationState().first_offset == -1  # a state written before the field existed reads as unknown


def test_a_history_says_which_partitions_lost_records_and_from_when() -> None:
    whole = History("a.conversations", (PartitionHead(0, 0, 10), PartitionHead(1, 0, 0)))
    assert not whole.is_partial and "complete" in whole.describe()
    partial = History("a.conversations", (PartitionHead(0, 0, 10), PartitionHead(1, 1200, 5000, 1_700_000_000_000)))
    assert partial.is_partial and partial.missing == 1200 and partial.complete_from_ms == 1_700_000_000_000
    assert partial.describe() == (
        "a.conversations: the history is partial: 1,200 records deleted from the head of partition(s) "
        "1 (1,200 missing, kept from 2023-11-14T22:13:20Z); complete only from 2023-11-14T22:13:20Z"
    )
    assert not partial.only([0]).is_partial


def test_progress_is_quiet_on_short_reads_and_shows_rate_eta_and_partitions_on_long_ones() -> None:
    now = [0.0]
    out = io.StringIO()
    progress = ReadProgress("replay state", {0: 100, 1: 100}, stream=out, clock=lambda: now[0], live=False)
    progress(0, 50)
    assert out.getvalue() == ""  # not yet long
    now[0] = 6.0
    progress(0, 50)
    progress(1, 20)
    now[0] = 20.0
    progress(1, 10)
    lines = out.getvalue().splitlines()
    assert lines[0].startswith("replay state: 100/200 records (50%), 17 records/s, ETA 6 s; partitions 1/2 done")
    assert "partitions 1 30%, 1/2 done" in lines[1]


def test_verify_lists_the_first_differences_and_counts_the_rest() -> None:
    left = Verified(conversations=3, cap=2)
    left.add(diff_states({"1:3": ConversationState(offset=1)}, {}))
    right = Verified(conversations=2, undecodable=1, cap=2)
    right.add(diff_states({"1:1": ConversationState(offset=1), "1:2": ConversationState(offset=2)}, {}))
    left.merge(right)
    assert left.lines() == [
        "1:1: missing from the live table",
        "1:2: missing from the live table",
        "… and 1 more differences (only the first 2 are listed)",
        "5 conversations replayed, 1 undecodable records, 3 differences",
    ]
    older = ConversationState(offset=4)  # a live value from before the start was recorded
    assert diff_states({"1:1": older.evolve(first_offset=0, first_version="v")}, {"1:1": older}) == []


def test_a_tally_keeps_counts_and_capped_rows_and_merges_like_the_whole_report() -> None:
    drivers = []
    for owner in ("billing", "billing", "sales"):
        driver = Driver()
        driver.chatwoot.messages = [incoming(1, "I was charged twice for my invoice")]
        driver.chatwoot.decision = decision(owner, 0.92)
        driver.webhook()
        drivers.append(driver)
    document = _document(drivers[0])
    book = ConfigBook([document])
    recorder = TurnRecorder(book)
    for driver in drivers:
        for offset, event in driver.log:
            recorder.apply(event, offset, document)
    whole = build_report(recorder.turns, document.config, "cand")
    tallies = [TurnTally(document.config, cap=1), TurnTally(document.config, cap=1)]
    for index, turn in enumerate(recorder.turns):
        tallies[index % 2](turn)
    tallies[0].merge(tallies[1])
    merged = tallies[0].report("cand")
    assert merged.totals == whole.totals and merged.matrix == whole.matrix and merged.diffs == whole.diffs
    assert len(merged.turns) == 1 and merged.unlisted == len(whole.turns) - 1
    assert merged.as_json()["turns_not_listed"] == merged.unlisted
    assert TurnTally(document.config, selection=Selection(account_id=2)).counts == {}


async def _double(offset: int, partition: int, progress: object) -> int:
    progress(partition, partition + 1)  # type: ignore[operator]
    return partition * 2 + offset


def test_partitions_are_shared_out_over_processes_with_their_progress() -> None:
    seen: dict[int, int] = {}

    def progress(partition: int, records: int) -> None:
        seen[partition] = seen.get(partition, 0) + records

    sizes = {0: 10, 1: 30, 2: 20}
    task = functools.partial(_double, 100)
    assert run_sharded(task, sizes, jobs=2, progress=progress) == {0: 100, 1: 102, 2: 104}
    assert run_sharded(task, sizes, jobs=1) == {0: 100, 1: 102, 2: 104}
    assert seen == {0: 1, 1: 2, 2: 3}


async def test_a_pool_of_processes_never_wakes_the_parents_signal_handlers() -> None:
    """The console stops on SIGTERM (an asyncio signal handler); the pool's processes, forked from it and ended
    with SIGTERM by the pool, must not reach that handler through the inherited wakeup descriptor."""
    loop = asyncio.get_running_loop()
    woke: list[int] = []
    previous = signal.getsignal(signal.SIGTERM)
    loop.add_signal_handler(signal.SIGTERM, lambda: woke.append(1))
    try:
        task = functools.partial(_double, 0)
        assert await asyncio.to_thread(run_sharded, task, {0: 1, 1: 1, 2: 1}, 2) == {0: 0, 1: 2, 2: 4}
        # The pool's processes are gone (the pool joined them), so whatever they wrote to the wakeup descriptor is
        # in it already. A SIGTERM of our own goes in after it and is handled after it: once ours is seen, a
        # signal from a pool process would have been seen first. Order, not a wait for a window.
        os.kill(os.getpid(), signal.SIGTERM)
        async with within(10, "our own SIGTERM reaching the handler"):
            while not woke:
                await asyncio.sleep(0.01)  # polling interval, bounded by the deadline
        assert woke == [1]  # ours alone
    finally:
        loop.remove_signal_handler(signal.SIGTERM)
        signal.signal(signal.SIGTERM, previous)  # remove_signal_handler leaves the default, not what was there


async def _under_the_fork_lock(partition: int, progress: object) -> int:
    with FORK_LOCK:  # what the console's snapshot does around each SQLite call, in a build's process
        return partition


def test_a_pool_is_forked_under_the_fork_lock_and_its_processes_can_take_it() -> None:
    """The console's first build forks while its main thread may be inside SQLite; a lock held at the fork stays
    held in the child for good. The pool is forked holding `FORK_LOCK` (so no SQLite call is under way), and each
    process lets go of the copy it inherited: a task that takes it finishes (without that, it waits forever)."""
    task = functools.partial(_under_the_fork_lock)
    results: list[dict[int, int]] = []
    runner = threading.Thread(target=lambda: results.append(run_sharded(task, {0: 1, 1: 1}, jobs=2)), daemon=True)
    runner.start()
    runner.join(60)  # a deadline, not a measure: a process stuck on the inherited lock never ends
    assert results == [{0: 0, 1: 1}], "a pool process waited forever on the lock it inherited"
    assert not FORK_LOCK.locked()


def test_a_tally_goes_back_to_the_parent_without_the_data_keys_its_process_opened() -> None:
    """`whatif --jobs N` on a sealed log: a shard's tally holds the opener of its process's data keys (AES-GCM
    objects, which do not pickle and must not leave the process)."""
    from handlers.privacy.envelope import DataKey
    from handlers.privacy.reader_keys import ReaderKeys

    keys = ReaderKeys(None)
    keys._opened["1:1"] = DataKey.new("1:1")
    tally = TurnTally(Driver().config)
    tally.opener = keys.plain_input
    copy = pickle.loads(pickle.dumps(tally))
    assert copy.opener is None and tally.opener is not None and copy.counts == tally.counts
