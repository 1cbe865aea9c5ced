"""Per-conversation and per-sweep state, as folded from the event log (behavior.md §4, §6.3, §7.6, §9.7).

A conversation's state is one value (`ConversationState`) so that it is written atomically with the offset it
last applied (DESIGN §5 "Idempotent folds"); each part also records the offset that last changed it, for
audits that compare parts table by table.
"""

from __future__ import annotations

from typing import Any, Literal, Self

from pydantic import BaseModel, ConfigDict, Field

from schemas.decision import Decision
from schemas.records import ConversationView, EffectCommand, TurnResult

# BaseModel's slots, set through their descriptors: `evolve` runs several times per folded record
_new = object.__new__
_set_dict = BaseModel.__dict__["__dict__"].__set__
_set_fields = BaseModel.__dict__["__pydantic_fields_set__"].__set__
_set_extra = BaseModel.__dict__["__pydantic_extra__"].__set__
_set_private = BaseModel.__dict__["__pydantic_private__"].__set__


class _State(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    def evolve(self, **update: Any) -> Self:
        """A copy with `update` applied, without validation: the folds change parts of already valid values
        many times per event, and `model_copy` costs several times more (the copy machinery, `fields_set`).
        A frozen model's set of fields set is never changed in place, so a copy that sets no new field shares it."""
        new = _new(self.__class__)
        _set_dict(new, {**self.__dict__, **update})
        fields = self.__pydantic_fields_set__
        _set_fields(new, fields if update.keys() <= fields else fields.union(update))
        _set_extra(new, None)
        _set_private(new, None)
        return new


class Expected(_State):
    """A status activity the next turn read must see (behavior.md §6.3 `expected`)."""

    status: str
    at: float | None = None
    after: int = 0


class TurnGuard(_State):
    """behavior.md §6.3; `offset` = the last event offset that changed it."""

    boundary: int | None = None
    claimed: bool | None = None
    pending: bool | None = None
    transition_at: float | None = None
    expected: Expected | None = None
    handoff: bool = False
    failures: int = 0
    offset: int = -1


class ReplyLedger(_State):
    """behavior.md §9.7: any value forbids a new send."""

    value: Literal["observed", "attempted"] | None = None
    offset: int = -1


class Memo(_State):
    """A stored System One decision (behavior.md §7.6, Decisions 2)."""

    decision: Decision
    offset: int = -1


class Job(_State):
    """The conversation's route job (behavior.md §4.1)."""

    version: int = 1
    attempts: int = 0
    not_before: int
    created_at: int
    offset: int = -1


Phase = Literal[
    "snapshot",  # waiting for get_conversation
    "inbox_bot",  # waiting for get_inbox_bot
    "disconnect_read",  # §9.8 re-read
    "disconnect_toggle",  # §9.8 toggle_status open
    "release_read",  # §9.9 re-read
    "release_unassign",  # §9.9 unassign
    "turn",  # waiting for read_turn
    "decide",  # waiting for System One
    "labels",
    "history",  # reply-history scan
    "canned",
    "send",  # create_message
    "agents",
    "ending",  # toggle_status to the kind's status, or assign
    "handoff_toggle",  # toggle_status open
]

# which fresh read a snapshot/turn read belongs to, i.e. where the procedure continues afterwards
Purpose = Literal["initial", "after_decide", "before_send", "before_end", "handoff"]


class Run(_State):
    """The route run in progress: phase, the pending command and what later steps need (DESIGN §6)."""

    number: int
    step: int = 0
    job_version: int
    phase: Phase = "snapshot"
    purpose: Purpose = "initial"
    pending: EffectCommand | None = None
    deadline_ms: int | None = None
    requests: int = 0
    inbox_id: int | None = None
    current: ConversationView | None = None
    first_turn: TurnResult | None = None
    input_key: str | None = None
    input_count: int = 0
    memo_key: str | None = None
    decision: Decision | None = None
    kind: str | None = None
    assignee: int | None = None
    fresh_handoff: bool = False
    handoff_reason: str | None = None
    canned_content: str | None = None
    labeled: bool = False
    replied: bool = False
    after_release: str | None = Field(default=None, description="outcome to report once a release finishes")
    read_updated_at: float | None = Field(
        default=None,
        description="Chatwoot's updated_at as the run's last conversation read saw it: a conversation webhook newer "
        "than that stops the mutation the read allowed (DESIGN §6)",
    )
    offset: int = -1


class ConversationState(_State):
    """Everything the fold keeps for one conversation; `offset` = last applied event offset."""

    offset: int = -1
    guard: TurnGuard = TurnGuard()
    ledger: ReplyLedger = ReplyLedger()
    memos: dict[str, Memo] = Field(default_factory=dict)
    job: Job | None = None
    run: Run | None = None
    runs: int = Field(default=0, description="runs started so far; the run number in command ids")
    config_version: str | None = Field(default=None, description="the configuration version it was last folded under")
    first_offset: int = Field(
        default=-1,
        description="offset of the conversation's first record in its partition (-1: not recorded): a reader of one "
        "conversation starts there instead of at the log start (DESIGN §8, readers at scale)",
    )
    first_version: str | None = Field(
        default=None, description="the configuration version in force at that first record (None: none applied)"
    )
    forgotten_ms: int | None = Field(
        default=None,
        exclude_if=lambda at: at is None,
        description="when the conversation was forgotten (issue 32): never routed again; its sealed fields are gone",
    )


class SweepJob(_State):
    version: int = 1
    attempts: int = 0
    not_before: int
    created_at: int


class SweepState(_State):
    """A sweep pass of one "acct:status" (behavior.md §5): cursor, job and the pending page command."""

    offset: int = -1
    cursor: int | None = Field(default=None, description="next page; None = page 1")
    job: SweepJob | None = None
    pending: EffectCommand | None = None
    deadline_ms: int | None = None
    running_version: int | None = Field(default=None, description="the job version the pending page runs for")
    pages: int = Field(default=0, description="page commands issued so far (the command id sequence)")
