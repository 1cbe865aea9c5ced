"""The next offset each owned source partition must deliver (DESIGN §6 "No record skipped").

Faust and aiokafka can leave a partition's fetch position past records that were fetched but never handed to
an agent (docs/consumer-gaps.md). The worker therefore keeps, per owned (topic, partition), the offset it must
fold next and classifies every record it is handed:

- `next`: the expected offset; fold it.
- `duplicate`: below the expected offset, already folded by this process (or committed by the group): skip it.
- `gap`: above the expected offset; the records from `expected` up to it must be read and folded first.

On assignment a partition starts at the group's committed offset (or the log start when nothing was committed);
a partition this process kept through the rebalance starts at the lower of that and its own next offset.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Literal, NamedTuple

TP = tuple[str, int]


class Check(NamedTuple):
    verdict: Literal["next", "duplicate", "gap", "untracked"]
    expected: int | None


class OffsetTracker:
    """Expected next offsets of the partitions this process owns; pure bookkeeping, no I/O."""

    def __init__(self) -> None:
        self._next: dict[TP, int] = {}

    def assign(self, owned: Iterable[TP], starts: Mapping[TP, int]) -> None:
        """A rebalance ended with `owned`; `starts` are where the group would resume each partition.

        A partition kept from the previous assignment continues at the lower of its own next offset and the
        group's: Faust can commit past records no agent folded (it acks what it skips), so a group offset ahead of
        this process's is no proof those records were folded; folding one again is a no-op (every state records
        the offset it last applied), skipping one is a loss.
        """
        owned = set(owned)
        kept = {tp: n for tp, n in self._next.items() if tp in owned}
        self._next = {}
        for tp in owned:
            start = starts.get(tp)
            mine = kept.get(tp)
            if start is None and mine is None:
                continue
            self._next[tp] = min(n for n in (start, mine) if n is not None)

    def check(self, tp: TP, offset: int) -> Check:
        expected = self._next.get(tp)
        if expected is None:
            return Check("untracked", None)
        if offset == expected:
            return Check("next", expected)
        if offset < expected:
            return Check("duplicate", expected)
        return Check("gap", expected)

    def advance(self, tp: TP, offset: int) -> None:
        """`offset` was folded: the partition continues after it."""
        self._next[tp] = max(self._next.get(tp, 0), offset + 1)

    def expected(self, tp: TP) -> int | None:
        return self._next.get(tp)


class TailWatch:
    """Notices a partition whose consumer stopped short of records that exist (DESIGN §6 "No record skipped").

    A gap is normally revealed by the next record handed over; a record dropped at the *end* of a partition
    that then stays quiet is revealed by nothing. So, per partition, the worker compares the offset it expects
    with the broker's high watermark: when records exist past it and the expected offset has not moved for
    `stall_ms`, the consumer is sent back to it (a backlog being worked through keeps moving and is left alone).
    """

    def __init__(self, stall_ms: int = 10_000) -> None:
        self.stall_ms = stall_ms
        self._since: dict[TP, tuple[int, int]] = {}

    def stuck(self, tp: TP, expected: int | None, highwater: int | None, now_ms: int) -> bool:
        """Whether `tp` should be fetched again from `expected`; call about once a second per partition."""
        if expected is None or highwater is None or expected >= highwater:
            self._since.pop(tp, None)
            return False
        seen = self._since.get(tp)
        if seen is None or seen[0] != expected:
            self._since[tp] = (expected, now_ms)
            return False
        if now_ms - seen[1] < self.stall_ms:
            return False
        self._since[tp] = (expected, now_ms)  # once per stall period, not every tick
        return True
