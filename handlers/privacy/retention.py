"""ROUTER_TEXT_RETENTION_DAYS (issue 32): a conversation's customer text is erased a set number of days after the
last text sealed under its data key (its last turn's reads), the decisions kept.

The erasure goes through the log like `forget`: the worker's scan writes a `ForgetRequested` of scope `text` for
each idle conversation whose key outlived the retention, and the worker that folds the request checks again (the
conversation may have started a turn since) before it destroys the key. Cost: the scan reads the owned
partitions' data keys (one per conversation, not per record), a bounded batch at a time.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Collection

from handlers.privacy.keyring import YIELD_EVERY, TableKeyRing
from schemas.keys import conversation_key_of
from schemas.records import ForgetRequested
from schemas.state import ConversationState

DAY_MS = 86_400_000
TEXT_RETENTION = "text_retention"
SCAN_BATCH = 500
"""Requests written per scan at most: a first scan over a long history spreads its erasures over several scans."""


def retention_ms(days: float | None) -> int | None:
    return None if days is None else int(days * DAY_MS)


def scan_every_s(retention: int) -> float:
    """How often the scan runs: a twentieth of the retention, between a second and ten minutes."""
    return min(600.0, max(1.0, retention / 20 / 1000))


def touch_every_ms(retention: int | None) -> int | None:
    """How stale a key's `used_ms` may be: an hour, or a twentieth of a shorter retention (tests)."""
    return None if retention is None else min(3_600_000, max(1, retention // 20))


def idle(state: ConversationState | None) -> bool:
    """Between turns: no job and no run (a run holds sealed fields of its turn), and not forgotten."""
    return state is None or (state.job is None and state.run is None and state.forgotten_ms is None)


class TextRetention:
    """Which conversations' text to erase now, and whether a folded request still holds."""

    def __init__(self, keyring: TableKeyRing, retention: int) -> None:
        self.keyring = keyring
        self.retention = retention
        self._asked: dict[str, int] = {}  # conversation -> the key use it was asked for (no second request)

    def due(self, conversation: str, state: ConversationState | None, now_ms: int) -> bool:
        return idle(state) and self.keyring.text_outlived(conversation, now_ms - self.retention)

    async def requests(
        self, owned: Collection[int], state_of: Callable[[str], ConversationState | None], now_ms: int
    ) -> list[ForgetRequested]:
        """The requests to write now: idle conversations of `owned` partitions whose key outlived the retention
        (at most `SCAN_BATCH`; the scan lets the worker's other work run every `YIELD_EVERY` keys)."""
        cutoff = now_ms - self.retention
        found: list[ForgetRequested] = []
        for seen, (conversation, used_ms) in enumerate(self.keyring.used_times(owned), 1):
            if seen % YIELD_EVERY == 0:
                await asyncio.sleep(0)
            if used_ms > cutoff or self._asked.get(conversation) == used_ms or not idle(state_of(conversation)):
                continue
            self._asked[conversation] = used_ms
            found.append(text_request(conversation, used_ms, now_ms))
            if len(found) >= SCAN_BATCH:
                break
        if len(self._asked) > 4 * SCAN_BATCH:
            self._asked.clear()  # a bound on memory; at worst a request is written twice (the second is a no-op)
        return found


def text_request(conversation: str, used_ms: int, now_ms: int) -> ForgetRequested:
    parsed = conversation_key_of(conversation)
    return ForgetRequested(
        at_ms=now_ms,
        account_id=parsed.account_id,
        conversation_id=parsed.conversation_id,
        reason=TEXT_RETENTION,
        request_id=f"{TEXT_RETENTION}:{used_ms}",
        scope="text",
    )
