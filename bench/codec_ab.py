"""A/B for issue 25's decision on the model library: pydantic (today) against msgspec Structs, on the real records.

The records and table values may move to msgspec Structs only if this shows it clearly pays. Measured in one
process, alternating, on the recorded demo histories (`tests/golden/demo`, every record type of the log):

- decode: `schemas/codec.py`'s pydantic `TypeAdapter.validate_json` on bytes (validation while decoding) against
  msgspec's `json.decode` untyped (a floor: no validation at all), and, for the record types simple enough to
  mirror here (`webhook_received`, `timer_fired`), typed msgspec Structs against the same pydantic models;
- copy: the fold's copy of a state part (`_State.evolve`, `schemas/state.py`) against `msgspec.structs.replace` on a
  Struct of the same fields;
- the fold itself (`projections/fold.py` on the decoded records, replayed per conversation), for scale.

msgspec is not a dependency: install it where this script can import it, e.g.
`.venv/bin/pip install --target /tmp/msgspec msgspec` and `PYTHONPATH=/tmp/msgspec`.

    PYTHONPATH=/tmp/msgspec .venv/bin/python bench/codec_ab.py [--rounds 5]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import msgspec  # noqa: E402

from projections.fold import fold  # noqa: E402
from schemas.codec import decode_conversation_event  # noqa: E402
from schemas.records import TimerFired, WebhookReceived  # noqa: E402
from schemas.state import ConversationState, ReplyLedger  # noqa: E402
from tests.golden.histories import histories, settings_of  # noqa: E402

DEMO = ROOT / "tests" / "golden" / "demo"


class TransitionS(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    status: str
    at: float


class WebhookReceivedS(
    msgspec.Struct, frozen=True, forbid_unknown_fields=True, tag="webhook_received", tag_field="type"
):
    at_ms: int
    account_id: int
    conversation_id: int
    event: str
    v: int = 1
    transition: TransitionS | None = None
    updated_at: float | None = None
    delivery_id: str | None = None


class TimerFiredS(msgspec.Struct, frozen=True, forbid_unknown_fields=True, tag="timer_fired", tag_field="type"):
    at_ms: int
    key: str
    due_ms: int
    v: int = 1
    resume: bool = False


class StateS(msgspec.Struct, frozen=True):
    """The fields of `ConversationState`, flat (the parts themselves are opaque here)."""

    offset: int = -1
    guard: Any = None
    ledger: Any = None
    memos: Any = None
    job: Any = None
    run: Any = None
    runs: int = 0
    config_version: str | None = None
    first_offset: int = -1
    first_version: str | None = None


def records() -> list[bytes]:
    rows = []
    for history in histories():
        if history.directory.name == "demo":
            for line in history.events_path.read_text().splitlines():
                rows.append(json.dumps(json.loads(line)["record"], separators=(",", ":")).encode())
    return rows


def per_call_us(fn: Callable[[], object], n: int, rounds: int) -> float:
    """The best of `rounds` runs of `n` calls, in microseconds per call."""
    best = float("inf")
    for _ in range(rounds):
        started = time.perf_counter()
        for _ in range(n):
            fn()
        best = min(best, (time.perf_counter() - started) / n * 1e6)
    return best


def batch_us(fn: Callable[[bytes], object], items: list[bytes], rounds: int) -> float:
    best = float("inf")
    for _ in range(rounds):
        started = time.perf_counter()
        for item in items:
            fn(item)
        best = min(best, (time.perf_counter() - started) / len(items) * 1e6)
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    rounds = args.rounds
    raw = records() * 25
    simple = [r for r in raw if b'"type":"webhook_received"' in r or b'"type":"timer_fired"' in r]
    typed = msgspec.json.Decoder(WebhookReceivedS | TimerFiredS)
    untyped = msgspec.json.Decoder()
    state = ConversationState(offset=3, ledger=ReplyLedger(value="attempted"))
    flat = StateS(offset=3, ledger=state.ledger, memos={})
    simple_pydantic: Callable[[bytes], object] = lambda r: (  # noqa: E731
        WebhookReceived.model_validate_json(r) if b"webhook_received" in r else TimerFired.model_validate_json(r)
    )
    print(f"{len(raw):,} records ({len(simple):,} webhook_received/timer_fired), best of {rounds} rounds")
    results: dict[str, float] = {}
    for _ in range(2):  # alternate the two sides twice
        results["decode all: pydantic validate_json (today)"] = batch_us(decode_conversation_event, raw, rounds)
        results["decode all: msgspec untyped (no validation, floor)"] = batch_us(untyped.decode, raw, rounds)
        results["decode simple: pydantic models"] = batch_us(simple_pydantic, simple, rounds)
        results["decode simple: msgspec Structs"] = batch_us(typed.decode, simple, rounds)
        results["copy: _State.evolve (today)"] = per_call_us(partial(state.evolve, offset=5), 200_000, rounds)
        results["copy: msgspec.structs.replace"] = per_call_us(
            partial(msgspec.structs.replace, flat, offset=5), 200_000, rounds
        )
    config, retry_base_ms = settings_of(DEMO)
    logs = [
        [
            decode_conversation_event(json.dumps(json.loads(line)["record"]).encode())
            for line in h.events_path.read_text().splitlines()
        ]
        for h in histories()
        if h.directory.name == "demo"
    ]
    count = sum(len(log) for log in logs)
    best = float("inf")
    for _ in range(rounds):
        started = time.perf_counter()
        for log in logs:
            state = ConversationState()
            for offset, event in enumerate(log):
                state = fold(state, event, offset, config, retry_base_ms=retry_base_ms).state
        best = min(best, (time.perf_counter() - started) / count * 1e6)
    results["fold (projections/fold.py), per record"] = best
    for name, us in results.items():
        print(f"  {name:<56} {us:7.2f} µs")


if __name__ == "__main__":
    main()
