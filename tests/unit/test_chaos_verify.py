"""The kill-loop verifier's checks (bench/chaos_verify.py) on hand-made evidence: what counts as a stale
mutation and what as the race behavior.md §12.1 allows, unfolded and skipped records, duplicates, endings."""

from __future__ import annotations

from typing import Any

from bench.chaos_verify import AuditResult, Evidence, Record, check, check_generations, parse_audit

KEY = "1:7"
PATH = "/api/v1/accounts/1/conversations/7"
PENDING: dict[str, Any] = {"status": "pending", "assignee_id": None, "bot_assignee_id": 5, "labels": []}
RESOLVED: dict[str, Any] = {"status": "resolved", "assignee_id": None, "bot_assignee_id": None, "labels": ["spam"]}
REOPENED: dict[str, Any] = {"status": "open", "assignee_id": 2, "bot_assignee_id": None, "labels": ["spam"]}


def call(seq: int, op: str, body: Any, before: dict[str, Any], after: dict[str, Any], **extra: Any) -> dict[str, Any]:
    suffix = {"toggle_status": "/toggle_status", "assign": "/assignments", "set_labels": "/labels"}.get(op, "")
    token = "user" if op == "get_conversation" else "bot"
    return {
        "op": op,
        "path": PATH + suffix,
        "token": token,
        "status": 200,
        "seq": seq,
        "applied_seq": seq,
        "at": float(seq),
        "applied_at": float(seq),
        "applied": True,
        "body": body,
        "before": before,
        "after": after,
        **extra,
    }


def read(seq: int, state: dict[str, Any]) -> dict[str, Any]:
    entry = call(seq, "get_conversation", None, state, state)
    del entry["body"]
    return entry


def person(seq: int, action: str, before: dict[str, Any], after: dict[str, Any]) -> dict[str, Any]:
    return {
        "seq": seq,
        "at": float(seq),
        "action": action,
        "user_id": 2,
        "account_id": 1,
        "conversation_id": 7,
        "args": {},
        "before": before,
        "after": after,
    }


def evidence(**fields: Any) -> Evidence:
    final = {"account_id": 1, "id": 7, "messages": [], **fields.pop("final", REOPENED)}
    base: dict[str, Any] = {
        "scope": [KEY],
        "bot_ids": {1: 5},
        "api_calls": [],
        "person_actions": [],
        "webhooks": [],
        "systemone_calls": [],
        "conversations": {KEY: final},
        "events": [],
        "changelog": [],
        "effects": [],
        "audit": AuditResult(0, [], "1 conversations replayed, 0 undecodable records, 0 differences"),
    }
    return Evidence(**{**base, **fields})


# the router resolves spam and releases the bot; a person reopens it (self-assigned) afterwards
ENDED = [
    read(1, PENDING),
    call(2, "toggle_status", {"status": "resolved"}, PENDING, {**PENDING, "status": "resolved", "labels": ["spam"]}),
    call(3, "assign", {"assignee_id": None}, {**RESOLVED, "bot_assignee_id": 5}, RESOLVED),
]
REOPEN = person(10, "status", RESOLVED, REOPENED)


def test_a_command_executed_again_after_a_persons_change_is_stale() -> None:
    again = call(12, "toggle_status", {"status": "resolved"}, REOPENED, {**REOPENED, "status": "resolved"})
    verdict = check(
        evidence(api_calls=[*ENDED, again], person_actions=[REOPEN], final={**REOPENED, "status": "resolved"})
    )
    assert verdict.counts["stale_mutations"] == 1 and not verdict.passed
    (violation,) = [v for v in verdict.violations if v.check == "stale_mutations"]
    assert violation.conversation == KEY
    assert "status 'open' -> 'resolved'" in violation.detail and "repeats seq=2" in violation.detail
    assert verdict.counts["repeated_mutations"] == 1


def test_an_unassign_that_clears_the_persons_assignee_is_stale_even_after_a_fresh_read() -> None:
    unassign = call(13, "assign", {"assignee_id": None}, REOPENED, {**REOPENED, "assignee_id": None})
    verdict = check(evidence(api_calls=[*ENDED, read(11, REOPENED), unassign], person_actions=[REOPEN]))
    assert verdict.counts["stale_mutations"] == 1
    assert "assignee_id 2 -> None" in verdict.violations[0].detail


def test_a_mutation_racing_the_persons_change_after_its_fresh_read_is_a_late_mutation() -> None:
    """§12.1's race, which issue 22 no longer allows: the router's read came before the person's takeover."""
    taken = person(5, "assign", PENDING, {**PENDING, "status": "open", "assignee_id": 3, "bot_assignee_id": None})
    resolve = call(6, "toggle_status", {"status": "resolved"}, taken["after"], {**taken["after"], "status": "resolved"})
    verdict = check(evidence(api_calls=[read(1, PENDING), resolve], person_actions=[taken], final=resolve["after"]))
    assert verdict.counts["stale_mutations"] == 0 and verdict.counts["raced"] == 1
    assert verdict.counts["late_mutations"] == 1 and not verdict.passed


def test_any_mutation_after_a_takeover_on_an_older_read_is_late_even_one_that_undoes_nothing() -> None:
    taken = person(5, "assign", PENDING, {**PENDING, "status": "open", "assignee_id": 3, "bot_assignee_id": None})
    labels = call(6, "set_labels", {"labels": ["spam"]}, taken["after"], {**taken["after"], "labels": ["spam"]})
    verdict = check(evidence(api_calls=[read(1, PENDING), labels], person_actions=[taken], final=labels["after"]))
    assert verdict.counts["stale_mutations"] == 0 and verdict.counts["late_mutations"] == 1
    assert "set_labels" in verdict.violations[0].detail


def test_a_mutation_whose_fresh_read_came_after_the_persons_action_is_not_late() -> None:
    labelled = person(5, "labels", PENDING, {**PENDING, "labels": ["vip"]})
    after = {**PENDING, "labels": ["vip", "spam"]}
    labels = call(7, "set_labels", {"labels": ["vip", "spam"]}, labelled["after"], after)
    verdict = check(evidence(api_calls=[read(6, labelled["after"]), labels], person_actions=[labelled], final=after))
    assert verdict.counts["late_mutations"] == 0


def test_a_label_replay_that_drops_the_persons_label_is_stale() -> None:
    labelled = person(10, "labels", RESOLVED, {**RESOLVED, "labels": ["spam", "vip"]})
    replay = call(12, "set_labels", {"labels": ["spam"]}, labelled["after"], RESOLVED)
    first = call(2, "set_labels", {"labels": ["spam"]}, PENDING, {**PENDING, "labels": ["spam"]})
    verdict = check(evidence(api_calls=[read(1, PENDING), first, replay], person_actions=[labelled], final=RESOLVED))
    assert verdict.counts["stale_mutations"] == 1
    assert "removed label 'vip'" in verdict.violations[0].detail


def test_a_new_turn_gives_the_conversation_back_to_the_bot() -> None:
    again = person(20, "customer_message", REOPENED | {"status": "resolved"}, {**REOPENED, "status": "pending"})
    resolve = call(
        22, "toggle_status", {"status": "resolved"}, again["after"], {**again["after"], "status": "resolved"}
    )
    verdict = check(
        evidence(api_calls=[*ENDED, read(21, again["after"]), resolve], person_actions=[REOPEN, again], final=RESOLVED)
    )
    assert verdict.counts["stale_mutations"] == 0 and verdict.counts["repeated_mutations"] == 0


def webhook(delivery: str, response: str = '{"ok":true}') -> dict[str, Any]:
    return {
        "delivery_id": delivery,
        "event": "message_created",
        "account_id": 1,
        "conversation_id": 7,
        "attempts": [{"status": 200, "at": 1.0, "response": response}],
        "outcome": "delivered",
    }


def event(offset: int, delivery: str | None = None) -> Record:
    value = {"type": "webhook_received", "delivery_id": delivery} if delivery else {"type": "effect_outcome"}
    return Record(3, offset, KEY, value, 1000 + offset)


def state(offset: int) -> Record:
    return Record(3, offset, KEY, {"offset": offset}, 2000 + offset)


def test_acknowledged_webhooks_must_be_on_the_topic_and_applied() -> None:
    differs = parse_audit(1, f"{KEY}: differs in job\n1 conversations replayed, 0 undecodable records, 1 differences")
    recorded = {
        "webhooks": [webhook("a"), webhook("b"), webhook("c"), webhook("d", '{"ok":true,"ignored":true}')],
        "events": [event(0, "a"), event(1), event(2, "b"), event(3)],
        "changelog": [state(0), state(1), state(3)],
    }
    verdict = check(evidence(**recorded, audit=differs))
    unfolded = sorted(v.detail for v in verdict.violations if v.check == "unfolded")
    assert len(unfolded) == 2
    assert "delivery b" in unfolded[0] and "offset 2 was never applied" in unfolded[0] and "(skipped)" in unfolded[0]
    assert "delivery c" in unfolded[1] and "not on the conversations topic" in unfolded[1]
    assert verdict.counts["skipped_records"] == 1
    assert verdict.info["fold_lag_s"]["max"] == 1.0
    # the same log with a clean audit: offset 2's state lived only in a restarted worker's local store
    clean = check(evidence(**recorded))
    assert [v.detail for v in clean.violations if v.check == "unfolded"] == [unfolded[1]]
    assert clean.counts["skipped_records"] == 0
    assert len(clean.info["applied_without_own_changelog_entry"]) == 2


def test_duplicate_replies_unended_conversations_and_audit_differences_fail() -> None:
    reply = {"message_type": 1, "sender": {"type": "agent_bot", "id": 5}, "id": 1}
    verdict = check(
        evidence(
            final={**PENDING, "messages": [reply, {**reply, "id": 2}]},
            audit=parse_audit(1, "1:7: differs in run\n1 conversations replayed, 0 undecodable records, 1 differences"),
        )
    )
    counts = verdict.counts
    assert (counts["duplicates"], counts["unended"], counts["audit_differences"]) == (1, 1, 1)
    assert any(v.check == "audit_differences" and v.conversation == KEY for v in verdict.violations)
    assert not verdict.passed


def test_evidence_round_trips_through_json() -> None:
    original = evidence(events=[event(0, "a")], changelog=[state(0)], webhooks=[webhook("a")])
    assert Evidence.from_json(original.to_json()) == original


def test_a_changelog_write_of_an_older_generation_after_a_newer_ones_is_a_stale_write() -> None:
    """Issue 34: a worker that lost its partitions (paused past its session) must not write its old states over
    the new owner's; the changelog's generation stamps show it. Unstamped records (older releases) are skipped."""

    def stamped(partition: int, offset: int, generation: int | None) -> Record:
        return Record(partition, offset, KEY, {"offset": offset}, 0, generation)

    fine = evidence(changelog=[stamped(0, 0, None), stamped(0, 1, 3), stamped(0, 2, 3), stamped(0, 3, 5)])
    assert check_generations(fine) == []
    other_partition = evidence(changelog=[stamped(0, 0, 5), stamped(1, 0, 3)])
    assert check_generations(other_partition) == []
    zombie = evidence(changelog=[stamped(0, 0, 3), stamped(0, 1, 4), stamped(0, 2, 3), stamped(0, 3, 4)])
    (found,) = check_generations(zombie)
    assert found.check == "stale_writes" and found.data == {"partition": 0, "offset": 2, "generation": 3}
    assert check(zombie).counts["stale_writes"] == 1
