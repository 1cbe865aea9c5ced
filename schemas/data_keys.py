"""Records of `<app>.keys` (issue 32): each conversation's data key, wrapped by the key-encryption key, or the
erasure fence that replaced it. Compacted: the latest value of a conversation's key is the one that counts, and
once compaction has run an erased key is gone from every broker."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter

EraseScope = Literal["conversation", "text"]
"""The whole conversation (never routed again), or only the text sealed so far (schemas/records.py ForgetScope)."""


class _KeyRecord(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    v: Literal[1] = 1
    key: str = Field(description="the conversation key `acct:conv`")


class WrappedDataKey(_KeyRecord):
    """A conversation's data key, sealed under the KEK named by `kek_id` (handlers/privacy/envelope.py)."""

    type: Literal["data_key"] = "data_key"
    kek_id: str
    wrapped: str
    created_ms: int
    contact_id: int | None = Field(
        default=None, description="the Chatwoot contact the conversation belongs to, an id only (`forget --contact`)"
    )
    used_ms: int | None = Field(
        default=None,
        exclude_if=lambda at: at is None,
        description="when a text was last sealed under it (kept only with ROUTER_TEXT_RETENTION_DAYS, at most "
        "`TOUCH_EVERY_MS` stale): the retention counts from it",
    )

    fence_ms: int | None = Field(
        default=None,
        exclude_if=lambda at: at is None,
        description="made over a text fence (ROUTER_TEXT_RETENTION_DAYS) written then and not yet written again: "
        "its owner writes this key again (without it) once that erasure's deadline has passed, as it would the "
        "fence (`again_ms`), so the cleaner removes the erased key's old value from a quiet partition too",
    )

    @property
    def last_used_ms(self) -> int:
        return self.used_ms if self.used_ms is not None else self.created_ms


class ErasedKey(_KeyRecord):
    """The erasure fence: the conversation was forgotten, its data key destroyed; no key is ever made for it
    again, so nothing of it is sealed or routed after this. With scope `text` (ROUTER_TEXT_RETENTION_DAYS) only
    the key is destroyed: what was sealed under it is gone, and a new key is made when the customer writes again."""

    type: Literal["erased"] = "erased"
    at_ms: int
    reason: str = Field(description="the operator's reason, or `conversation_missing` / `text_retention`")
    scope: EraseScope = Field(default="conversation", exclude_if=lambda s: s == "conversation")
    request_id: str | None = Field(
        default=None,
        exclude_if=lambda r: r is None,
        description="the request it answers: a request delivered again after a crash writes its proof again",
    )
    contact_id: int | None = Field(
        default=None,
        exclude_if=lambda c: c is None,
        description="with scope `text`: the contact id of the key it replaced, so `forget --contact` still finds it",
    )
    again_ms: int | None = Field(
        default=None,
        exclude_if=lambda at: at is None,
        description="when its owner wrote it again, once the erasure deadline had passed: Kafka rolls a compacted "
        "topic's active segment only when a record is appended, so this write lets the cleaner remove the old key "
        "even from a partition nothing else writes to",
    )


KeyRecord = Annotated[WrappedDataKey | ErasedKey, Field(discriminator="type")]
KEY_RECORD: TypeAdapter[WrappedDataKey | ErasedKey] = TypeAdapter(KeyRecord)
