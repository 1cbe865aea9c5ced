"""Fault injection per API operation, so tests can make Chatwoot or System One misbehave on cue.

Modes:
- `fail`: answer `status` (JSON or text body) *before* applying the request; a 3xx carries a Location;
- `apply_then_fail`: apply the request, then answer `status` (the caller cannot know it worked);
- `apply_then_drop`: apply the request, then close the connection without an answer;
- `respond`: answer `status` (default 200) with `body` instead of the real answer, without applying (to feed
  the client shapes Chatwoot might send); `content_type: text` sends `body` as text;
- `delay`: only wait `delay_ms`, then behave normally (`delay_ms` also delays the other modes).
`times` limits how often a rule fires (None = every time); `account_id` / `conversation_id` narrow it.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, Literal

Mode = Literal["fail", "apply_then_fail", "apply_then_drop", "respond", "delay"]
MODES = ("fail", "apply_then_fail", "apply_then_drop", "respond", "delay")

# Operation names, as the sandbox's API log and fault rules call them.
OPERATIONS = (
    "get_conversation",
    "list_conversations",
    "conversations_meta",
    "list_messages",
    "create_message",
    "toggle_status",
    "assign",
    "get_labels",
    "set_labels",
    "get_inbox_bot",
    "list_canned",
    "list_agents",
    "systemone",
)


@dataclass
class Fault:
    op: str
    mode: Mode = "fail"
    status: int = 500
    delay_ms: int = 0
    times: int | None = 1
    content_type: Literal["json", "text"] = "json"
    account_id: int | None = None
    conversation_id: int | None = None
    body: Any = None
    fired: int = 0

    @classmethod
    def parse(cls, raw: dict[str, Any]) -> Fault:
        fields = {k: v for k, v in raw.items() if k != "fired"}
        if fields.get("mode") == "respond":
            fields.setdefault("status", 200)
        fault = cls(**fields)
        if fault.op not in OPERATIONS:
            raise ValueError(f"unknown op {fault.op!r}; one of {', '.join(OPERATIONS)}")
        if fault.mode not in MODES:
            raise ValueError(f"unknown mode {fault.mode!r}; one of {', '.join(MODES)}")
        return fault

    def matches(self, op: str, account_id: int | None, conversation_id: int | None) -> bool:
        if op != self.op or (self.times is not None and self.fired >= self.times):
            return False
        if self.account_id is not None and self.account_id != account_id:
            return False
        return self.conversation_id is None or self.conversation_id == conversation_id

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


class FaultPlan:
    """The active fault rules; the first matching rule fires and is used up once."""

    def __init__(self) -> None:
        self.rules: list[Fault] = []

    def add(self, fault: Fault) -> None:
        self.rules.append(fault)

    def clear(self) -> None:
        self.rules.clear()

    def take(self, op: str, account_id: int | None = None, conversation_id: int | None = None) -> Fault | None:
        for rule in self.rules:
            if rule.matches(op, account_id, conversation_id):
                rule.fired += 1
                return rule
        return None
