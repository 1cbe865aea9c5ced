"""Golden histories (DESIGN §8): recorded event logs still produce exactly their recorded commands and outcomes.

A failing history means the fold now decides an old log differently. If that change is deliberate, regenerate
the expected files (`python -m tests.golden.histories regenerate`) and review their diff like code. The recorded
logs themselves are never regenerated (`tests/golden/histories.py`), and the values stored data is keyed by are
pinned as literals below: a change to one breaks what earlier releases stored.
"""

from __future__ import annotations

import asyncio
import shutil
from pathlib import Path
from typing import Any

import pytest

from schemas import codec
from schemas.configs import FoldSettings, config_version
from schemas.keys import partition_for, route_command_id, sweep_command_id
from schemas.records import EffectCommand, GetConversation, ReadTurn
from tests.golden.histories import (
    MANIFEST,
    ROOT,
    History,
    book_of,
    digests,
    histories,
    read_manifest,
    record,
    regenerate,
    replay,
    write_expected,
)
from tests.unit.test_fold_driver import make_config

HISTORIES = histories()


def test_the_recorded_histories_cover_the_main_flows() -> None:
    outcomes = {outcome["result"] for history in HISTORIES for row in history.expected() for outcome in row["outcomes"]}
    ops = {c["params"]["op"] for history in HISTORIES for row in history.expected() for c in row["commands"]}
    assert len(HISTORIES) >= 19
    assert {"assigned", "ended", "handed_off", "nothing", "retry"} <= outcomes
    assert {"decide", "create_message", "toggle_status", "assign", "set_labels", "read_turn"} <= ops


@pytest.mark.parametrize("history", HISTORIES, ids=[f"{h.directory.name}/{h.name}" for h in HISTORIES])
def test_a_recorded_history_is_decided_the_same_way(history: History) -> None:
    expected = history.expected()
    produced = replay(history)
    assert len(produced) == len(expected)
    for want, got in zip(expected, produced, strict=True):
        assert got == want, f"{history.name} at offset {want['offset']}"


def test_the_config_change_history_decides_by_the_version_in_force_at_each_offset() -> None:
    """Spam is resolved before the change and snoozed after it; sales lost its owner, so it is handed off."""
    directory = ROOT / "config-change"
    book = book_of(directory)
    assert len(book) == 2
    first, second = (d.version for d in book.documents())
    ended: dict[str, tuple[str | None, str]] = {}
    for history in (h for h in HISTORIES if h.directory == directory):
        version = None
        for row in history.expected():
            version = row.get("version", version)
            for outcome in row["outcomes"]:
                if outcome["result"] in ("ended", "assigned", "handed_off"):
                    ended[history.name] = (version, outcome.get("status") or outcome.get("reason") or "assigned")
    assert (first, "resolved") in ended.values()
    assert (second, "snoozed") in ended.values()
    assert (second, "unclear_owner") in ended.values()  # the sales question, with no sales owner any more
    assert (first, "handoff_mode") in ended.values()


# --- the recorded logs are an earlier release's bytes ---------------------------------------------------------


def test_the_recorded_logs_are_the_bytes_an_earlier_release_wrote() -> None:
    """Recorded logs are what an earlier release wrote: never regenerate them; a new record shape reads old records
    through an upcaster (`schemas.codec.UPCASTERS`). `MANIFEST.sha256` seals every recorded file (events,
    `configs.jsonl`, `config.json`, `meta.json`); a new history is added with `python -m tests.golden.histories
    seal`, which never changes an entry."""
    sealed, found = read_manifest(), digests()
    missing = sorted(sealed.keys() - found.keys())
    changed = sorted(path for path in sealed.keys() & found.keys() if sealed[path] != found[path])
    unsealed = sorted(found.keys() - sealed.keys())
    assert not missing, f"recorded logs gone: {missing} (restore them from git; never delete a recorded log)"
    assert not changed, f"recorded logs changed: {changed} (restore them from git; old shapes need an upcaster)"
    assert not unsealed, f"recorded files not in {MANIFEST}: {unsealed} (python -m tests.golden.histories seal)"
    assert list(sealed) == sorted(sealed) and len(sealed) >= 31  # demo/ and config-change/: 31 files


def test_regenerate_writes_only_the_expected_files(tmp_path: Path) -> None:
    copy = tmp_path / "golden"
    shutil.copytree(ROOT, copy, ignore=shutil.ignore_patterns("*.py", "__pycache__"))
    kept = [p for p in copy.rglob("*") if p.is_file() and not p.name.endswith(".expected.jsonl")]
    before = {p: p.stat().st_mtime_ns for p in kept}
    for expected in copy.rglob("*.expected.jsonl"):
        expected.write_text("")
    assert regenerate(copy) == len(HISTORIES)
    assert digests(copy) == read_manifest()
    assert {p: p.stat().st_mtime_ns for p in before} == before
    for history in histories(copy):
        assert history.expected_path.read_bytes() == (ROOT / history.expected_path.relative_to(copy)).read_bytes()


@pytest.mark.parametrize("name", ["1-1.events.jsonl", "configs.jsonl", "config.json", "meta.json", "1-1.jsonl"])
def test_nothing_but_an_expected_file_is_ever_written(tmp_path: Path, name: str) -> None:
    with pytest.raises(ValueError, match="never rewritten"):
        write_expected(tmp_path / name, "")
    assert not (tmp_path / name).exists()


def test_a_recorded_history_is_never_recorded_again() -> None:
    with pytest.raises(SystemExit, match="never re-record"):
        asyncio.run(record("127.0.0.1:9", "golden-none", ROOT / "demo"))  # refused before any connection


def test_the_histories_are_decoded_by_the_workers_codec(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each record goes from its stored bytes through `schemas.codec`, upcasters included, as on the worker."""
    seen: list[dict[str, Any]] = []

    def watch(record: dict[str, Any]) -> dict[str, Any]:
        seen.append(record)
        return record

    monkeypatch.setitem(codec.UPCASTERS, "timer_fired", watch)
    history = next(h for h in HISTORIES if b'"timer_fired"' in h.events_path.read_bytes())
    timers = [e for _, e in history.events() if e.type == "timer_fired"]
    assert timers and len(seen) == len(timers)


# --- golden values: what stored data is keyed by ------------------------------------------------------------


def test_the_stored_configuration_versions_are_what_their_documents_hash_to() -> None:
    """`config apply` of the same file after an upgrade must give the version an earlier release stored (else
    every partition gets a marker for a change that is none). Pinned by the documents on the recorded `configs`
    topic and by one literal; a change here needs a release note, never a new literal."""
    for directory in sorted({h.directory for h in HISTORIES if h.versioned}):
        for document in book_of(directory).documents():
            assert config_version(document.config, document.fold) == document.version, directory.name
    assert config_version(make_config(), FoldSettings()) == "e7289fb3bf370244"
    assert config_version(make_config(), FoldSettings(retry_base_ms=500)) == "1c61fbd42b93fb6e"


def test_command_ids_digests_and_partitions_are_the_ones_earlier_releases_stored() -> None:
    """Outcomes on the kept `conversations` and `sweeps` topics name their command by id, a chained read also by
    the command copy's digest (`EffectOutcome.answers`), and every table is partitioned by key: after an
    upgrade the fold must rebuild the same ids and digests, and a key must stay in its partition."""
    assert route_command_id("1:42", 3, 1) == "1:42:3:1"
    assert sweep_command_id("1:open", 4) == "1:open:4"
    at = 1_700_000_000_000
    read = EffectCommand(at_ms=at, key="1:42", account_id=1, command_id="1:42:3:1", params=GetConversation())
    turn = EffectCommand(at_ms=at, key="1:42", account_id=1, command_id="1:42:3:3", params=ReadTurn())
    assert read.digest() == "fdd5decbde50e384b7dd5c41508fe7e6"
    assert turn.digest() == "b1b71309302764fc126eb5b3f2d668e3"
    assert [partition_for(key, 12) for key in ("1:42", "2:7", "1:open", "config")] == [0, 7, 11, 6]
