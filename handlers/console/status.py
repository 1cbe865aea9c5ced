"""What the console knows about the world outside the log: its own replay, the workers' lag and stuck lists."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class TailStatus:
    """The console's own replay of `<app>.conversations`.

    Until it has read the log to its end (`caught_up`) the console is catching up: its pages answer at once with
    what it has folded so far, and say so (`step`: what it is doing now, `records` and `behind`: how far it is)."""

    topic: str
    records: int = 0
    behind: int | None = None  # records on the topic not replayed yet (None until measured)
    caught_up: bool = False
    error: str | None = None
    partial: str | None = None  # the log lost records from its head: which, how many, from when (None: whole)
    partial_since: str | None = None  # from when every partition's history is kept
    step: str = "starting"  # what the console does while it catches up (shown with its progress)

    @property
    def catching_up(self) -> bool:
        return not self.caught_up

    def progress(self) -> dict[str, Any]:
        """How far the console is, for the API's answers (`catching_up` until it has read the log to its end)."""
        return {
            "catching_up": self.catching_up,
            "step": None if self.caught_up else self.step,
            "records": self.records,
            "behind": self.behind,
            "error": self.error,
        }


@dataclass
class WorkerStuck:
    """One worker's `GET /stuck` answer (conversation key -> reason), or why it could not be read."""

    url: str
    stuck: dict[str, str] | None = None
    error: str | None = None
    throttle: dict[str, float] | None = None  # what Chatwoot's rate limit cost the worker (its /stuck `throttle`)


@dataclass
class ConsoleStatus:
    tail: TailStatus
    group: str
    lag: dict[str, int] | None = None  # topic -> records the workers' group has not committed yet
    lag_error: str | None = None
    workers: list[WorkerStuck] = field(default_factory=list)
