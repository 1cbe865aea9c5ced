"""Records on the conversation-keyed topics (DESIGN §4).

Every record is a pydantic model with a literal `type` and a schema version `v`; events carry their own time
(`at_ms`, epoch milliseconds) so the fold never reads a clock. The long-lived `conversations` topic holds only
what the rules read: no contact names, no e-mail addresses, no unredacted customer text.
"""

from __future__ import annotations

import hashlib
from typing import Annotated, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from schemas.decision import Decision
from schemas.keys import SweepKey, SweepStatus, conversation_key


class Record(BaseModel):
    """Base of every record: frozen, strict about unknown fields."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    v: int = 1
    at_ms: int = Field(description="event time, epoch milliseconds")


class Transition(BaseModel):
    """A status transition extracted from a conversation webhook (behavior.md §3.4)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    status: str
    at: float = Field(description="the webhook's updated_at, unix seconds (may be fractional)")


class WebhookReceived(Record):
    """A verified, relevant agent-bot webhook, normalised at the ingress."""

    type: Literal["webhook_received"] = "webhook_received"
    account_id: int
    conversation_id: int
    event: str = Field(description="Chatwoot event name, e.g. message_created")
    transition: Transition | None = None
    updated_at: float | None = None
    delivery_id: str | None = Field(default=None, description="X-Chatwoot-Delivery, kept for audit")

    @property
    def key(self) -> str:
        return conversation_key(self.account_id, self.conversation_id)


# --- other events on `<app>.conversations` ---


ForgetScope = Literal["conversation", "text"]
"""What an erasure destroys (issue 32): the whole conversation (`forget`, or Chatwoot deleted it: never routed
again), or only the text sealed so far (ROUTER_TEXT_RETENTION_DAYS: the decisions stay, routing goes on, and what
the customer writes next is sealed under a new data key)."""


def _whole(scope: str) -> bool:
    return scope == "conversation"


class ForgetRequested(Record):
    """`chatwoot-router forget` asks the worker that owns the conversation to erase it (issue 32): destroy its data
    key (the erasure fence on `<app>.keys`), then write `Forgotten`. No personal data: ids, a reason, a request id.
    The worker itself asks for scope `text` when a conversation's text outlived ROUTER_TEXT_RETENTION_DAYS."""

    type: Literal["forget_requested"] = "forget_requested"
    account_id: int
    conversation_id: int
    reason: str = Field(max_length=200, description="why, in the operator's words (no personal data)")
    request_id: str = Field(description="names the request; its `Forgotten` record carries it back")
    scope: ForgetScope = Field(default="conversation", exclude_if=_whole, description="what is erased (ForgetScope)")

    @property
    def key(self) -> str:
        return conversation_key(self.account_id, self.conversation_id)


class Forgotten(Record):
    """The proof of an erasure (issue 32): the conversation's data key was replaced by the erasure fence, durably,
    at `at_ms`; every sealed field of it is unreadable from then on, on every topic, disk and backup, and the
    conversation is never routed again. PII-free: the decisions and outcomes before it stay readable."""

    type: Literal["forgotten"] = "forgotten"
    account_id: int
    conversation_id: int
    reason: str
    request_id: str | None = Field(default=None, description="the `forget` request it answers; None if automatic")
    scope: ForgetScope = Field(
        default="conversation",
        exclude_if=_whole,
        description="`text`: only the text sealed before it is erased, and the conversation is still routed",
    )

    @property
    def key(self) -> str:
        return conversation_key(self.account_id, self.conversation_id)


class SweepFound(Record):
    """A conversation selected from a sweep page (behavior.md §5 step 3), admitted without a transition."""

    type: Literal["sweep_found"] = "sweep_found"
    account_id: int
    conversation_id: int
    status: SweepStatus = Field(description="which pass listed it")

    @property
    def key(self) -> str:
        return conversation_key(self.account_id, self.conversation_id)


class TimerFired(Record):
    """A durable timer came due for `key` (a conversation "acct:conv" or a sweep "acct:status")."""

    type: Literal["timer_fired"] = "timer_fired"
    key: str
    due_ms: int
    resume: bool = Field(
        default=False,
        description="sent by a worker that has just taken the key's partition over: re-issue the command the run "
        "waits for at once (reads and idempotent mutations; never a reply), as it may have died with the old owner",
    )


class SweepRequested(Record):
    """A request for a sweep pass of one account and status (on `<app>.sweeps`, keyed "acct:status")."""

    type: Literal["sweep_requested"] = "sweep_requested"
    account_id: int
    status: SweepStatus

    @property
    def key(self) -> str:
        return str(SweepKey(self.account_id, self.status))


# --- views: what the rules read from Chatwoot, and nothing more (DESIGN §4 "Privacy of the log") ---


class _View(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


def _absent(value: object) -> bool:
    """A sealed field that is not there is left out of the record, so records without one keep their bytes."""
    return value is None


SEALED = (
    "sealed under the conversation's data key (`s1.` + AES-256-GCM, handlers/privacy/envelope.py; docs/privacy.md): "
)
DIGEST = "a keyed digest (HMAC-SHA-256 under the conversation's data key) of the same plaintext: "


class ConversationView(_View):
    """The parts of `GET conversation` the rules read. The contact appears only as its e-mail domain."""

    inbox_id: int | None
    status: str | None
    labels: tuple[str, ...] = ()
    assignee_type: str | None = None
    assignee_id: int | None = None
    has_assignee: bool = Field(default=False, description="whether meta.assignee is an object")
    blocked: bool = False
    email_domain: str | None = Field(
        default=None,
        description="part of meta.sender.email after the first '@' (up to a second); None if no '@'. Records "
        "written before issue 32 only: since then the domain is sealed (`sealed_email_domain`)",
    )
    sealed_email_domain: str | None = Field(
        default=None, exclude_if=_absent, description=SEALED + "the contact's e-mail domain"
    )
    email_domain_digest: str | None = Field(
        default=None, exclude_if=_absent, description=DIGEST + "what the decision memo's key is made of"
    )
    updated_at: float | None = Field(
        default=None,
        description="Chatwoot's updated_at (unix seconds): a conversation webhook newer than this read shows a change "
        "made after it (DESIGN §6)",
    )


class MessageView(_View):
    """One message as the turn rules and the reply rules read it (behavior.md §6, §9.2, §9.7)."""

    id: int
    message_type: int
    private: bool | None = None
    status: str | None = None
    created_at: float | None = None
    sender_type: str | None = None
    sender_id: int | None = None
    deleted: bool = False
    auto_reply: bool = False
    activity_type: str | None = None
    activity_status: str | None = None
    conversation_id: int | None = None
    text: str | None = Field(
        default=None,
        description="redacted sanitize(subject + '\\n' + body) for incoming messages, else None. Records written "
        "before issue 32 only: since then the text is sealed (`sealed_text`)",
    )
    sealed_text: str | None = Field(default=None, exclude_if=_absent, description=SEALED + "the redacted text")
    text_digest: str | None = Field(
        default=None, exclude_if=_absent, description=DIGEST + "what the decision memo's key is made of"
    )
    usable: bool | None = Field(
        default=None,
        exclude_if=_absent,
        description="whether the sealed text says something besides redaction tokens (§6.5 step 4), decided when it "
        "was read",
    )


class Boundary(_View):
    """The status activity that starts the current turn."""

    id: int
    created_at: float | None = None
    activity_status: str | None = None


# --- effect commands (`<app>.effects`) ---


MAX_PAGES = 5  # the composite reads page at most this often (behavior.md §6.1, §9.7 step 1)


class _Params(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    max_requests: ClassVar[int] = 1
    """The most HTTP requests executing this command may make: the fold budgets and times it by this (§4.6)."""


class GetConversation(_Params):
    op: Literal["get_conversation"] = "get_conversation"


class GetInboxBot(_Params):
    op: Literal["get_inbox_bot"] = "get_inbox_bot"
    inbox_id: int


class ReadTurn(_Params):
    """Composite: the turn read of behavior.md §6.1 (driven by projections.turn.TurnPager): a conversation read
    (the contact's identities, for redaction) plus up to MAX_PAGES message pages."""

    max_requests: ClassVar[int] = 1 + MAX_PAGES
    op: Literal["read_turn"] = "read_turn"


class Decide(_Params):
    """System One call on the redacted input of §6.5; the questions come from the configuration.

    Since issue 32 the input is `parts` (the sealed texts, in order) and `domain` (the sealed e-mail domain), and
    the worker that asks System One opens them and builds the text (`projections/inputs.py:input_text`); `text`
    is the plaintext input of commands written before."""

    op: Literal["decide"] = "decide"
    input_key: str
    text: str | None = Field(default=None, exclude_if=_absent)
    parts: tuple[str, ...] = Field(default=(), exclude_if=lambda parts: not parts, description=SEALED + "texts")
    domain: str | None = Field(default=None, exclude_if=_absent, description=SEALED + "the e-mail domain")


class _Mutation(_Params):
    """A change of the conversation: the executor reads the conversation once more right before it and makes it
    only if nothing changed since the run's fresh read (DESIGN §6), so it may make two requests."""

    max_requests: ClassVar[int] = 2


class SetLabels(_Mutation):
    op: Literal["set_labels"] = "set_labels"
    labels: tuple[str, ...]


class ScanReplyHistory(_Params):
    """Composite: the reply-history scan of §9.7 step 1 (driven by projections.turn.ReplyHistoryScan), up to
    MAX_PAGES message pages."""

    max_requests: ClassVar[int] = MAX_PAGES
    op: Literal["scan_reply_history"] = "scan_reply_history"
    bot_id: int


class ListCanned(_Params):
    op: Literal["list_canned"] = "list_canned"
    short_code: str


class CreateMessage(_Mutation):
    op: Literal["create_message"] = "create_message"
    content: str


class ListAgents(_Params):
    op: Literal["list_agents"] = "list_agents"


class ToggleStatus(_Mutation):
    op: Literal["toggle_status"] = "toggle_status"
    status: Literal["open", "resolved", "snoozed"]


class Assign(_Mutation):
    op: Literal["assign"] = "assign"
    assignee_id: int


class Unassign(_Mutation):
    op: Literal["unassign"] = "unassign"


class ListConversations(_Params):
    op: Literal["list_conversations"] = "list_conversations"
    status: SweepStatus
    page: int


CommandParams = Annotated[
    GetConversation
    | GetInboxBot
    | ReadTurn
    | Decide
    | SetLabels
    | ScanReplyHistory
    | ListCanned
    | CreateMessage
    | ListAgents
    | ToggleStatus
    | Assign
    | Unassign
    | ListConversations,
    Field(discriminator="op"),
]

Op = Literal[
    "get_conversation",
    "get_inbox_bot",
    "read_turn",
    "decide",
    "set_labels",
    "scan_reply_history",
    "list_canned",
    "create_message",
    "list_agents",
    "toggle_status",
    "assign",
    "unassign",
    "list_conversations",
]

CONVERSATION_READS: frozenset[str] = frozenset(
    {"get_conversation", "get_inbox_bot", "read_turn", "scan_reply_history", "list_canned", "list_agents"}
)
"""The ops that only read a conversation's account (running one twice is harmless; a sweep page is not one)."""

MUTATIONS: frozenset[str] = frozenset({"set_labels", "create_message", "toggle_status", "assign", "unassign"})
"""The ops that change a conversation: each is made only on a fresh read (DESIGN §6, `ROUTER_FRESH_READ_MS`)."""


class EffectCommand(Record):
    """One external call. `command_id` is deterministic ("acct:conv:run:step"); `key` is the Kafka key."""

    type: Literal["effect_command"] = "effect_command"
    key: str = Field(description='"acct:conv" for route steps, "acct:status" for sweep pages')
    account_id: int
    command_id: str
    params: CommandParams

    @property
    def op(self) -> Op:
        return self.params.op

    def digest(self) -> str:
        """Names this exact copy of the command (id, issue time and parameters): see `EffectOutcome.answers`."""
        return hashlib.sha256(self.model_dump_json().encode()).hexdigest()[:32]


# --- effect outcomes (events on the command's key) ---


class ConversationResult(_Params):
    op: Literal["get_conversation"] = "get_conversation"
    conversation: ConversationView


class InboxBotResult(_Params):
    """The inbox's linked bot; `bot_id` None = unlinked (`null`, `{}` or no id)."""

    op: Literal["get_inbox_bot"] = "get_inbox_bot"
    bot_id: int | None = None
    bot_account_id: int | None = None


class TurnResult(_Params):
    """The turn read: messages after the boundary (oldest first), the boundary, and how the read ended."""

    op: Literal["read_turn"] = "read_turn"
    messages: tuple[MessageView, ...] = ()
    boundary: Boundary | None = None
    complete: bool = False
    deleted: bool = False


class DecideResult(_Params):
    op: Literal["decide"] = "decide"
    decision: Decision


class DoneResult(_Params):
    """A mutation answered 2xx."""

    op: Literal["set_labels", "toggle_status", "assign", "unassign"]


class ReplyHistoryResult(_Params):
    op: Literal["scan_reply_history"] = "scan_reply_history"
    found: Literal["found", "unknown", "complete_none"]


class CannedResult(_Params):
    """The content of the canned response with the exact short code, or None when there is none."""

    op: Literal["list_canned"] = "list_canned"
    content: str | None = None


class CreateMessageResult(_Params):
    """The receipt of the created message, or None when the body could not be read as a message."""

    op: Literal["create_message"] = "create_message"
    message: MessageView | None = None


class AgentsResult(_Params):
    op: Literal["list_agents"] = "list_agents"
    agent_ids: tuple[int, ...] = ()


class SweepRow(_View):
    id: int
    assignee_type: str | None = None
    assignee_id: int | None = None


class ConversationsPageResult(_Params):
    op: Literal["list_conversations"] = "list_conversations"
    rows: tuple[SweepRow, ...] = ()


OutcomeResult = Annotated[
    ConversationResult
    | InboxBotResult
    | TurnResult
    | DecideResult
    | DoneResult
    | ReplyHistoryResult
    | CannedResult
    | CreateMessageResult
    | AgentsResult
    | ConversationsPageResult,
    Field(discriminator="op"),
]


class EffectError(_View):
    """Why an effect did not produce a result. Carries only a class and an HTTP status, never a body."""

    kind: Literal["missing", "failed", "timeout", "unconfirmed", "stale_read", "throttled"] = Field(
        description="missing = JSON 404; failed = non-2xx (status) or network/shape error (status None); "
        "stale_read = a mutation not made because its fresh read was too old (ROUTER_FRESH_READ_MS) or its partition "
        "had not been folded up to the head its worker saw at assignment; throttled = a mutation not made because "
        "Chatwoot refused every try with 429 (its rate limit) until the command's deadline came near"
    )
    status: int | None = None
    reason: str | None = Field(default=None, description="short safe text, never a body")
    code: Literal["foreign_bot", "malformed_page"] | None = Field(
        default=None,
        description="a cause that keeps a conversation failing until someone fixes it (Decisions 9): the inbox "
        "is linked to a system bot or another account's bot, or a message page cannot be read",
    )


class EffectOutcome(Record):
    """What one effect command did: a result or an error, and how many HTTP requests it made."""

    type: Literal["effect_outcome"] = "effect_outcome"
    key: str
    account_id: int
    command_id: str
    op: Op
    result: OutcomeResult | None = None
    error: EffectError | None = None
    requests: int = 0
    rate_wait_ms: int = Field(
        default=0,
        exclude_if=lambda wait: wait == 0,  # absent when nothing waited: an unthrottled run's records keep their bytes
        description="how long this command's requests waited for Chatwoot's rate limit (the request budget, or a "
        "pause after a 429), in milliseconds",
    )
    answers: str | None = Field(
        default=None,
        description="the digest of the command copy this answers, when the worker ran a chained read before the"
        " fold issued it (DESIGN §6; the fold takes it only for that very copy)",
    )


MAX_CHAINED_OUTCOMES = 32
"""The most outcomes one `ChainedOutcomes` holds (a worker refuses a chain limit that could exceed it)."""


class ChainedOutcomes(Record):
    """The outcomes of reads the worker ran back to back for one conversation, in the order they ran (DESIGN §6).

    One event instead of one per read: the fold applies them in order, as if each were its own event at this
    record's offset, so the state, commands and turn outcomes are those of the separate events. Only reads are
    held back this way (a read lost in a crash is simply run again); any other command's outcome is an event of
    its own as soon as it is known. `at_ms` is the last outcome's time.
    """

    type: Literal["chained_outcomes"] = "chained_outcomes"
    key: str
    account_id: int
    outcomes: list[EffectOutcome] = Field(min_length=1, max_length=MAX_CHAINED_OUTCOMES)

    @model_validator(mode="after")
    def _one_conversation(self) -> ChainedOutcomes:
        if any(o.key != self.key or o.account_id != self.account_id for o in self.outcomes):
            raise ValueError("every chained outcome belongs to the record's conversation")
        if any(o.op not in CONVERSATION_READS for o in self.outcomes):
            raise ValueError("only the outcomes of conversation reads are chained")
        return self

    @classmethod
    def of(cls, outcomes: list[EffectOutcome]) -> ChainedOutcomes:
        last = outcomes[-1]
        return cls(key=last.key, account_id=last.account_id, outcomes=outcomes, at_ms=last.at_ms)


HISTORY_MISSING_HEADER = "router-history-missing"
"""A Kafka header on the first record `replay state --to-app` copies into a partition from a partial history: how
many records the source had lost before it (ASCII digits). The copy starts at offset 0, so without it the new app
could not tell that its history is partial."""

GENERATION_HEADER = "router-generation"
"""A Kafka header on every changelog record a worker writes: the consumer group generation it was in (ASCII
digits), so a write from a worker that had lost its partitions shows as an older generation after a newer one."""

MARKER_KEY = "config"
"""The Kafka key of every `ConfigApplied` marker (markers go to an explicit partition, so any key would do)."""


class ConfigApplied(Record):
    """Marker written into every partition of `conversations` and `sweeps` by `config apply` (DESIGN §8).

    From this record on, the partition is folded under configuration `version` (a document on `<app>.configs`),
    so a replay switches at exactly the same offset as the live worker did.
    """

    type: Literal["config_applied"] = "config_applied"
    key: str = MARKER_KEY
    version: str = Field(description="content hash of the configuration document")


def parse_marker(raw: bytes | None) -> ConfigApplied | None:
    """The `ConfigApplied` marker `raw` holds, or None for any other record."""
    if raw is None or b'"config_applied"' not in raw:
        return None
    try:
        return ConfigApplied.model_validate_json(raw)
    except ValueError:
        return None  # another record that merely quotes the word


ConversationEvent = Annotated[
    WebhookReceived | SweepFound | EffectOutcome | ChainedOutcomes | TimerFired | ForgetRequested | Forgotten,
    Field(discriminator="type"),
]
SweepEvent = Annotated[SweepRequested | EffectOutcome | TimerFired, Field(discriminator="type")]

TOPIC_RECORDS: dict[str, tuple[type[Record], ...]] = {
    "conversations": (
        WebhookReceived,
        SweepFound,
        EffectOutcome,
        ChainedOutcomes,
        TimerFired,
        ConfigApplied,
        ForgetRequested,
        Forgotten,
    ),
    "effects": (EffectCommand,),
    "sweeps": (SweepRequested, EffectOutcome, TimerFired, ConfigApplied),
}


class TurnOutcome(_View):
    """How a route run ended, for logs, metrics, the demo report and audits (not a topic record)."""

    key: str
    run: int
    at_ms: int
    result: Literal["assigned", "ended", "handed_off", "waited", "deferred", "nothing", "dropped", "retry"]
    reason: str | None = None
    status: str | None = Field(default=None, description="the status set by an 'ended' run")
    assignee_id: int | None = None
    labeled: bool = False
    replied: bool = False
    failures: int | None = Field(default=None, description="the turn's failure count after a 'retry'")
    delay_ms: int | None = None
