"""The sweep fold (behavior.md §5): pages, selection, cursor, backoff."""

from __future__ import annotations

from projections.sweep import fold_sweep
from schemas.records import (
    ConversationsPageResult,
    EffectError,
    EffectOutcome,
    SweepRequested,
    SweepRow,
    TimerFired,
)
from schemas.state import SweepState
from tests.unit.test_fold_driver import BOT, T0, make_config

CONFIG = make_config()


class Sweep:
    def __init__(self, status: str = "pending") -> None:
        self.key = f"1:{status}"
        self.status = status
        self.state = SweepState()
        self.offset = 0
        self.found: list[int] = []
        self.commands: list = []  # type: ignore[type-arg]
        self.wakeup: int | None = None
        self.now = T0

    def send(self, event) -> None:  # type: ignore[no-untyped-def]
        self.offset += 1
        result = fold_sweep(self.state, event, self.offset, CONFIG, retry_base_ms=5000)
        self.state, self.wakeup = result.state, result.wakeup_ms
        self.found += [f.conversation_id for f in result.found]
        self.commands += result.commands

    def request(self) -> None:
        self.send(SweepRequested(at_ms=self.now, account_id=1, status=self.status))  # type: ignore[arg-type]

    def answer(self, rows: list[SweepRow] | None, *, error: bool = False) -> None:
        command = self.state.pending
        assert command is not None
        self.send(
            EffectOutcome(
                at_ms=self.now,
                key=self.key,
                account_id=1,
                command_id=command.command_id,
                op="list_conversations",
                result=None if error else ConversationsPageResult(rows=tuple(rows or ())),
                error=EffectError(kind="failed", status=502) if error else None,
                requests=1,
            )
        )

    def pages(self) -> list[int]:
        return [c.params.page for c in self.commands]


def test_pending_pass_selects_every_row_and_ends_on_an_empty_page() -> None:
    s = Sweep()
    s.request()
    s.answer([SweepRow(id=1), SweepRow(id=2, assignee_type="User", assignee_id=3)])
    s.answer([SweepRow(id=3)])  # a short page does not end the pass
    s.answer([])
    assert s.found == [1, 2, 3]
    assert s.pages() == [1, 2, 3]
    assert s.state.job is None and s.state.cursor is None and s.wakeup is None


def test_open_pass_selects_only_rows_still_assigned_to_our_bot() -> None:
    s = Sweep("open")
    s.request()
    s.answer(
        [
            SweepRow(id=1, assignee_type="AgentBot", assignee_id=BOT),
            SweepRow(id=2, assignee_type="AgentBot", assignee_id=BOT + 1),
            SweepRow(id=3, assignee_type="User", assignee_id=BOT),
        ]
    )
    assert s.found == [1]
    assert s.commands[-1].params.model_dump() == {"op": "list_conversations", "status": "open", "page": 2}


def test_failed_page_is_retried_with_backoff_on_the_same_page() -> None:
    s = Sweep()
    s.request()
    s.answer([SweepRow(id=1)])
    s.answer(None, error=True)
    assert s.wakeup == s.now + 5000
    s.request()  # a request during backoff keeps its schedule and the cursor
    assert s.commands[-1].params.page == 2 and len(s.commands) == 2
    s.answer(None, error=True) if s.state.pending else None
    s.now += 5000
    s.send(TimerFired(at_ms=s.now, key=s.key, due_ms=s.now))
    assert s.pages() == [1, 2, 2]
    s.answer(None, error=True)
    assert s.wakeup == s.now + 10000


def test_overdue_page_is_reissued_with_the_same_id() -> None:
    s = Sweep()
    s.request()
    first = s.commands[-1]
    assert s.wakeup is not None
    s.now = s.wakeup
    s.send(TimerFired(at_ms=s.now, key=s.key, due_ms=s.now))
    assert s.commands[-1].command_id == first.command_id and len(s.commands) == 2


def test_a_request_during_a_pass_continues_it() -> None:
    s = Sweep()
    s.request()
    s.answer([SweepRow(id=1)])
    s.request()
    assert s.pages() == [1, 2]
    s.answer([])
    assert s.state.job is not None  # the merge re-arms: a new pass from page 1
    assert s.pages() == [1, 2, 1]


def test_unrouted_account_completes_as_a_no_op_and_duplicates_change_nothing() -> None:
    s = Sweep()
    s.key = "4:pending"
    s.send(SweepRequested(at_ms=T0, account_id=4, status="pending"))
    assert s.commands == [] and s.state.job is None
    before = s.state
    again = fold_sweep(before, SweepRequested(at_ms=T0, account_id=4, status="pending"), s.offset, CONFIG)
    assert again.state == before and again.commands == []
