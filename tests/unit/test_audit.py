"""Audit trails replay the recorded log through the fold and report what the router did, without effects."""

from __future__ import annotations

from projections.logs.audit import ConversationTrail, render_text
from tests.unit.test_fold_driver import Driver, decision, incoming


def _replay(driver: Driver) -> ConversationTrail:
    trail = ConversationTrail(key="1:2")
    for offset, event in driver.log:
        trail.timeline.apply(event, offset, driver.config, retry_base_ms=driver.retry_base_ms)
    return trail


def test_trail_of_an_assigned_ticket_shows_input_decision_and_outcome() -> None:
    driver = Driver()
    driver.chatwoot.messages = [incoming(1, "I was charged twice for my invoice")]
    driver.chatwoot.decision = decision("billing", 0.92, topic="invoices", topic_confidence=0.8)
    driver.webhook()

    trail = _replay(driver)

    assert trail.state == driver.state  # the replay reproduces the live state exactly
    assert [o.result for o in trail.outcomes] == ["assigned"]
    assert trail.outcomes == driver.outcomes
    assert trail.inputs == ["Contact email domain: example.org\nI was charged twice for my invoice"]
    assert trail.decisions == [driver.chatwoot.decision]
    assert trail.labels == ("invoices",)
    text = render_text(trail)
    assert "Jev decided" in text and "owner=billing (0.92)" in text
    assert "assigned to user 7" in text


def test_trail_counts_a_canned_reply_once_and_a_replay_is_idempotent() -> None:
    driver = Driver()
    driver.chatwoot.messages = [incoming(1, "Please refund my order")]
    driver.chatwoot.decision = decision("billing", 0.9, kind="refund")
    driver.webhook()

    trail = _replay(driver)
    assert trail.replies_sent == 1
    # Applying the same log again (a redelivery) changes nothing.
    for offset, event in driver.log:
        assert trail.timeline.apply(event, offset, driver.config) == []
    assert trail.replies_sent == 1
    assert trail.state == driver.state


def test_verify_reports_every_key_whose_replayed_state_differs_from_the_live_table() -> None:
    from schemas.state import ConversationState, ReplyLedger
    from streams.audit_cmd import _table_key, diff_states

    same = ConversationState(offset=3)
    replayed = {"1:1": same, "1:2": ConversationState(offset=5), "1:3": same, "1:5": ConversationState(offset=9)}
    live = {
        "1:1": same,
        "1:2": ConversationState(offset=5, ledger=ReplyLedger(value="attempted")),
        "1:4": same,
        "1:5": ConversationState(offset=7),
    }
    assert diff_states(replayed, live) == [
        "1:2: differs in ledger",
        "1:3: missing from the live table",
        "1:4: only in the live table",
        "1:5: differs in offset (replayed 9, live 7)",  # a log position says where to look
    ]
    assert diff_states(replayed, dict(replayed)) == []
    assert _table_key(b'"1:2"') == "1:2" and _table_key(b"1:2") == "1:2"


def test_log_replay_counts_records_that_are_not_conversation_events() -> None:
    from projections.logs.audit import LogReplay

    driver = Driver()
    driver.chatwoot.messages = [incoming(1, "I was charged twice for my invoice")]
    driver.webhook()
    replay = LogReplay(driver.config, retry_base_ms=driver.retry_base_ms)
    replay.feed(b"not json", 0)
    replay.feed(b'{"type": "something_else", "at_ms": 1}', 0)
    for offset, event in driver.log:
        replay.feed(event.model_dump_json().encode(), offset)
    assert replay.undecodable == 2
    assert list(replay.trails) == ["1:2"] and replay.trail("1:2").state == driver.state
    assert replay.trail("9:9").events == 0


def test_a_call_that_waited_for_chatwoots_rate_limit_says_how_long_on_the_timeline() -> None:
    """Issue 30: throttled time is on the conversation's timeline (audit's line and the console's bar), from a
    second on; shorter waits are the ordinary pacing of the request budget."""
    from projections.logs.audit import trail_line
    from projections.logs.timeline import Answered, Call, waited

    call = Call("1:7:1:3", "assign", "user 2", 1, 1, 0, ended_ms=95_000, result="ok", requests=2, rate_wait_ms=72_400)
    assert waited(72_400) == "1 min 12 s" and waited(12_000) == "12 s"
    assert call.summary == "ok, waited 1 min 12 s for Chatwoot's rate limit"
    line = trail_line(Answered(95_000, 1, call, None))
    assert line is not None and "waited 1 min 12 s for Chatwoot's rate limit" in line.detail
    quick = Call("1:7:1:4", "assign", "user 2", 1, 1, 0, ended_ms=1, result="ok", requests=2, rate_wait_ms=300)
    assert quick.summary == "ok"
