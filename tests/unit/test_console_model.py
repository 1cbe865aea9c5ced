"""The console's read model replays the log through the worker's fold and keeps what its pages draw."""

from __future__ import annotations

from projections.console.layout import TimeScale, format_duration, layout_timeline, step_rows
from projections.console.model import (
    ConsoleModel,
    describe_cause,
    merge_stuck,
    parse_conversation_key,
)
from schemas.configs import ConfigDocument, FoldSettings
from schemas.records import ConfigApplied
from tests.unit.test_fold_driver import T0, Driver, decision, incoming

BILLING_TEXT = "I was charged twice for my invoice"


def _model(driver: Driver, **kw: object) -> ConsoleModel:
    model = ConsoleModel(driver.config, retry_base_ms=driver.retry_base_ms, **kw)  # type: ignore[arg-type]
    for offset, event in driver.log:
        model.feed(event.model_dump_json().encode(), offset)
    return model


def test_timeline_reproduces_the_state_and_has_one_call_per_command() -> None:
    driver = Driver()
    driver.chatwoot.messages = [incoming(1, BILLING_TEXT)]
    driver.chatwoot.decision = decision("billing", 0.92, topic="invoices", topic_confidence=0.8)
    driver.webhook()

    timeline = _model(driver).timeline("1:2")

    assert timeline is not None
    assert timeline.state == driver.state
    assert [c.command_id for c in timeline.calls] == [c.command_id for c in driver.commands]
    assert all(c.result == "ok" and c.attempt == 1 and not c.ignored for c in timeline.calls)
    assert [c.target for c in timeline.calls].count("System One") == 1
    ending = timeline.ending
    assert ending is not None and ending.result == "assigned" and ending.assignee_id == 7
    assert timeline.labels == ("invoices",)
    [card] = timeline.decisions
    assert card.source == "System One" and card.decision.owner == "billing" and card.assignee == 7
    assert card.input_text == "Contact email domain: example.org\n" + BILLING_TEXT  # redacted, as Jev saw it
    labels = [m.label for m in timeline.marks]
    assert labels[:2] == ["message_created", "run 1 started"] and "System One decided" in labels


def test_a_failed_read_shows_the_backoff_and_the_retry_run() -> None:
    driver = Driver()
    driver.chatwoot.messages = [incoming(1, BILLING_TEXT)]
    driver.chatwoot.fail("read_turn", times=1)
    driver.webhook()
    driver.tick()

    timeline = _model(driver).timeline("1:2")

    assert timeline is not None
    failed = [c for c in timeline.calls if c.result != "ok"]
    assert [(c.op, c.result, c.status) for c in failed] == [("read_turn", "failed", 503)]
    [backoff] = [s for s in timeline.timers if s.kind == "backoff"]
    assert backoff.end_ms - backoff.start_ms == driver.retry_base_ms
    assert [o.result for o in timeline.outcomes] == ["retry", "assigned"]
    assert "timer fired" in [m.label for m in timeline.marks if m.lane == "timers"]


def test_an_overdue_command_is_re_issued_as_a_second_attempt() -> None:
    driver = Driver()
    driver.chatwoot.messages = [incoming(1, BILLING_TEXT)]
    driver.chatwoot.lost["get_inbox_bot"] = 1  # its outcome never comes: the deadline re-issues it
    driver.webhook()
    driver.tick()

    timeline = _model(driver).timeline("1:2")

    assert timeline is not None
    inbox = [c for c in timeline.calls if c.op == "get_inbox_bot"]
    assert [(c.attempt, c.result) for c in inbox[:2]] == [(1, "overdue"), (2, "ok")]
    assert inbox[0].command_id == inbox[1].command_id
    assert timeline.state == driver.state


def test_a_memo_hit_shows_the_decision_from_the_memo_with_its_input() -> None:
    driver = Driver()
    driver.chatwoot.messages = [incoming(1, BILLING_TEXT)]
    driver.chatwoot.decision = decision("billing", 0.9, topic="invoices")
    driver.chatwoot.fail("set_labels", times=1)  # the run fails after the decision; the retry hits the memo
    driver.webhook()
    driver.tick()

    timeline = _model(driver).timeline("1:2")

    assert timeline is not None
    sources = [card.source for card in timeline.decisions]
    assert sources == ["System One", "memo"]
    memo = next(card for card in timeline.decisions if card.source == "memo")
    assert memo.input_text == timeline.decisions[0].input_text != ""


def test_overview_counts_endings_results_handoffs_and_replies() -> None:
    driver = Driver()
    driver.chatwoot.messages = [incoming(1, "Please refund my order")]
    driver.chatwoot.decision = decision("billing", 0.9, kind="refund")
    driver.webhook()
    model = _model(driver)
    model.feed(b"not json", 999)

    overview = model.overview(T0 + 60_000)

    assert overview.conversations == 1 and overview.undecodable == 1
    assert overview.endings == {"assigned": 1}
    assert overview.replies_sent == 1
    assert sum(bar.total for bar in overview.hours) == sum(overview.results.values()) >= 1
    assert overview.hours[-1].start_ms <= T0 < overview.hours[-1].start_ms + 3_600_000
    assert overview.recent[0].result == "assigned"
    # a record already applied changes nothing
    before = model.overview(T0 + 60_000)
    for offset, event in driver.log:
        model.feed(event.model_dump_json().encode(), offset)
    assert model.overview(T0 + 60_000).results == before.results


def test_three_failed_runs_in_a_row_make_a_conversation_stuck_until_one_succeeds() -> None:
    driver = Driver()
    driver.chatwoot.messages = [incoming(1, BILLING_TEXT)]
    driver.chatwoot.fail("read_turn", times=3)
    driver.webhook()
    driver.tick()
    driver.tick()
    stuck = _model(driver)
    assert stuck.overview(T0).stuck == {"1:2": "read_turn_failed_503"}
    driver.tick()
    assert _model(driver).overview(T0).stuck == {}
    rows = merge_stuck({"1:2": "foreign_bot"}, [("http://w1", {"1:2": "foreign_bot", "1:10": "x_failed_500"})])
    assert [(r.key, r.sources) for r in rows] == [("1:2", ("http://w1", "log")), ("1:10", ("http://w1",))]
    assert "another account's bot" in rows[0].cause and rows[1].cause == "x failed (HTTP 500)"


def test_markers_switch_the_configuration_a_partition_is_folded_under() -> None:
    driver = Driver()
    driver.chatwoot.messages = [incoming(1, BILLING_TEXT)]
    driver.webhook()
    document = ConfigDocument.of(driver.config, FoldSettings(retry_base_ms=driver.retry_base_ms))
    model = ConsoleModel(driver.config, retry_base_ms=driver.retry_base_ms)
    marker = ConfigApplied(version=document.version, at_ms=T0).model_dump_json().encode()
    assert model.needs_version(marker) == document.version
    model.add_documents([document])
    assert model.needs_version(marker) is None
    model.feed(marker, 0, partition=3)
    for offset, event in driver.log:
        model.feed(event.model_dump_json().encode(), offset, partition=3)
    timeline = model.timeline("1:2")
    assert timeline is not None and timeline.state.config_version == document.version
    assert timeline.config_versions == [document.version] and model.versions.markers == 1
    assert f"configuration {document.version}" in [m.label for m in timeline.marks]


def test_search_keys_and_causes() -> None:
    assert parse_conversation_key(" 1:42 ") == "1:42"
    assert parse_conversation_key("1/42") == parse_conversation_key("1 42") == "1:42"
    assert parse_conversation_key("1:x") is None and parse_conversation_key("42") is None
    assert describe_cause("decide_timeout") == "decide timeout"
    assert describe_cause("malformed_page").startswith("a message page")


def test_layout_squeezes_quiet_stretches_and_draws_every_call() -> None:
    scale = TimeScale([0, 100, 200, 3_600_000, 3_600_050])
    assert len(scale.clusters) == 2 and scale.breaks()[0][1] == format_duration(3_600_000 - 200)
    assert scale.x(0) < scale.x(100) < scale.x(200) < scale.x(1_000_000) < scale.x(3_600_000)

    driver = Driver()
    driver.chatwoot.messages = [incoming(1, BILLING_TEXT)]
    driver.chatwoot.fail("read_turn", times=1)
    driver.webhook()
    driver.tick()
    timeline = _model(driver).timeline("1:2")
    assert timeline is not None
    layout = layout_timeline(timeline)
    calls = [b for b in layout.bars if b.cls.startswith("call ")]
    assert len(calls) == len(timeline.calls) == len(driver.commands)
    assert {b.result for b in calls} == {"ok", "failed"}
    assert [b for b in layout.bars if b.cls.startswith("timer ")]
    assert [lane.name for lane in layout.lanes] == ["webhooks", "router", "chatwoot", "systemone", "timers"]
    assert all(0 <= b.x <= layout.width for b in layout.bars)
    rows = step_rows(timeline)
    assert [r.at_ms for r in rows] == sorted(r.at_ms for r in rows)
    assert rows[0].what == "message_created"
