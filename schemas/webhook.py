"""The agent-bot webhook payload as the door reads it (behavior.md §3.4, Decisions 3).

Only the fields that decide relevance and the record's content are modelled; extra fields are ignored and a
`null` optional field counts as absent. Ids are positive safe integers (JSON has one number type: 7.0 is 7).
"""

from __future__ import annotations

import math
from typing import Annotated, Any

from pydantic import BaseModel, BeforeValidator, ConfigDict, StrictBool, StrictStr, model_validator

_MAX_SAFE_INTEGER = 2**53 - 1


def _positive_id(value: Any) -> int:
    # JSON has one number type: 7.0 is the integer 7 to the sender (JavaScript), a boolean is not a number.
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError("not a number")
    if isinstance(value, float) and not value.is_integer():
        raise ValueError("not an integer")
    if not 0 < value <= _MAX_SAFE_INTEGER:
        raise ValueError("not a positive safe integer")
    return int(value)


def _number(value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError("not a number")
    try:
        number = float(value)
    except OverflowError:  # an integer beyond the float range
        raise ValueError("not a finite number") from None
    if not math.isfinite(number):
        raise ValueError("not a finite number")
    return number


PositiveId = Annotated[int, BeforeValidator(_positive_id)]
Number = Annotated[float, BeforeValidator(_number)]


class _Loose(BaseModel):
    """Extra fields are allowed (and ignored); a `null` optional field counts as absent (Decisions 3)."""

    model_config = ConfigDict(extra="ignore", frozen=True)

    @model_validator(mode="before")
    @classmethod
    def _null_is_absent(cls, data: Any) -> Any:
        if isinstance(data, dict):
            return {key: value for key, value in data.items() if value is not None}
        return data


class _Id(_Loose):
    id: PositiveId


class _Status(_Loose):
    # Both are required strings in §3.4; a `null` one is treated as absent, which yields no transition.
    previous_value: StrictStr | None = None
    current_value: StrictStr | None = None


class _Change(_Loose):
    status: _Status | None = None


class _Sender(_Loose):
    type: StrictStr | None = None


class WebhookPayload(_Loose):
    """The fields of an agent-bot webhook the door reads (§3.4); everything else is ignored."""

    event: StrictStr
    account: _Id
    id: PositiveId | None = None
    conversation: _Id | None = None
    message_type: StrictStr | Number | None = None
    private: StrictBool | None = None
    updated_at: Number | None = None
    changed_attributes: list[_Change] | None = None
    sender: _Sender | None = None
