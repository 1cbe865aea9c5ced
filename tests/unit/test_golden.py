"""Golden histories (DESIGN §8): recorded event logs still produce exactly their recorded commands and outcomes.

A failing history means the fold now decides an old log differently. If that change is deliberate, regenerate
the expected files (`python -m tests.golden.histories regenerate`) and review their diff like code.
"""

from __future__ import annotations

import pytest

from tests.golden.histories import ROOT, History, book_of, histories, replay

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
