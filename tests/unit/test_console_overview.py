"""The console's overview without timelines (`OverviewFold`) counts exactly what the full model counts, and its
on-disk snapshot gives back the same overview after a restart."""

from __future__ import annotations

from pathlib import Path

from handlers.console.snapshot import Snapshot, fits
from projections.console.model import ConsoleModel
from projections.console.overview import MemoryStore, OverviewFold
from schemas.configs import ConfigBook
from tests.unit.test_fold_driver import T0, Driver, decision, incoming


def _drivers() -> list[Driver]:
    played = []
    for n, (owner, fail) in enumerate((("billing", False), ("sales", True), ("billing", False))):
        driver = Driver()
        driver.chatwoot.messages = [incoming(1, "I was charged twice for my invoice")]
        driver.chatwoot.decision = decision(owner, 0.92 if n != 1 else 0.3, kind="refund" if n == 2 else None)
        if fail:
            driver.chatwoot.fail("read_turn", times=1)
        driver.webhook()
        if fail:
            driver.tick()
        played.append(driver)
    return played


def _records(drivers: list[Driver]) -> list[tuple[int, bytes]]:
    """Each driver's log under its own conversation key, one partition, in order."""
    records = []
    offset = 0
    for index, driver in enumerate(drivers):
        for _, event in driver.log:
            offset += 1
            raw = (
                event.model_dump_json()
                .replace('"1:2', f'"1:{index + 10}')
                .replace('"conversation_id":2,', f'"conversation_id":{index + 10},')
            )
            records.append((offset, raw.encode()))
    records.append((offset + 1, b"not a record"))
    return records


def test_the_overview_fold_counts_what_the_full_model_counts() -> None:
    drivers = _drivers()
    config, retry = drivers[0].config, drivers[0].retry_base_ms
    model = ConsoleModel(config, retry_base_ms=retry)
    fold = OverviewFold(MemoryStore(), book=ConfigBook(), config=config, retry_base_ms=retry)
    for offset, raw in _records(drivers):
        model.feed(raw, offset)
        fold.feed(raw, offset, 0)
    now = T0 + 3_600_000
    assert fold.counts.overview(now) == model.overview(now)
    overview = model.overview(now)
    assert overview.conversations == 3 and overview.undecodable == 1 and overview.replies_sent >= 1
    assert overview.endings and sum(overview.results.values()) >= 3


def test_the_snapshot_gives_back_the_counts_positions_and_states(tmp_path: Path) -> None:
    drivers = _drivers()
    config, retry = drivers[0].config, drivers[0].retry_base_ms
    snapshot = Snapshot(tmp_path / "s.sqlite", "app.conversations")
    fold = OverviewFold(snapshot, book=ConfigBook(), config=config, retry_base_ms=retry)
    records = _records(drivers)
    half = len(records) // 2
    for offset, raw in records[:half]:
        fold.feed(raw, offset, 0)
    snapshot.commit(fold.counts, {0: records[half][0]}, {})
    snapshot.close()

    again = Snapshot(tmp_path / "s.sqlite", "app.conversations")
    loaded = again.load()
    assert loaded is not None and loaded.positions == {0: records[half][0]}
    assert fits(loaded, {0: 0}, {0: 10_000}) and not fits(loaded, {0: 0}, {0: 3})  # recreated: smaller than read
    resumed = OverviewFold(again, book=ConfigBook(), config=config, retry_base_ms=retry, counts=loaded.counts)
    for offset, raw in records[half:]:
        resumed.feed(raw, offset, 0)
    whole = OverviewFold(MemoryStore(), book=ConfigBook(), config=config, retry_base_ms=retry)
    for offset, raw in records:
        whole.feed(raw, offset, 0)
    now = T0 + 3_600_000
    assert resumed.counts.overview(now) == whole.counts.overview(now)
    assert Snapshot(tmp_path / "s.sqlite", "other.conversations").load() is None  # another topic's snapshot


def test_a_first_build_shows_the_conversations_it_has_folded_so_far(tmp_path: Path) -> None:
    """While a first build folds the log (no workers' live table to count from), the overview counts the
    conversations and endings its processes have committed to the snapshot so far; the history's counts come only
    with the build's end."""
    from handlers.console.live import LiveConsole
    from schemas.configs import ConfigDocument, FoldSettings

    drivers = _drivers()
    config, retry = drivers[0].config, drivers[0].retry_base_ms
    book = ConfigBook([ConfigDocument.of(config, FoldSettings(retry_base_ms=retry))])
    snapshot = Snapshot(tmp_path / "s.sqlite", "app.conversations")
    console = LiveConsole("127.0.0.1:1", "app", book, snapshot)
    builder = Snapshot(tmp_path / "s.sqlite", "app.conversations")  # a build process's own connection
    fold = OverviewFold(builder, book=book, retry_base_ms=retry)
    for offset, raw in _records(drivers):
        fold.feed(raw, offset, 0)
    builder.commit_states()
    now = T0 + 3_600_000
    console.building = True
    so_far = console.overview(now)
    assert so_far.conversations == 3 and so_far.endings == fold.counts.overview(now).endings
    assert not so_far.results and not so_far.handoff_reasons and so_far.replies_sent == 0
    console.building = False
    assert console.overview(now).conversations == 0  # the build's own counts replace these when it ends
    builder.close()
    snapshot.close()
