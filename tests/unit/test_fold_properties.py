"""Fold properties (DESIGN §5–§6): replay gives the same state and commands; duplicates change nothing."""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from projections.fold import fold
from schemas.state import ConversationState
from tests.unit.test_fold_driver import T0, Driver, FakeChatwoot, activity, decision, incoming

OPS = [
    "get_conversation",
    "get_inbox_bot",
    "read_turn",
    "decide",
    "set_labels",
    "list_agents",
    "assign",
    "toggle_status",
    "scan_reply_history",
    "list_canned",
    "create_message",
]

scenarios = st.fixed_dictionaries(
    {
        "owner": st.sampled_from(["billing", "tech", None]),
        "owner_confidence": st.sampled_from([0.5, 0.9]),
        "kind": st.sampled_from([None, "refund", "spam", "thanks", "quiet"]),
        "topic": st.sampled_from([None, "invoices"]),
        "no_request": st.booleans(),
        "texts": st.lists(
            st.sampled_from(["hi", "refund please", "jane@example.com", "bug"]), min_size=1, max_size=4
        ),
        "boundary": st.booleans(),
        "fail": st.lists(st.sampled_from(OPS), max_size=4),
        "lose": st.lists(st.sampled_from(OPS), max_size=2),
        "actions": st.lists(
            st.sampled_from(["webhook", "status", "tick", "sweep", "later"]), min_size=1, max_size=6
        ),
    }
)


def play(s: dict) -> Driver:  # type: ignore[type-arg]
    fake = FakeChatwoot(
        decision=decision(
            s["owner"], s["owner_confidence"], kind=s["kind"], topic=s["topic"], no_request=s["no_request"]
        )
    )
    first = 2 if s["boundary"] else 1
    fake.messages = ([activity(1, "pending")] if s["boundary"] else []) + [
        incoming(first + i, text) for i, text in enumerate(s["texts"])
    ]
    for op in s["fail"]:
        fake.fail(op)
    for op in s["lose"]:
        fake.lost[op] = fake.lost.get(op, 0) + 1
    d = Driver(chatwoot=fake)
    for n, action in enumerate(s["actions"]):
        if action == "webhook":
            d.webhook()
        elif action == "status":
            d.webhook(transition=("pending", T0 / 1000 + n), event="conversation_status_changed")
        elif action == "sweep":
            d.sweep_found()
        elif action == "later":
            d.now += 600_000
            d.sweep_found()
        elif d.wakeup is not None:
            d.tick()
    return d


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(scenarios)
def test_replaying_the_log_gives_the_same_state_and_commands(s: dict) -> None:  # type: ignore[type-arg]
    d = play(s)
    state = ConversationState()
    commands = []
    for offset, event in d.log:
        result = fold(state, event, offset, d.config)
        state = result.state
        commands += result.commands
    assert state == d.state
    assert commands == d.commands


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(scenarios)
def test_a_redelivered_event_changes_nothing(s: dict) -> None:  # type: ignore[type-arg]
    d = play(s)
    state = ConversationState()
    for offset, event in d.log:
        state = fold(state, event, offset, d.config).state
        again = fold(state, event, offset, d.config)
        assert again.state == state and again.commands == [] and again.outcomes == []


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(scenarios)
def test_a_reply_is_never_sent_twice_and_never_without_a_ledger(s: dict) -> None:  # type: ignore[type-arg]
    d = play(s)
    sends = [c for c in d.commands if c.op == "create_message"]
    assert len(sends) <= 1
    if sends:
        assert d.state.ledger.value == "attempted"
