"""Where personal fields first enter a record, they are sealed (issue 32): the worker's reads seal the customer's
texts and the contact's e-mail domain before their outcome is written, and the System One call opens the sealed
input only in memory, to send it."""

from __future__ import annotations

from handlers.privacy.envelope import CannotOpen, DataKey
from projections.inputs import input_text
from projections.redaction import is_usable
from schemas.records import ConversationView, Decide, MessageView, TurnResult

TEXT = "text"
EMAIL_DOMAIN = "email_domain"


def message_field(message_id: int) -> str:
    """The field a message's sealed text belongs to: a sealed text opens only as the text of its own message."""
    return f"message:{message_id}"


def seal_message(view: MessageView, key: DataKey) -> MessageView:
    if view.text is None:
        return view
    return view.model_copy(
        update={
            "text": None,
            "sealed_text": key.seal(view.text, message_field(view.id)),
            "text_digest": key.digest(view.text, TEXT),
            "usable": is_usable(view.text),
        }
    )


def seal_turn(turn: TurnResult, key: DataKey) -> TurnResult:
    return turn.model_copy(update={"messages": tuple(seal_message(m, key) for m in turn.messages)})


def seal_conversation(view: ConversationView, key: DataKey) -> ConversationView:
    if view.email_domain is None:
        return view
    return view.model_copy(
        update={
            "email_domain": None,
            "sealed_email_domain": key.seal(view.email_domain, EMAIL_DOMAIN),
            "email_domain_digest": key.digest(view.email_domain, EMAIL_DOMAIN),
        }
    )


def open_input(decide: Decide, key: DataKey | None) -> str:
    """The text System One reads for `decide` (§6.5); `CannotOpen` when a part does not open under `key`."""
    if decide.text is not None:
        return decide.text
    if key is None:
        raise CannotOpen("no data key")
    message_ids = [int(mid) for mid in decide.input_key.split(",")] if decide.parts else []
    texts = [key.open(part, message_field(mid)) for part, mid in zip(decide.parts, message_ids, strict=True)]
    domain = key.open(decide.domain, EMAIL_DOMAIN) if decide.domain is not None else None
    return input_text(texts, domain)
