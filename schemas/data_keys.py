"""Records of `<app>.keys` (issue 32): each conversation's data key, wrapped by the key-encryption key, or the
erasure fence that replaced it. Compacted: the latest value of a conversation's key is the one that counts, and
once compaction has run an erased key is gone from every broker."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter


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


class ErasedKey(_KeyRecord):
    """The erasure fence: the conversation was forgotten, its data key destroyed; no key is ever made for it
    again, so nothing of it is sealed or routed after this."""

    type: Literal["erased"] = "erased"
    at_ms: int
    reason: str = Field(description="the operator's reason, or `conversation_missing` / `text_retention`")


KeyRecord = Annotated[WrappedDataKey | ErasedKey, Field(discriminator="type")]
KEY_RECORD: TypeAdapter[WrappedDataKey | ErasedKey] = TypeAdapter(KeyRecord)
