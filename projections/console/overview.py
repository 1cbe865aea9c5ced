"""The console's overview, folded from the whole log while keeping per conversation only its state (DESIGN §11).

The overview (turns per hour by outcome, handoff reasons, replies, stuck conversations, conversations by how
they ended) needs every record folded, but not every conversation's timeline. `OverviewCounts` is those counts,
shared by the in-memory `ConsoleModel` and by `OverviewFold`, which folds each record with the worker's fold on
the conversation's state from a `SummaryStore` (a dictionary in tests, the console's on-disk snapshot in
production: handlers/console/snapshot.py), so the console's memory does not grow with the history. Pure: no I/O,
no clock ("now" is an argument of `overview`).
"""

from __future__ import annotations

from collections import Counter, deque
from dataclasses import dataclass, field
from typing import Any, Protocol

from projections.fold import DEFAULT_RETRY_BASE_MS, fold_parts
from projections.guard import STUCK_AFTER_FAILURES
from projections.logs.scan import conversation_scan
from projections.logs.timeline import QUIET_RESULTS
from schemas.config import RouterConfig
from schemas.configs import ConfigBook, ConfigDocument, FoldSettings
from schemas.records import EffectOutcome, TurnOutcome
from schemas.state import ConversationState

HOUR_MS = 3_600_000
RECENT = 50


@dataclass(frozen=True)
class HourBar:
    """Turns that ended in one hour (UTC), by result."""

    start_ms: int
    counts: dict[str, int]

    @property
    def total(self) -> int:
        return sum(self.counts.values())


@dataclass(frozen=True)
class Overview:
    """What the console's front page shows, as of `now_ms` (given by the caller: the model reads no clock)."""

    now_ms: int
    conversations: int
    records: int
    undecodable: int
    endings: dict[str, int]  # conversations by the result of their latest ending
    results: dict[str, int]  # every turn outcome, by result
    hours: list[HourBar]
    handoff_reasons: list[tuple[str, int]]
    replies_sent: int
    replies_unconfirmed: int
    recent: list[TurnOutcome]
    stuck: dict[str, str]  # conversations whose runs keep failing, with the last failure's reason


@dataclass(frozen=True)
class Ending:
    """How a conversation ended so far: its last turn that did something, else its last turn (`loud` = the former)."""

    result: str | None = None
    loud: bool = False

    def after(self, outcome: TurnOutcome) -> Ending:
        if outcome.result not in QUIET_RESULTS:
            return Ending(outcome.result, True)
        return self if self.loud else Ending(outcome.result, False)


@dataclass
class OverviewCounts:
    """The overview's counts over every record folded so far."""

    records: int = 0
    undecodable: int = 0
    conversations: int = 0
    replies_sent: int = 0
    results: Counter[str] = field(default_factory=Counter)
    by_hour: dict[int, Counter[str]] = field(default_factory=dict)
    handoff_reasons: Counter[str] = field(default_factory=Counter)
    recent: deque[TurnOutcome] = field(default_factory=lambda: deque(maxlen=RECENT))
    stuck: dict[str, str] = field(default_factory=dict)
    ending_counts: Counter[str] = field(default_factory=Counter)

    def count(self, outcome: TurnOutcome) -> None:
        self.results[outcome.result] += 1
        hour = outcome.at_ms - outcome.at_ms % HOUR_MS
        self.by_hour.setdefault(hour, Counter())[outcome.result] += 1
        if outcome.result == "handed_off":
            self.handoff_reasons[outcome.reason or "unspecified"] += 1
        if outcome.result != "nothing":  # mostly the router's own status changes echoed back: counted, not listed
            self.recent.append(outcome)
        if outcome.result == "retry" and (outcome.failures or 0) >= STUCK_AFTER_FAILURES:
            self.stuck[outcome.key] = outcome.reason or "unspecified"
        elif outcome.result != "deferred":
            self.stuck.pop(outcome.key, None)

    def ended(self, before: str | None, now: str | None) -> None:
        """A conversation's ending changed from `before` to `now` (the overview must not scan them all)."""
        if now == before:
            return
        if before is not None:
            self.ending_counts[before] -= 1
        if now is not None:
            self.ending_counts[now] += 1

    def overview(self, now_ms: int, *, hours: int = 24, recent: int = 20) -> Overview:
        current = now_ms - now_ms % HOUR_MS
        bars = [
            HourBar(start, dict(self.by_hour.get(start, Counter())))
            for start in range(current - (hours - 1) * HOUR_MS, current + 1, HOUR_MS)
        ]
        return Overview(
            now_ms=now_ms,
            conversations=self.conversations,
            records=self.records,
            undecodable=self.undecodable,
            endings={result: n for result, n in self.ending_counts.items() if n > 0},
            results=dict(self.results),
            hours=bars,
            handoff_reasons=self.handoff_reasons.most_common(),
            replies_sent=self.replies_sent,
            replies_unconfirmed=self.handoff_reasons.get("reply_unconfirmed", 0),
            recent=sorted(self.recent, key=lambda t: t.at_ms, reverse=True)[:recent],
            stuck=dict(self.stuck),
        )

    def merge(self, other: OverviewCounts) -> None:
        """Add another partition's counts (a conversation lives in one partition, so nothing is counted twice)."""
        self.records += other.records
        self.undecodable += other.undecodable
        self.conversations += other.conversations
        self.replies_sent += other.replies_sent
        self.results.update(other.results)
        for hour, counts in other.by_hour.items():
            self.by_hour.setdefault(hour, Counter()).update(counts)
        self.handoff_reasons.update(other.handoff_reasons)
        recent = sorted([*self.recent, *other.recent], key=lambda o: o.at_ms)
        self.recent = deque(recent, maxlen=self.recent.maxlen)
        self.stuck.update(other.stuck)
        self.ending_counts.update(other.ending_counts)

    def to_json(self) -> dict[str, Any]:
        """The counts as JSON (the console's snapshot keeps them)."""
        return {
            "records": self.records,
            "undecodable": self.undecodable,
            "conversations": self.conversations,
            "replies_sent": self.replies_sent,
            "results": dict(self.results),
            "by_hour": {str(h): dict(c) for h, c in self.by_hour.items()},
            "handoff_reasons": dict(self.handoff_reasons),
            "recent": [o.model_dump(mode="json") for o in self.recent],
            "stuck": dict(self.stuck),
            "ending_counts": dict(self.ending_counts),
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> OverviewCounts:
        return cls(
            records=data["records"],
            undecodable=data["undecodable"],
            conversations=data["conversations"],
            replies_sent=data["replies_sent"],
            results=Counter(data["results"]),
            by_hour={int(h): Counter(c) for h, c in data["by_hour"].items()},
            handoff_reasons=Counter(data["handoff_reasons"]),
            recent=deque((TurnOutcome.model_validate(o) for o in data["recent"]), maxlen=RECENT),
            stuck=dict(data["stuck"]),
            ending_counts=Counter(data["ending_counts"]),
        )


def replied(before: ConversationState, event: Any) -> bool:
    """Whether this part of a record is the confirmed outcome of the canned reply the run waited for."""
    run = before.run
    return (
        isinstance(event, EffectOutcome)
        and event.op == "create_message"
        and event.error is None
        and run is not None
        and run.pending is not None
        and run.pending.command_id == event.command_id
    )


@dataclass(frozen=True)
class ConversationSummary:
    """What the overview keeps of one conversation: its fold state and its ending so far."""

    state: ConversationState
    ending: Ending = Ending()


class SummaryStore(Protocol):
    """Where `OverviewFold` keeps each conversation's summary (get returns None for a conversation not seen)."""

    def get(self, key: str) -> ConversationSummary | None: ...

    def put(self, key: str, partition: int, summary: ConversationSummary) -> None: ...


class MemoryStore(dict[str, ConversationSummary]):
    """A `SummaryStore` in memory (tests, small logs)."""

    def put(self, key: str, partition: int, summary: ConversationSummary) -> None:
        self[key] = summary


class OverviewFold:
    """The overview of `<app>.conversations`, fed record by record in offset order (markers switch versions as
    the worker does), each conversation's state in `store`."""

    def __init__(
        self,
        store: SummaryStore,
        *,
        book: ConfigBook,
        config: RouterConfig | None = None,
        retry_base_ms: int = DEFAULT_RETRY_BASE_MS,
        counts: OverviewCounts | None = None,
    ) -> None:
        if config is None and not len(book):
            raise ValueError("the console needs a configuration or the applied configuration versions")
        self.store = store
        self.scan = conversation_scan(book)
        self.fallback = ConfigDocument.of(config, FoldSettings(retry_base_ms=retry_base_ms)) if config else None
        self.counts = counts or OverviewCounts()

    def in_force(self, partition: int) -> ConfigDocument:
        document = self.scan.document(partition)
        if document is not None:
            return document
        assert self.fallback is not None
        return self.fallback

    def feed(self, value: bytes | None, offset: int, partition: int) -> str | None:
        """Fold one record; returns the conversation key it changed, if any."""
        undecodable = self.scan.undecodable
        event = self.scan.event(value, partition)
        if event is None:
            if self.scan.undecodable > undecodable:
                self.counts.records += 1
                self.counts.undecodable += 1
            return None
        self.counts.records += 1
        summary = self.store.get(event.key)
        if summary is None:
            summary = ConversationSummary(ConversationState())
            self.counts.conversations += 1
        state, ending = summary.state, summary.ending
        if offset <= state.offset:
            return None
        document = self.in_force(partition)
        version = document.version if len(self.scan.book) else None  # a log from before versions: none recorded
        parts = fold_parts(
            state, event, offset, document.config, retry_base_ms=document.fold.retry_base_ms, config_version=version
        )
        for part, result in parts:
            if replied(state, part):
                self.counts.replies_sent += 1
            state = result.state
            for outcome in result.outcomes:
                self.counts.count(outcome)
                after = ending.after(outcome)
                self.counts.ended(ending.result, after.result)
                ending = after
        self.store.put(event.key, partition, ConversationSummary(state, ending))
        return event.key
