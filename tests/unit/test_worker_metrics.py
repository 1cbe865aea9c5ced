"""Worker metrics that operators act on: stuck conversations (Decisions 9)."""

from __future__ import annotations

from handlers.worker.metrics import WorkerMetrics
from schemas.records import TurnOutcome


def _turn(key: str, result: str, failures: int | None = None, reason: str | None = None) -> TurnOutcome:
    return TurnOutcome(key=key, run=1, at_ms=0, result=result, failures=failures, reason=reason)  # type: ignore[arg-type]


def _gauge(metrics: WorkerMetrics, reason: str) -> float:
    value = metrics.registry.get_sample_value("router_stuck_conversations", {"reason": reason})
    return value or 0.0


def test_a_conversation_counts_as_stuck_from_its_third_failure_in_a_row_until_it_ends() -> None:
    metrics = WorkerMetrics()
    metrics.count_turn(_turn("1:1", "retry", 1, "foreign_bot"))
    metrics.count_turn(_turn("1:1", "retry", 2, "foreign_bot"))
    assert metrics.stuck_keys() == {}
    metrics.count_turn(_turn("1:1", "retry", 3, "foreign_bot"))
    metrics.count_turn(_turn("1:2", "retry", 7, "malformed_page"))
    assert metrics.stuck_keys() == {"1:1": "foreign_bot", "1:2": "malformed_page"}
    assert _gauge(metrics, "foreign_bot") == 1
    metrics.count_turn(_turn("1:1", "retry", 4, "foreign_bot"))
    assert _gauge(metrics, "foreign_bot") == 1  # counted once, not per failure
    metrics.count_turn(_turn("1:1", "deferred"))
    assert "1:1" in metrics.stuck_keys()
    metrics.count_turn(_turn("1:1", "handed_off", reason="handoff_mode"))
    assert metrics.stuck_keys() == {"1:2": "malformed_page"}
    assert _gauge(metrics, "foreign_bot") == 0
    assert _gauge(metrics, "malformed_page") == 1
