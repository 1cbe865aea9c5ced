"""A scripted Chatwoot and System One that plays against the fold, so fold tests read as stories.

`Driver` feeds events to `projections.fold.fold` with increasing offsets, executes every command it emits
against `FakeChatwoot` (the pure pagers drive the composite reads, like the real executor) and feeds the
outcomes back, until the conversation is idle. Every event is kept, so tests can replay the log.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from projections.fold import FoldResult, fold
from projections.redaction import sanitize
from projections.turn import ReplyHistoryScan, TurnPager
from schemas.config import RouterConfig, parse_config
from schemas.decision import Decision
from schemas.records import (
    AgentsResult,
    CannedResult,
    ConversationResult,
    ConversationView,
    CreateMessageResult,
    DecideResult,
    DoneResult,
    EffectCommand,
    EffectError,
    EffectOutcome,
    InboxBotResult,
    MessageView,
    OutcomeResult,
    ReplyHistoryResult,
    SweepFound,
    TimerFired,
    Transition,
    TurnOutcome,
    WebhookReceived,
)
from schemas.state import ConversationState

ACCOUNT, CONV, BOT, INBOX = 1, 2, 99, 5
T0 = 1_700_000_000_000  # epoch ms


def make_config(**overrides: Any) -> RouterConfig:
    document: dict[str, Any] = {
        "chatwoot": {"baseUrl": "http://127.0.0.1:3000"},
        "routing": {
            "botIds": {"1": BOT},
            "accounts": {
                "1": {
                    "billing": {"assignee": 7, "covers": "money"},
                    "tech": {"assignee": 8, "covers": "bugs"},
                }
            },
            "topics": {"invoices": "invoices", "outage": "outages"},
            "kinds": {
                "1": {
                    "refund": {"covers": "refunds", "cannedResponse": " refund "},
                    "spam": {"covers": "spam", "status": "resolved"},
                    "thanks": {"covers": "thanks", "status": "snoozed", "label": False},
                    "quiet": {"covers": "quiet", "label": False},
                }
            },
        },
    }
    document["routing"].update(overrides)
    return parse_config(document)


def incoming(mid: int, content: str, *, created_at: float | None = T0 / 1000, **kw: Any) -> MessageView:
    """An incoming customer message as the executor would record it (redacted text)."""
    kw.setdefault("private", False)
    kw.setdefault("sender_type", "contact")
    return MessageView(
        id=mid,
        message_type=0,
        created_at=created_at,
        conversation_id=CONV,
        text=sanitize("\n" + content, None, None),
        **kw,
    )


def activity(mid: int, status: str, *, created_at: float = T0 / 1000, **kw: Any) -> MessageView:
    return MessageView(
        id=mid,
        message_type=2,
        created_at=created_at,
        activity_type="conversation_status_changed",
        activity_status=status,
        conversation_id=CONV,
        **kw,
    )


def outgoing(
    mid: int, *, sender_type: str | None = "user", sender_id: int | None = 1, **kw: Any
) -> MessageView:
    kw.setdefault("private", False)
    return MessageView(
        id=mid, message_type=1, sender_type=sender_type, sender_id=sender_id, conversation_id=CONV, **kw
    )


def decision(
    owner: str | None = "billing",
    owner_confidence: float = 0.9,
    *,
    topic: str | None = None,
    topic_confidence: float = 0.9,
    kind: str | None = None,
    kind_confidence: float = 0.9,
    no_request: bool = False,
) -> Decision:
    return Decision(
        owner=owner,
        owner_confidence=owner_confidence,
        topic=topic,
        topic_confidence=topic_confidence,
        kind=kind,
        kind_confidence=kind_confidence,
        no_request=no_request,
    )


@dataclass
class FakeChatwoot:
    """Live Chatwoot + System One state the commands act on, with injectable failures."""

    conversation: ConversationView = field(
        default_factory=lambda: ConversationView(
            inbox_id=INBOX,
            status="pending",
            assignee_type="AgentBot",
            assignee_id=BOT,
            has_assignee=True,
            email_domain="example.org",
        )
    )
    messages: list[MessageView] = field(default_factory=list)
    inbox_bot: tuple[int | None, int | None] = (BOT, ACCOUNT)
    decision: Decision = field(default_factory=decision)
    canned: dict[str, str] = field(default_factory=lambda: {"refund": "We refund within 5 days."})
    agents: tuple[int, ...] = (7, 8)
    errors: dict[str, list[EffectError]] = field(default_factory=dict)
    lost: dict[str, int] = field(default_factory=dict)  # op -> how many outcomes to lose
    lost_after_call: dict[str, int] = field(default_factory=dict)  # op -> calls that happen, outcome lost
    cost: dict[str, int] = field(default_factory=dict)  # op -> requests to report instead
    bad_receipt: bool = False
    calls: list[EffectCommand] = field(default_factory=list)
    missing: bool = False

    def fail(self, op: str, kind: str = "failed", status: int | None = 503, times: int = 1) -> None:
        self.errors.setdefault(op, []).extend([EffectError(kind=kind, status=status)] * times)  # type: ignore[arg-type]

    def ops(self) -> list[str]:
        return [c.op for c in self.calls]

    def _pages(self, pager: TurnPager | ReplyHistoryScan) -> int:
        ordered = sorted(self.messages, key=lambda m: m.id)
        n = 0
        while (request := pager.next_request()) is not None:
            older = [m for m in ordered if request.before is None or m.id < request.before]
            pager.feed(older[-20:])
            n += 1
        return n

    def execute(self, command: EffectCommand) -> tuple[OutcomeResult | None, EffectError | None, int]:
        self.calls.append(command)
        p = command.params
        queued = self.errors.get(p.op)
        if queued:
            return None, queued.pop(0), 1
        if self.missing and p.op not in ("decide", "list_canned", "list_agents"):
            return None, EffectError(kind="missing", status=404), 1
        c = self.conversation
        match p.op:
            case "get_conversation":
                return ConversationResult(conversation=c), None, 1
            case "get_inbox_bot":
                return InboxBotResult(bot_id=self.inbox_bot[0], bot_account_id=self.inbox_bot[1]), None, 1
            case "read_turn":
                pager = TurnPager()
                n = self._pages(pager)
                return pager.result(), None, n
            case "decide":
                return DecideResult(decision=self.decision), None, 1
            case "set_labels":
                self.conversation = c.model_copy(update={"labels": p.labels})
                return DoneResult(op="set_labels"), None, 1
            case "scan_reply_history":
                scan = ReplyHistoryScan(p.bot_id)
                n = self._pages(scan)
                return ReplyHistoryResult(found=scan.result()), None, n
            case "list_canned":
                return CannedResult(content=self.canned.get(p.short_code)), None, 1
            case "create_message":
                mid = max((m.id for m in self.messages), default=0) + 1
                message = outgoing(mid, sender_type="agent_bot", sender_id=BOT, status="sent")
                self.messages.append(message)
                return CreateMessageResult(message=None if self.bad_receipt else message), None, 1
            case "list_agents":
                return AgentsResult(agent_ids=self.agents), None, 1
            case "toggle_status":
                update: dict[str, Any] = {"status": p.status}
                if p.status == "open" and c.assignee_type == "AgentBot":
                    update.update(assignee_type=None, assignee_id=None, has_assignee=False)
                self.conversation = c.model_copy(update=update)
                return DoneResult(op="toggle_status"), None, 1
            case "assign":
                self.conversation = c.model_copy(
                    update={"assignee_type": "User", "assignee_id": p.assignee_id, "status": "open"}
                )
                return DoneResult(op="assign"), None, 1
            case "unassign":
                self.conversation = c.model_copy(
                    update={"assignee_type": None, "assignee_id": None, "has_assignee": False}
                )
                return DoneResult(op="unassign"), None, 1
        raise AssertionError(f"unexpected op {p.op}")


@dataclass
class Driver:
    chatwoot: FakeChatwoot = field(default_factory=FakeChatwoot)
    config: RouterConfig = field(default_factory=make_config)
    retry_base_ms: int = 5000
    now: int = T0
    state: ConversationState = field(default_factory=ConversationState)
    offset: int = 0
    log: list[tuple[int, Any]] = field(default_factory=list)
    commands: list[EffectCommand] = field(default_factory=list)
    outcomes: list[TurnOutcome] = field(default_factory=list)
    queue: list[EffectCommand] = field(default_factory=list)
    wakeup: int | None = None

    def send(self, event: Any) -> FoldResult:
        self.offset += 1
        self.log.append((self.offset, event))
        result = fold(self.state, event, self.offset, self.config, retry_base_ms=self.retry_base_ms)
        self.state, self.wakeup = result.state, result.wakeup_ms
        self.commands.extend(result.commands)
        self.outcomes.extend(result.outcomes)
        self.queue.extend(result.commands)
        return result

    def webhook(self, transition: tuple[str, float] | None = None, event: str = "message_created") -> None:
        t = Transition(status=transition[0], at=transition[1]) if transition else None
        self.send(
            WebhookReceived(
                at_ms=self.now, account_id=ACCOUNT, conversation_id=CONV, event=event, transition=t
            )
        )
        self.settle()

    def sweep_found(self) -> None:
        self.send(SweepFound(at_ms=self.now, account_id=ACCOUNT, conversation_id=CONV, status="pending"))
        self.settle()

    def settle(self, limit: int = 200) -> None:
        """Execute queued commands (in order) and fold their outcomes until nothing is pending."""
        for _ in range(limit):
            if not self.queue:
                return
            command = self.queue.pop(0)
            op = command.params.op
            if self.chatwoot.lost.get(op, 0) > 0:
                self.chatwoot.lost[op] -= 1
                self.chatwoot.calls.append(command)
                continue
            result, error, requests = self.chatwoot.execute(command)
            if self.chatwoot.lost_after_call.get(op, 0) > 0:  # the call happened; its worker died before the outcome
                self.chatwoot.lost_after_call[op] -= 1
                continue
            requests = self.chatwoot.cost.get(op, requests)
            self.send(
                EffectOutcome(
                    at_ms=self.now,
                    key=command.key,
                    account_id=ACCOUNT,
                    command_id=command.command_id,
                    op=op,
                    result=result,
                    error=error,
                    requests=requests,
                )
            )
        raise AssertionError("the fold did not settle")

    def tick(self, to_ms: int | None = None) -> None:
        """Advance time to the next wake-up (or `to_ms`) and fire the timer, as the worker's wheel would."""
        due = self.wakeup if to_ms is None else to_ms
        assert due is not None, "no wake-up scheduled"
        self.now = max(self.now, due)
        self.send(TimerFired(at_ms=self.now, key=f"{ACCOUNT}:{CONV}", due_ms=due))
        self.settle()

    def last(self) -> TurnOutcome:
        return self.outcomes[-1]

    def mutations(self) -> list[EffectCommand]:
        reads = {"get_conversation", "get_inbox_bot", "read_turn", "decide", "scan_reply_history"}
        return [c for c in self.chatwoot.calls if c.op not in reads | {"list_canned", "list_agents"}]
