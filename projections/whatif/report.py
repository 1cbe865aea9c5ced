"""What-if's report: the turns compared, the configuration diff, totals and the rows kept."""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from projections.whatif.record import RecordedTurn
from projections.whatif.replay import Answers, Question, Status, TurnComparison, compare_turn
from schemas.config import RouterConfig

# --- the report ----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Change:
    path: str
    live: Any
    candidate: Any


def _flatten(value: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(value, dict) and value:
        flat: dict[str, Any] = {}
        for k, v in value.items():
            flat.update(_flatten(v, f"{prefix}.{k}" if prefix else str(k)))
        return flat
    return {prefix: value}


_ABSENT = object()


def config_diff(live: RouterConfig, candidate: RouterConfig) -> list[Change]:
    """Key paths (behavior.md §2.2 names) whose values differ; a missing side is None with `absent`."""
    a = _flatten(live.model_dump(mode="json", by_alias=True, exclude_none=True))
    b = _flatten(candidate.model_dump(mode="json", by_alias=True, exclude_none=True))
    changes = []
    for path in sorted(set(a) | set(b)):
        before, after = a.get(path, _ABSENT), b.get(path, _ABSENT)
        if before != after:
            changes.append(Change(path, None if before is _ABSENT else before, None if after is _ABSENT else after))
    return changes


@dataclass
class Report:
    """Everything `whatif` prints: totals, the live → candidate matrix, the changed turns and the diffs."""

    candidate_version: str
    turns: list[TurnComparison]
    diffs: dict[str, list[Change]]  # live version -> its changes to the candidate
    undecided: int = 0
    asked: int = 0
    cached: int = 0
    ask_failures: int = 0
    # over every turn compared, when `turns` lists only some of them (projections/whatif/tally.py)
    counts: dict[str, int] | None = None
    cells: dict[tuple[str, str], int] | None = None
    bank: dict[str, Question] | None = None
    unlisted: int = 0

    def count(self, status: Status) -> int:
        if self.counts is not None:
            return self.counts.get(status, 0)
        return sum(1 for t in self.turns if t.status == status)

    @property
    def compared(self) -> int:
        return sum(self.counts.values()) if self.counts is not None else len(self.turns)

    @property
    def totals(self) -> dict[str, int]:
        return {
            "compared": self.compared,
            "unchanged": self.count("unchanged"),
            "changed": self.count("changed"),
            "needs_new_decision": self.count("needs_decision"),
        }

    @property
    def matrix(self) -> dict[tuple[str, str], int]:
        """(live outcome, candidate outcome) -> turns, in a stable order."""
        if self.cells is not None:
            return dict(sorted(self.cells.items()))
        cells: dict[tuple[str, str], int] = {}
        for t in self.turns:
            target = t.candidate.outcome if t.candidate is not None else "needs a new decision"
            cells[(t.live.outcome, target)] = cells.get((t.live.outcome, target), 0) + 1
        return dict(sorted(cells.items()))

    def changed(self) -> list[TurnComparison]:
        """The changed turns listed (`changed_count` says how many there are)."""
        return [t for t in self.turns if t.status != "unchanged"]

    @property
    def changed_count(self) -> int:
        return self.count("changed") + self.count("needs_decision")

    def questions(self) -> list[Question]:
        """The distinct new questions the candidate would put to System One."""
        if self.bank is not None:
            return list(self.bank.values())
        seen: dict[str, Question] = {}
        for t in self.turns:
            if t.status == "needs_decision" and t.question is not None:
                seen.setdefault(t.question.digest, t.question)
        return list(seen.values())

    def as_json(self) -> dict[str, Any]:
        return {
            "candidate_version": self.candidate_version,
            "totals": self.totals,
            "undecided_runs": self.undecided,
            "ask": {"asked": self.asked, "cached": self.cached, "failed": self.ask_failures},
            "matrix": [{"live": live, "candidate": cand, "turns": n} for (live, cand), n in self.matrix.items()],
            "turns": [t.as_json() for t in self.turns],
            "turns_not_listed": self.unlisted,
            "config_diff": {
                version: [{"path": c.path, "live": c.live, "candidate": c.candidate} for c in changes]
                for version, changes in self.diffs.items()
            },
        }


def build_report(
    turns: Iterable[RecordedTurn],
    candidate: RouterConfig,
    candidate_version: str,
    *,
    answers: Answers | None = None,
    undecided: int = 0,
) -> Report:
    """Compare every turn and gather the report; `answers` are System One's answers to new questions."""
    recorded = list(turns)
    compared = [compare_turn(t, candidate, answers) for t in recorded]
    lives = {t.live.version: t.live for t in recorded}
    diffs = {version: config_diff(doc.config, candidate) for version, doc in sorted(lives.items())}
    return Report(candidate_version, compared, diffs, undecided=undecided)


def select(
    turns: Iterable[RecordedTurn],
    *,
    from_ms: int | None = None,
    account_id: int | None = None,
    key: str | None = None,
) -> list[RecordedTurn]:
    """The turns started at or after `from_ms`, of one account or one conversation."""
    return [
        t
        for t in turns
        if (from_ms is None or t.started_ms >= from_ms)
        and (account_id is None or t.account_id == account_id)
        and (key is None or t.key == key)
    ]


def dumps(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False)
