"""Golden histories (DESIGN §8): recorded event logs still produce exactly their recorded commands and outcomes.

A failing history means the fold now decides an old log differently. If that change is deliberate, regenerate
the expected files (`python -m tests.golden.histories regenerate`) and review their diff like code.
"""

from __future__ import annotations

import pytest

from tests.golden.histories import History, histories, replay

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
