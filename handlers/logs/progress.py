"""Progress of a long read of the log on stderr: records/s, ETA, and where each partition is (DESIGN §8).

A read of a year of history takes minutes; an operator must see that it moves and when it will end. On a
terminal a live bar (tqdm) shows the total, the rate, the ETA and the partitions being read; elsewhere (a log
file, CI) one line every `every_s` once the read has lasted `after_s`, so short reads stay quiet and a test's
stderr is not flooded. Only counts are shown, never a record.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Mapping
from typing import IO, Any

from tqdm import tqdm

AFTER_S = 5.0
EVERY_S = 10.0


class ReadProgress:
    """Counts records read per partition against the planned `totals` and shows them (see the module)."""

    def __init__(
        self,
        what: str,
        totals: Mapping[int, int],
        *,
        stream: IO[str] | None = None,
        clock: Callable[[], float] = time.monotonic,
        after_s: float = AFTER_S,
        every_s: float = EVERY_S,
        live: bool | None = None,
    ) -> None:
        self.what = what
        self.totals = dict(totals)
        self.done: dict[int, int] = dict.fromkeys(self.totals, 0)
        self.stream = stream if stream is not None else sys.stderr
        self.clock = clock
        self.started = clock()
        self.after_s, self.every_s = after_s, every_s
        self.shown: float | None = None  # when the last line was printed
        self.live = self.stream.isatty() if live is None else live
        self._bar: tqdm[Any] | None = None
        if self.live:
            self._bar = tqdm(
                total=sum(self.totals.values()),
                desc=what,
                unit=" rec",
                unit_scale=True,
                file=self.stream,
                mininterval=0.5,
                leave=False,
            )

    @property
    def count(self) -> int:
        return sum(self.done.values())

    def __call__(self, partition: int, records: int) -> None:
        self.done[partition] = self.done.get(partition, 0) + records
        if self._bar is not None:
            self._bar.update(records)
            self._bar.set_postfix_str(self._partitions(), refresh=False)
            return
        now = self.clock()
        if now - self.started >= self.after_s and (self.shown is None or now - self.shown >= self.every_s):
            self.shown = now
            print(self.line(now), file=self.stream, flush=True)

    def line(self, now: float | None = None) -> str:
        """e.g. `replay state: 400,000/1,000,000 records (40%), 52,000 records/s, ETA 12 s; partitions 3 62%, 4/12
        done`."""
        elapsed = max((now if now is not None else self.clock()) - self.started, 1e-6)
        total, count = sum(self.totals.values()), self.count
        rate = count / elapsed
        eta = f", ETA {max(total - count, 0) / rate:,.0f} s" if rate > 0 and total else ""
        share = f" ({100 * count / total:.0f}%)" if total else ""
        return (
            f"{self.what}: {count:,}/{total:,} records{share}, {rate:,.0f} records/s{eta}; "
            f"partitions {self._partitions()}"
        )

    def _partitions(self) -> str:
        """The partitions started and not finished, and how many are done."""
        moving = [
            f"{p} {100 * self.done[p] / t:.0f}%" for p, t in sorted(self.totals.items()) if 0 < self.done.get(p, 0) < t
        ]
        finished = sum(1 for p, t in self.totals.items() if self.done.get(p, 0) >= t)
        return ", ".join([*moving, f"{finished}/{len(self.totals)} done"])

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
            self._bar = None
        elif self.clock() - self.started >= self.after_s:
            print(self.line(), file=self.stream, flush=True)
