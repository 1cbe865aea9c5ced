"""Reads the effect executor serves again instead of asking Chatwoot (issue 40: requests per conversation). Pure:
what is kept and for how long, against an injected clock; the executor (handlers/worker/effects.py) does the I/O.

Chatwoot's rate limit, not the router's CPU, is the first ceiling a busy help desk meets, and a route run reads
the same things several times: the turn read right after the snapshot's conversation read, the messages of a
conversation that has not changed since they were read, an inbox's bot link and an account's agents for every
conversation. What is kept here is invisible to the fold and to replay (an outcome is the same whether its read was
made or served; only its `requests` count is lower), and it never weakens "never overrule a person": every
mutation is still made only on a fresh read whose conversation was read from Chatwoot, within ROUTER_FRESH_READ_MS,
and after one more read right before the call (docs/architecture.md "A mutation is made only on a fresh read").

- **The conversation read** of a `get_conversation` is lent to the `read_turn` that follows it in the same fresh
  read (for the contact's identities, which redact the turn, and for `updated_at`), while it is younger than the
  fresh-read bound and no mutation of the conversation was made since.
- **The turn** is served again when the conversation read before it and the one now show the same `updated_at`
  and the same contact: Chatwoot touches a conversation's `updated_at` whenever one of its messages is created or
  changed (docs/chatwoot.md §4.12), so the same `updated_at` means the same messages, and the same pages.
- **An inbox's bot link and an account's agents** are administrators' settings, not conversation state; a worker
  reads each at most once per ROUTER_SETTINGS_REUSE_MS (default 5 s, never longer than the fresh-read bound).

Entries expire, are bounded in number, and a forgotten conversation's are dropped at once (`forget`): the turn
kept here is redacted text, never written anywhere.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Hashable
from typing import Generic, TypeVar

from schemas.chatwoot import Conversation
from schemas.records import AgentsResult, InboxBotResult, TurnResult

TURN_KEPT_S = 60.0
"""How long a turn is kept for reuse: a run's fresh reads come seconds apart; no longer than that holds text."""
MAX_ENTRIES = 4096
"""Per kind of read: about a burst's conversations; the oldest go first."""

Value = TypeVar("Value")


class _Recent(Generic[Value]):
    """Values by key, each served while younger than `max_age_s`, at most MAX_ENTRIES of them (oldest dropped)."""

    def __init__(self, max_age_s: float, clock: Callable[[], float]) -> None:
        self._max_age_s = max_age_s
        self._clock = clock
        self._entries: OrderedDict[Hashable, tuple[float, Value]] = OrderedDict()

    def get(self, key: Hashable) -> Value | None:
        entry = self._entries.get(key)
        if entry is None:
            return None
        at, value = entry
        if self._clock() - at > self._max_age_s:
            del self._entries[key]
            return None
        return value

    def put(self, key: Hashable, value: Value) -> None:
        if self._max_age_s <= 0:
            return
        self._entries[key] = (self._clock(), value)
        self._entries.move_to_end(key)
        while len(self._entries) > MAX_ENTRIES:
            self._entries.popitem(last=False)

    def drop(self, key: Hashable) -> None:
        self._entries.pop(key, None)


def _identity(conversation: Conversation) -> tuple[float | None, str | None, str | None]:
    """What a turn read depends on besides the messages: `updated_at` and the contact's identities."""
    contact = conversation.meta.sender
    return (
        conversation.updated_at,
        contact.name if contact is not None else None,
        contact.email if contact is not None else None,
    )


class ReadReuse:
    """The reads one executor may serve again; see the module docstring for why each is safe."""

    def __init__(self, fresh_read_ms: int, settings_reuse_ms: int, clock: Callable[[], float]) -> None:
        """`clock`: seconds on a monotonic clock (the executor's)."""
        self._conversations: _Recent[Conversation] = _Recent(fresh_read_ms / 1000, clock)
        self._turns: _Recent[tuple[tuple[float | None, str | None, str | None], TurnResult]] = _Recent(
            TURN_KEPT_S, clock
        )
        settings_s = min(settings_reuse_ms, fresh_read_ms) / 1000
        self._inbox_bots: _Recent[InboxBotResult] = _Recent(settings_s, clock)
        self._agents: _Recent[AgentsResult] = _Recent(settings_s, clock)

    # --- a conversation's reads ------------------------------------------------------------------------------

    def read_conversation(self, key: str, conversation: Conversation) -> None:
        """A `get_conversation` was answered: the turn read that follows may use it."""
        self._conversations.put(key, conversation)

    def lend_conversation(self, key: str) -> Conversation | None:
        """The conversation read a turn read may use instead of its own (taken: it is lent once)."""
        conversation = self._conversations.get(key)
        self._conversations.drop(key)
        return conversation

    def turn(self, key: str, conversation: Conversation) -> TurnResult | None:
        """The turn read before, if the conversation has not changed since (same `updated_at`, same contact)."""
        if conversation.updated_at is None:  # an older Chatwoot without it: nothing proves the messages unchanged
            return None
        kept = self._turns.get(key)
        if kept is None or kept[0] != _identity(conversation):
            return None
        return kept[1]

    def read_turn(self, key: str, conversation: Conversation, turn: TurnResult) -> None:
        """A turn was read after `conversation` was."""
        if conversation.updated_at is not None:
            self._turns.put(key, (_identity(conversation), turn))

    def mutated(self, key: str) -> None:
        """A mutation of the conversation was attempted: a conversation read from before it is no longer lent
        (the turn needs no dropping: the mutation moves `updated_at`, which a later read will show)."""
        self._conversations.drop(key)

    def forget(self, key: str) -> None:
        """The conversation was erased: nothing of it stays here."""
        self._conversations.drop(key)
        self._turns.drop(key)

    # --- settings ----------------------------------------------------------------------------------------------

    def inbox_bot(self, account: int, inbox: int) -> InboxBotResult | None:
        return self._inbox_bots.get((account, inbox))

    def read_inbox_bot(self, account: int, inbox: int, result: InboxBotResult) -> None:
        self._inbox_bots.put((account, inbox), result)

    def agents(self, account: int) -> AgentsResult | None:
        return self._agents.get(account)

    def read_agents(self, account: int, result: AgentsResult) -> None:
        self._agents.put(account, result)
