"""`audit --verify`: replayed states against the live table, partition by partition (DESIGN §8). Pure.

Any difference is a bug and is reported by key. A verify of a year of history compares every conversation but
keeps only what the report needs: the counts, and the first `cap` differing keys of each partition (the rest are
counted), so its memory does not grow with the number of conversations.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from schemas.state import ConversationState

ROW_CAP = 1000
"""Differences listed by key; beyond that they are counted."""


def diff_states(replayed: Mapping[str, ConversationState], live: Mapping[str, ConversationState]) -> list[str]:
    """Keys whose replayed and live states differ, each with a short description."""
    problems = []
    for key in sorted(set(replayed) | set(live)):
        mine, theirs = replayed.get(key), live.get(key)
        if mine is None or theirs is None:
            problems.append(f"{key}: {'only in the live table' if mine is None else 'missing from the live table'}")
        else:
            if theirs.first_offset < 0:  # written by a worker from before the start was recorded: not a difference
                mine = mine.evolve(first_offset=theirs.first_offset, first_version=theirs.first_version)
            if mine != theirs:
                names = [f for f in type(mine).model_fields if getattr(mine, f) != getattr(theirs, f)]
                fields = [_field(name, mine, theirs) for name in names]
                problems.append(f"{key}: differs in {', '.join(fields)}")
    return problems


_POSITIONS = frozenset({"offset", "first_offset"})
"""Fields shown with both values: log positions, which say where to look (and hold nothing private)."""


def _field(name: str, replayed: ConversationState, live: ConversationState) -> str:
    if name in _POSITIONS:
        return f"{name} (replayed {getattr(replayed, name)}, live {getattr(live, name)})"
    return name


@dataclass
class Verified:
    """What a verify of some partitions found: conversations replayed, undecodable records, differences."""

    conversations: int = 0
    undecodable: int = 0
    differences: int = 0
    rows: list[str] = field(default_factory=list)
    cap: int = ROW_CAP

    def add(self, problems: Iterable[str]) -> None:
        for line in problems:
            self.differences += 1
            if len(self.rows) < self.cap:
                self.rows.append(line)

    def merge(self, other: Verified) -> None:
        self.conversations += other.conversations
        self.undecodable += other.undecodable
        self.differences += other.differences
        self.rows = sorted([*self.rows, *other.rows], key=_row_order)[: self.cap]

    @property
    def unlisted(self) -> int:
        return self.differences - len(self.rows)

    def lines(self) -> list[str]:
        """The report: each listed difference, then how many more there are, then the totals."""
        listed = sorted(self.rows, key=_row_order)
        if self.unlisted:
            listed.append(f"… and {self.unlisted} more differences (only the first {self.cap} are listed)")
        summary = (
            f"{self.conversations} conversations replayed, {self.undecodable} undecodable records, "
            f"{self.differences} differences"
        )
        return [*listed, summary]


def _row_order(line: str) -> tuple[int, int, str]:
    key = line.split(": ", 1)[0]
    account, _, conversation = key.partition(":")
    if account.isdigit() and conversation.isdigit():
        return (int(account), int(conversation), line)
    return (0, 0, line)
