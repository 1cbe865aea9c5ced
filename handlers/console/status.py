"""What the console knows about the world outside the log: its own replay, the workers' lag and stuck lists."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class TailStatus:
    """The console's own replay of `<app>.conversations`."""

    topic: str
    records: int = 0
    behind: int | None = None  # records on the topic not replayed yet (None until measured)
    caught_up: bool = False
    error: str | None = None
    partial: str | None = None  # the log lost records from its head: which, how many, from when (None: whole)
    partial_since: str | None = None  # from when every partition's history is kept


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
