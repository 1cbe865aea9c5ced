"""System One ("Jev") question texts and the decision read from its answers (behavior.md §7).

The instruction and criteria texts are this project's own wording (Decisions 5). They live here and only here:
the request body is built from them, and they are part of the decision memo's hash, so rewording them makes
the router decide again.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict

I_OWNER = "Choose who should handle this support ticket. Judge only from the ticket text."
I_TOPIC = "Choose the topic of this support ticket. Judge only from the ticket text."
I_REQUEST = "Choose whether the customer asks for anything in this ticket. Judge only from the ticket text."
I_KIND = "Choose the kind of this support ticket. Judge only from the ticket text."
C_UNCLEAR = (
    "There is no concrete request yet, or the ticket mixes several of the listed areas, or it is about a "
    "different product, or it cannot be given to exactly one of the listed owners."
)
C_REQUEST = (
    "The customer wants support, information or an action: a question about a product or service, a problem, "
    "or something to be done, even if stated briefly."
)
C_NONE_REQUEST = (
    "Nothing has been asked yet: a greeting or a check whether anyone is there (for example \"hi\" or "
    "\"hello, anyone there?\"), a test, only a name or contact details, or a few words that request nothing."
)
C_NONE_KIND = "None of the listed kinds."

FIXED_TEXTS: dict[str, str] = {
    "I_owner": I_OWNER,
    "I_topic": I_TOPIC,
    "I_request": I_REQUEST,
    "I_kind": I_KIND,
    "C_unclear": C_UNCLEAR,
    "C_request": C_REQUEST,
    "C_none_request": C_NONE_REQUEST,
    "C_none_kind": C_NONE_KIND,
}


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
