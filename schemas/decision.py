"""System One's decision as the router keeps it (behavior.md §7.4, §7.6): in outcomes, state and memos."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict


class Decision(BaseModel):
    """Jev's answers reduced to what the rules use (behavior.md §7.4); also the memo value (§7.6)."""

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)

    owner: str | None
    owner_confidence: float = 0.0
    topic: str | None = None
    topic_confidence: float = 0.0
    kind: str | None = None
    kind_confidence: float = 0.0
    no_request: bool = False
