"""A what-if report gathered turn by turn, in bounded memory (DESIGN §8 "Readers at scale"). Pure.

A what-if of a year of history compares hundreds of thousands of turns. `TurnTally` compares each one as the
recorder closes it (`TurnRecorder(on_turn=...)`) and keeps only what the report needs: counts by status, the
live → candidate matrix, the distinct new System One questions (`--ask` needs them), the live versions seen (for
the configuration diff), and the rows of the first `cap` changed and `cap` unchanged turns; the others are
counted. Tallies of different partitions (other processes) merge into one.
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass, field
from datetime import UTC, datetime

from projections.whatif.record import RecordedTurn
from projections.whatif.replay import Answers, InputOpener, Question, TurnComparison, compare_turn
from projections.whatif.report import Report, config_diff
from schemas.config import RouterConfig
from schemas.configs import ConfigDocument

ROW_CAP = 1000
"""Rows listed of each kind (changed, unchanged); beyond that turns are counted, not listed."""


_DURATION = re.compile(r"([0-9]{1,9})([smhdw])")
_UNIT_S = {"s": 1, "m": 60, "h": 3600, "d": 86_400, "w": 604_800}
_CONVERSATION = re.compile(r"[1-9][0-9]{0,15}:[1-9][0-9]{0,15}")
DURATION_HINT = "a duration like 30m, 24h, 7d or 2w"
INSTANT_HINT = "an ISO 8601 time such as 2025-01-31T12:00:00Z"
CONVERSATION_HINT = "ACCOUNT:CONVERSATION, e.g. 1:42"


def duration_s(text: str) -> int:
    """`--since`: `30m`, `24h`, `7d`, `2w` → seconds; ValueError(DURATION_HINT) for anything else."""
    match = _DURATION.fullmatch(text.strip())
    if match is None:
        raise ValueError(DURATION_HINT)
    return int(match.group(1)) * _UNIT_S[match.group(2)]


def instant_ms(text: str) -> int:
    """`--from`: an ISO 8601 time, UTC when it names no offset → epoch milliseconds; ValueError(INSTANT_HINT)."""
    try:
        moment = datetime.fromisoformat(text.strip().replace("Z", "+00:00"))
    except ValueError:
        raise ValueError(INSTANT_HINT) from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return int(moment.timestamp() * 1000)


def is_conversation_key(text: str) -> bool:
    """`--conversation`: ACCOUNT:CONVERSATION."""
    return _CONVERSATION.fullmatch(text) is not None


@dataclass(frozen=True)
class Selection:
    """Which recorded turns a what-if compares: started at or after `from_ms`, of one account or conversation."""

    from_ms: int | None = None
    account_id: int | None = None
    key: str | None = None

    def __call__(self, turn: RecordedTurn) -> bool:
        return (
            (self.from_ms is None or turn.started_ms >= self.from_ms)
            and (self.account_id is None or turn.account_id == self.account_id)
            and (self.key is None or turn.key == self.key)
        )


@dataclass
class TurnTally:
    """Each selected turn compared under `candidate` as it ends; the report's counts and capped rows kept."""

    candidate: RouterConfig
    answers: Answers = field(default_factory=dict)
    selection: Selection = field(default_factory=Selection)
    cap: int = ROW_CAP
    counts: Counter[str] = field(default_factory=Counter)
    cells: Counter[tuple[str, str]] = field(default_factory=Counter)
    rows: list[TurnComparison] = field(default_factory=list)
    bank: dict[str, Question] = field(default_factory=dict)
    lives: dict[str, ConfigDocument] = field(default_factory=dict)
    undecided: int = 0
    unlisted: int = 0
    kept: Counter[bool] = field(default_factory=Counter)  # rows listed: unchanged (True) and the others
    opener: InputOpener | None = field(default=None, repr=False, compare=False)  # set in each shard, never pickled

    def __getstate__(self) -> dict[str, object]:
        """Pickled without its opener: it holds the data keys its process opened, which never leave it (and do
        not pickle: a shard's tally goes back to the parent of `whatif --jobs N`)."""
        return {**self.__dict__, "opener": None}

    def __call__(self, turn: RecordedTurn) -> None:
        if self.selection(turn):
            self.add(turn.live, compare_turn(turn, self.candidate, self.answers, self.opener))

    def add(self, live: ConfigDocument, compared: TurnComparison) -> None:
        self.counts[compared.status] += 1
        target = compared.candidate.outcome if compared.candidate is not None else "needs a new decision"
        self.cells[(compared.live.outcome, target)] += 1
        if compared.status == "needs_decision" and compared.question is not None:
            self.bank.setdefault(compared.question.digest, compared.question)
        self.lives.setdefault(live.version, live)
        self._keep(compared)

    def _keep(self, row: TurnComparison) -> None:
        unchanged = row.status == "unchanged"
        if self.kept[unchanged] < self.cap:
            self.kept[unchanged] += 1
            self.rows.append(row)
        else:
            self.unlisted += 1

    def merge(self, other: TurnTally) -> None:
        """Add another partition's tally (its rows after these, up to the caps)."""
        self.counts.update(other.counts)
        self.cells.update(other.cells)
        for digest, question in other.bank.items():
            self.bank.setdefault(digest, question)
        for version, document in other.lives.items():
            self.lives.setdefault(version, document)
        self.undecided += other.undecided
        self.unlisted += other.unlisted
        for row in other.rows:
            self._keep(row)

    def report(self, candidate_version: str) -> Report:
        diffs = {v: config_diff(doc.config, self.candidate) for v, doc in sorted(self.lives.items())}
        return Report(
            candidate_version,
            sorted(self.rows, key=lambda t: t.at_ms),
            diffs,
            undecided=self.undecided,
            counts=dict(self.counts),
            cells=dict(self.cells),
            bank=dict(self.bank),
            unlisted=self.unlisted,
        )
