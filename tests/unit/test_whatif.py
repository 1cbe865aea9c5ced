"""What-if (DESIGN §8): recorded turns re-decided under a candidate configuration by the live fold itself.

Each story routes a conversation live against the scripted Chatwoot of test_fold_driver, records the log, and
compares it under candidates: the identity, one kind's status, a removed owner, changed questions, thresholds.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from pydantic import TypeAdapter

from projections.fold import Event
from projections.jev import build_request
from projections.whatif.record import RecordedTurn, TurnRecorder
from projections.whatif.render import render_html, render_text
from projections.whatif.replay import compare_turn, question_digest
from projections.whatif.report import Report, build_report, config_diff, select
from schemas.config import RouterConfig, parse_config
from schemas.configs import ConfigBook, ConfigDocument, FoldSettings
from schemas.records import ConfigApplied
from tests.unit.test_fold_driver import (
    T0,
    Driver,
    FakeChatwoot,
    decision,
    incoming,
    make_config,
)

INVOICE = "My invoice is wrong, please fix it"


def variant(config: RouterConfig, change: Callable[[dict[str, Any]], None]) -> RouterConfig:
    document = config.model_dump(mode="json", by_alias=True, exclude_none=True)
    change(document["routing"])
    return parse_config(document)


def routed(*texts: str, **chatwoot: Any) -> Driver:
    fake = FakeChatwoot(**chatwoot)
    fake.messages = [incoming(i + 1, t) for i, t in enumerate(texts or (INVOICE,))]
    d = Driver(chatwoot=fake)
    d.webhook()
    return d


_EVENT: TypeAdapter[Event] = TypeAdapter(Event)


def as_conversation(event: Any, conversation: int) -> Event:
    """A driver's event (always conversation 1:2) as the same event of conversation 1:<conversation>."""
    raw = event.model_dump_json().replace('"1:2', f'"1:{conversation}')
    return _EVENT.validate_json(raw.replace('"conversation_id":2', f'"conversation_id":{conversation}'))


def recorded(*drivers: Driver) -> TurnRecorder:
    """Every driver's log folded by the recorder under its live configuration: driver i is conversation 1:1i."""
    book = ConfigBook([ConfigDocument.of(d.config, FoldSettings(retry_base_ms=d.retry_base_ms)) for d in drivers])
    recorder = TurnRecorder(book)
    for i, d in enumerate(drivers):
        document = ConfigDocument.of(d.config, FoldSettings(retry_base_ms=d.retry_base_ms))
        for offset, event in d.log:
            recorder.apply(as_conversation(event, 10 + i) if len(drivers) > 1 else event, offset, document)
    return recorder


def only(d: Driver, candidate: RouterConfig, answers: dict[str, object] | None = None) -> Any:
    (turn,) = recorded(d).turns
    return compare_turn(turn, candidate, answers)


def report(candidate: RouterConfig, *drivers: Driver) -> Report:
    recorder = recorded(*drivers)
    return build_report(recorder.turns, candidate, "cand", undecided=recorder.undecided)


# --- the identity --------------------------------------------------------------------------------------


def test_the_identity_candidate_leaves_every_kind_of_outcome_unchanged() -> None:
    drivers = [
        routed(),  # assigned
        routed("casino spam", decision=decision(kind="spam")),  # ended resolved, labelled
        routed("thanks a lot", decision=decision(kind="thanks")),  # ended snoozed, no label
        routed("what?", decision=decision(owner=None, owner_confidence=0.2)),  # handed off: unclear_owner
        routed("refund me", decision=decision(kind="refund")),  # canned reply, then assigned
        routed("hi", decision=decision(owner=None, no_request=True)),  # waited for a request
    ]
    live = [d.last().result for d in drivers]
    assert live == ["assigned", "ended", "ended", "handed_off", "assigned", "waited"]
    assert drivers[4].last().replied
    r = report(drivers[0].config, *drivers)
    assert r.totals == {"compared": 6, "unchanged": 6, "changed": 0, "needs_new_decision": 0}
    assert all(live == candidate for live, candidate in r.matrix)
    assert r.matrix == {
        ("assigned to billing (user 7)", "assigned to billing (user 7)"): 2,
        ("ended resolved", "ended resolved"): 1,
        ("ended snoozed", "ended snoozed"): 1,
        ("handed off: unclear_owner", "handed off: unclear_owner"): 1,
        ("waited for a request", "waited for a request"): 1,
    }
    assert r.diffs == {next(iter(r.diffs)): []}
    assert r.changed() == [] and r.questions() == []


def test_a_live_failure_is_reproduced_by_the_identity_candidate() -> None:
    d = Driver(chatwoot=FakeChatwoot(messages=[incoming(1, "casino spam")], decision=decision(kind="spam")))
    d.chatwoot.fail("toggle_status")
    d.webhook()
    d.tick()  # the retry, after the backoff
    assert [o.result for o in d.outcomes] == ["retry", "ended"]
    r = report(d.config, d)
    assert [t.live.outcome for t in r.turns] == ["retry: toggle_status_failed_503", "ended resolved"]
    assert r.totals["unchanged"] == 2
    snoozed = report(variant(d.config, lambda r: r["kinds"]["1"]["spam"].update(status="snoozed")), d)
    assert [t.candidate.outcome for t in snoozed.turns if t.candidate] == ["ended snoozed", "ended snoozed"]


def test_webhooks_folded_in_the_middle_of_a_run_are_replayed_in_order() -> None:
    d = Driver(chatwoot=FakeChatwoot(messages=[incoming(1, INVOICE)]))
    d.send(d_webhook(d))
    d.send(d_webhook(d))  # a second webhook while the run waits: the job is merged and re-armed
    d.settle()
    assert [o.result for o in d.outcomes] == ["assigned", "nothing"]
    r = report(d.config, d)
    assert r.totals == {"compared": 1, "unchanged": 1, "changed": 0, "needs_new_decision": 0}
    assert r.undecided == 1  # the re-armed run found the conversation no longer pending


def d_webhook(d: Driver) -> Any:
    from schemas.records import WebhookReceived

    return WebhookReceived(at_ms=d.now, account_id=1, conversation_id=2, event="message_created")


# --- what the recorded answer still decides ------------------------------------------------------------


def test_a_kind_with_another_status_ends_the_turn_differently() -> None:
    spam = routed("casino spam", decision=decision(kind="spam"))
    other = routed()
    candidate = variant(spam.config, lambda r: r["kinds"]["1"]["spam"].update(status="snoozed"))
    r = report(candidate, spam, other)
    assert r.totals == {"compared": 2, "unchanged": 1, "changed": 1, "needs_new_decision": 0}
    (changed,) = r.changed()
    assert changed.live.describe() == "ended resolved; labels spam"
    assert changed.candidate is not None and changed.candidate.describe() == "ended snoozed; labels spam"
    assert ("ended resolved", "ended snoozed") in r.matrix
    (diff,) = r.diffs.values()
    assert [(c.path, c.live, c.candidate) for c in diff] == [("routing.kinds.1.spam.status", "resolved", "snoozed")]


def test_a_kind_without_status_routes_on_to_the_owner() -> None:
    spam = routed("casino spam", decision=decision(kind="spam"))
    candidate = variant(spam.config, lambda r: r["kinds"]["1"]["spam"].pop("status"))
    t = only(spam, candidate)
    assert t.status == "changed"
    assert t.candidate.describe() == "assigned to billing (user 7); labels spam"
    # the live run never listed the agents (a status ending does not need them)
    assert t.candidate.assumptions == ("agents not listed live: user 7 assumed to be an agent",)


def test_a_new_canned_reply_is_sent_once_under_named_assumptions() -> None:
    spam = routed("casino spam", decision=decision(kind="spam"))

    def canned(r: dict[str, Any]) -> None:
        r["kinds"]["1"]["spam"].pop("status")
        r["kinds"]["1"]["spam"]["cannedResponse"] = "go-away"

    t = only(spam, variant(spam.config, canned))
    assert t.candidate.describe() == "assigned to billing (user 7); labels spam; canned reply"
    assert t.candidate.replied and t.status == "changed"
    assert any("reply history" in a for a in t.candidate.assumptions)
    assert any("'go-away' assumed to exist" in a for a in t.candidate.assumptions)


def test_a_changed_assignee_keeps_the_answer_and_checks_the_recorded_agents() -> None:
    d = routed()
    candidate = variant(d.config, lambda r: r["accounts"]["1"]["billing"].update(assignee=9))
    t = only(d, candidate)
    assert t.status == "changed" and t.candidate.outcome == "handed off: assignee_not_an_agent"
    moved = variant(d.config, lambda r: r["accounts"]["1"]["billing"].update(assignee=8))
    t = only(d, moved)
    assert t.candidate.outcome == "assigned to billing (user 8)"  # the owner decided, now with user 8


def test_a_label_flag_and_a_higher_threshold_change_labels_and_endings() -> None:
    spam = routed("casino spam", decision=decision(kind="spam"))
    t = only(spam, variant(spam.config, lambda r: r["kinds"]["1"]["spam"].update(label=False)))
    assert t.candidate.describe() == "ended resolved" and t.status == "changed"
    d = routed(decision=decision(owner_confidence=0.8))
    t = only(d, variant(d.config, lambda r: r.update(minConfidence=0.85)))
    assert t.candidate.outcome == "handed off: unclear_owner"


def test_an_account_no_longer_routed_is_left_alone() -> None:
    d = routed()

    def drop(r: dict[str, Any]) -> None:
        r["accounts"] = {"3": r["accounts"]["1"]}
        r["botIds"] = {"3": 1}
        r.pop("kinds")

    t = only(d, variant(d.config, drop))
    assert t.status == "changed" and t.candidate.outcome == "nothing: account_not_routed"


# --- when System One's question changes ----------------------------------------------------------------


def test_a_removed_owner_changes_the_question_so_the_turn_needs_a_new_decision() -> None:
    d = routed()
    candidate = variant(d.config, lambda r: r["accounts"]["1"].pop("tech"))
    t = only(d, candidate)
    assert t.status == "needs_decision" and t.candidate is None and t.needs == ("owners",)
    r = report(candidate, d)
    assert r.totals == {"compared": 1, "unchanged": 0, "changed": 0, "needs_new_decision": 1}
    assert r.matrix == {("assigned to billing (user 7)", "needs a new decision"): 1}
    assert [q.digest for q in r.questions()] == [t.question.digest]


def test_each_part_of_the_question_is_named_when_it_changes() -> None:
    d = routed()
    cases: dict[str, Callable[[dict[str, Any]], None]] = {
        "owners": lambda r: r["accounts"]["1"]["tech"].update(covers="broken things"),
        "topics": lambda r: r["topics"].update(refunds="refunds"),
        "kinds": lambda r: r["kinds"]["1"]["spam"].update(covers="junk mail"),
        "model": lambda r: r.update(model="jev-2"),
    }
    for name, change in cases.items():
        t = only(d, variant(d.config, change))
        assert (t.status, t.needs) == ("needs_decision", (name,)), name
    both = variant(d.config, lambda r: (r.pop("topics"), r.update(model="jev-2")))
    assert only(d, both).needs == ("topics", "model")
    for same in (
        lambda r: r["kinds"]["1"]["spam"].update(status="snoozed"),
        lambda r: r["kinds"]["1"]["refund"].update(cannedResponse="other"),
        lambda r: r["kinds"]["1"]["quiet"].update(label=True),
        lambda r: r["accounts"]["1"]["tech"].update(assignee=99),
        lambda r: r.update(endpoint="https://proxy.example/v1/systemone"),
    ):
        assert only(d, variant(d.config, same)).status != "needs_decision"


def test_an_answer_to_the_new_question_decides_the_turn() -> None:
    d = routed()
    candidate = variant(d.config, lambda r: r["accounts"]["1"].pop("tech"))
    t = only(d, candidate)
    assert t.question is not None
    body = build_request(candidate, 1, t.question.body["state"]["ticket"])
    assert t.question.digest == question_digest(body)
    answer = {
        "answers": {
            "owner": {"choice": "unclear", "confidence": 0.9},
            "topic": {"choice": "invoices", "confidence": 0.9},
            "request": {"choice": "request", "confidence": 0.9},
            "kind": {"choice": "none", "confidence": 0.9},
        }
    }
    decided = only(d, candidate, {t.question.digest: answer})
    assert decided.status == "changed"
    assert decided.candidate.describe() == "handed off: unclear_owner; labels invoices"
    invalid = only(d, candidate, {t.question.digest: {"answers": {}}})
    assert invalid.status == "needs_decision" and invalid.needs == ("TypeSafe Jev: no valid owner",)


def test_a_lower_threshold_needs_a_decision_only_where_the_request_answer_matters() -> None:
    greeting = routed("hello", decision=decision(owner=None, owner_confidence=0.2))  # no_request False
    assert greeting.last().result == "handed_off"
    lower = variant(greeting.config, lambda r: r.update(minConfidence=0.6))
    t = only(greeting, lower)
    assert t.status == "needs_decision" and t.needs == ("minConfidence",)
    assert t.question is not None and t.question.body["state"]["ticket"]
    kind = routed("casino spam", decision=decision(kind="spam"))  # a confident kind never waits
    assert only(kind, lower).status == "unchanged"
    waited = routed("hi", decision=decision(owner=None, no_request=True))
    assert only(waited, lower).status == "unchanged"  # a "no request" holds under a lower threshold
    assert only(waited, variant(waited.config, lambda r: r.update(minConfidence=0.95))).needs == ("minConfidence",)


# --- recording ----------------------------------------------------------------------------------------


def test_runs_without_a_decision_are_counted_not_compared() -> None:
    d = routed("jane@example.com")  # identifier-only: handed off without System One
    recorder = recorded(d)
    assert recorder.turns == [] and recorder.undecided == 1


def test_each_turn_is_compared_with_the_version_in_force_at_its_partition() -> None:
    first = make_config()
    second = variant(first, lambda r: r["kinds"]["1"]["spam"].update(status="snoozed"))
    v1 = ConfigDocument.of(first, FoldSettings())
    v2 = ConfigDocument.of(second, FoldSettings())
    before = routed("casino spam", decision=decision(kind="spam"))
    after = Driver(chatwoot=FakeChatwoot(messages=[incoming(1, "casino spam")], decision=decision(kind="spam")))
    after.config = second
    after.webhook()
    recorder = TurnRecorder(ConfigBook([v1, v2]))
    for offset, event in before.log:
        recorder.feed(event.model_dump_json().encode(), offset, partition=0)
    recorder.feed(ConfigApplied(version=v2.version, at_ms=T0).model_dump_json().encode(), 100, partition=0)
    for offset, event in after.log:  # the same story as conversation 1:3, after the marker
        recorder.feed(as_conversation(event, 3).model_dump_json().encode(), offset + 100, partition=0)
    assert [t.live.version for t in recorder.turns] == [v1.version, v2.version]
    r = build_report(recorder.turns, first, v1.version)
    assert [t.status for t in r.turns] == ["unchanged", "changed"]
    assert set(r.diffs) == {v1.version, v2.version} and r.diffs[v1.version] == []
    recorder.feed(b"not json", 500, partition=0)
    assert recorder.undecodable == 1


def test_select_keeps_turns_by_time_account_and_conversation() -> None:
    (turn,) = recorded(routed()).turns
    assert select([turn], from_ms=T0) == [turn]
    assert select([turn], from_ms=T0 + 1) == []
    assert select([turn], account_id=2) == [] and select([turn], account_id=1) == [turn]
    assert select([turn], key="1:3") == [] and select([turn], key="1:2") == [turn]


# --- the report ---------------------------------------------------------------------------------------


def test_config_diff_names_added_removed_and_changed_key_paths() -> None:
    live = make_config()
    candidate = variant(live, lambda r: (r["accounts"]["1"].pop("tech"), r.update(model="jev-2")))
    changes = {c.path: (c.live, c.candidate) for c in config_diff(live, candidate)}
    assert changes == {
        "routing.accounts.1.tech.assignee": (8, None),
        "routing.accounts.1.tech.covers": ("bugs", None),
        "routing.model": ("jev-1.13.0", "jev-2"),
    }


def _mixed() -> tuple[Report, list[RecordedTurn]]:
    spam = routed("casino spam", decision=decision(kind="spam"))
    d = routed()
    candidate = variant(spam.config, lambda r: r["kinds"]["1"]["spam"].update(status="snoozed", covers="<junk> & spam"))
    recorder = recorded(spam, d)
    return build_report(recorder.turns, candidate, "cand"), recorder.turns


def test_the_text_report_shows_totals_matrix_changed_turns_and_the_diff() -> None:
    r, _ = _mixed()
    text = render_text(r)
    assert "  turns compared             2" in text
    assert "  needs a new decision       2" in text
    assert "→  needs a new decision: 1" in text
    assert "    candidate: needs a new decision (kinds)" in text
    assert 'routing.kinds.1.spam.covers: "spam" → "<junk> & spam"' in text
    assert 'routing.kinds.1.spam.status: "resolved" → "snoozed"' in text
    assert INVOICE not in text and "casino" not in text  # no customer text, even redacted


def test_the_json_and_html_reports_carry_the_same_and_escape_text() -> None:
    r, _ = _mixed()
    data = json.loads(json.dumps(r.as_json()))
    assert data["totals"] == {"compared": 2, "unchanged": 0, "changed": 0, "needs_new_decision": 2}
    assert {cell["candidate"] for cell in data["matrix"]} == {"needs a new decision"}
    assert data["turns"][0]["needs_new_decision"] == ["kinds"]
    page = render_html(r)
    assert "&lt;junk&gt; &amp; spam" in page and "<junk>" not in page
    assert "<script" not in page and "http" not in page.replace("http-equiv", "")
    assert INVOICE not in page
