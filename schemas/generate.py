"""Write the JSON Schema of every topic record and table value into schemas/jsonschema/.

Run `python -m schemas.generate` after changing a model; tests/unit/test_records_schema.py fails while the
files and the models disagree, so the schemas consumers read are never written by hand.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from pydantic import BaseModel

from schemas.configs import ConfigDocument
from schemas.records import (
    ChainedOutcomes,
    ConfigApplied,
    EffectCommand,
    EffectOutcome,
    SweepFound,
    SweepRequested,
    TimerFired,
    WebhookReceived,
)
from schemas.state import ConversationState, SweepState

SCHEMA_DIR = Path(__file__).with_name("jsonschema")

MODELS: tuple[type[BaseModel], ...] = (
    WebhookReceived,
    SweepFound,
    EffectOutcome,
    ChainedOutcomes,
    TimerFired,
    EffectCommand,
    SweepRequested,
    ConversationState,
    SweepState,
    ConfigApplied,
    ConfigDocument,
)


def render(model: type[BaseModel]) -> str:
    """The schema file's exact text (validation mode: what a producer must write)."""
    return json.dumps(model.model_json_schema(), indent=2, sort_keys=True, ensure_ascii=False) + "\n"


def expected_files() -> dict[str, str]:
    return {f"{model.__name__}.json": render(model) for model in MODELS}


def main() -> int:
    SCHEMA_DIR.mkdir(exist_ok=True)
    wanted = expected_files()
    for stale in SCHEMA_DIR.glob("*.json"):
        if stale.name not in wanted:
            stale.unlink()
    for name, text in wanted.items():
        (SCHEMA_DIR / name).write_text(text, encoding="utf-8")
    print(f"wrote {len(wanted)} schemas to {SCHEMA_DIR}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
