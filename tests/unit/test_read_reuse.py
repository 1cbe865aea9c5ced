"""What the effect executor may serve again instead of asking Chatwoot (projections/worker/read_reuse.py, issue 40)."""

from __future__ import annotations

from typing import Any

from projections.worker.read_reuse import MAX_ENTRIES, TURN_KEPT_S, ReadReuse
from schemas.chatwoot import Conversation
from schemas.records import AgentsResult, InboxBotResult, MessageView, TurnResult

KEY = "1:7"


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def read(updated_at: float | None = 1000.5, name: str = "Evelyn", email: str = "e@example.org") -> Conversation:
    body: dict[str, Any] = {
        "id": 7,
        "inbox_id": 3,
        "status": "pending",
        "meta": {"sender": {"id": 9, "name": name, "email": email}},
        "updated_at": updated_at,
    }
    return Conversation.model_validate(body)


TURN = TurnResult(messages=(MessageView(id=11, message_type=0, conversation_id=7),), complete=True)


def reuse(clock: Clock, fresh_read_ms: int = 5000, settings_reuse_ms: int = 5000) -> ReadReuse:
    return ReadReuse(fresh_read_ms, settings_reuse_ms, clock)


def test_a_conversation_read_is_lent_once_to_the_turn_read_that_follows() -> None:
    clock = Clock()
    kept = reuse(clock)
    kept.read_conversation(KEY, read())
    assert kept.lend_conversation(KEY) == read()
    assert kept.lend_conversation(KEY) is None  # the next turn read reads for itself
    assert kept.lend_conversation("1:8") is None


def test_a_conversation_read_older_than_the_fresh_read_bound_is_not_lent() -> None:
    clock = Clock()
    kept = reuse(clock, fresh_read_ms=2000)
    kept.read_conversation(KEY, read())
    clock.now += 2.5
    assert kept.lend_conversation(KEY) is None


def test_a_mutation_takes_back_the_conversation_read_from_before_it() -> None:
    clock = Clock()
    kept = reuse(clock)
    kept.read_conversation(KEY, read())
    kept.mutated(KEY)
    assert kept.lend_conversation(KEY) is None


def test_a_turn_is_served_again_only_for_the_same_updated_at_and_contact() -> None:
    clock = Clock()
    kept = reuse(clock)
    kept.read_turn(KEY, read(), TURN)
    assert kept.turn(KEY, read()) == TURN
    assert kept.turn(KEY, read(updated_at=1000.6)) is None  # a message came, or the conversation changed
    assert kept.turn(KEY, read(name="Eve")) is None  # the redaction would differ
    assert kept.turn(KEY, read(email="eve@example.org")) is None
    assert kept.turn("1:8", read()) is None


def test_without_updated_at_nothing_proves_the_messages_unchanged() -> None:
    clock = Clock()
    kept = reuse(clock)
    kept.read_turn(KEY, read(updated_at=None), TURN)
    assert kept.turn(KEY, read(updated_at=None)) is None
    kept.read_turn(KEY, read(), TURN)
    assert kept.turn(KEY, read(updated_at=None)) is None


def test_a_turn_is_kept_for_a_minute_and_dropped_when_forgotten() -> None:
    clock = Clock()
    kept = reuse(clock)
    kept.read_turn(KEY, read(), TURN)
    clock.now += TURN_KEPT_S + 1
    assert kept.turn(KEY, read()) is None
    kept.read_turn(KEY, read(), TURN)
    kept.read_conversation(KEY, read())
    kept.forget(KEY)
    assert kept.turn(KEY, read()) is None and kept.lend_conversation(KEY) is None


def test_settings_are_reused_within_their_bound_and_never_past_the_fresh_read_bound() -> None:
    clock = Clock()
    kept = reuse(clock, fresh_read_ms=3000, settings_reuse_ms=10_000)
    link, agents = InboxBotResult(bot_id=5, bot_account_id=1), AgentsResult(agent_ids=(2, 3))
    kept.read_inbox_bot(1, 3, link)
    kept.read_agents(1, agents)
    clock.now += 2.9
    assert (kept.inbox_bot(1, 3), kept.agents(1)) == (link, agents)
    assert (kept.inbox_bot(1, 4), kept.inbox_bot(2, 3), kept.agents(2)) == (None, None, None)
    clock.now += 0.2  # 3.1 s: past the fresh-read bound, which caps the settings' 10 s
    assert (kept.inbox_bot(1, 3), kept.agents(1)) == (None, None)


def test_settings_reuse_0_reads_them_every_time() -> None:
    kept = reuse(Clock(), settings_reuse_ms=0)
    kept.read_inbox_bot(1, 3, InboxBotResult(bot_id=5, bot_account_id=1))
    kept.read_agents(1, AgentsResult(agent_ids=(2,)))
    assert (kept.inbox_bot(1, 3), kept.agents(1)) == (None, None)


def test_the_oldest_entries_go_first_past_the_bound() -> None:
    kept = reuse(Clock())
    for n in range(MAX_ENTRIES + 10):
        kept.read_turn(f"1:{n}", read(), TURN)
    assert kept.turn("1:0", read()) is None and kept.turn("1:9", read()) is None
    assert kept.turn("1:10", read()) == TURN and kept.turn(f"1:{MAX_ENTRIES + 9}", read()) == TURN
