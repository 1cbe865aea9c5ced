"""The generated JSON Schema files match the models (DESIGN §4), and records round-trip through JSON."""

from __future__ import annotations

from schemas.generate import SCHEMA_DIR, expected_files
from schemas.records import (
    ConversationResult,
    ConversationView,
    EffectCommand,
    EffectOutcome,
    SetLabels,
)


def test_schema_files_match_the_models() -> None:
    wanted = expected_files()
    on_disk = {p.name: p.read_text(encoding="utf-8") for p in SCHEMA_DIR.glob("*.json")}
    assert sorted(on_disk) == sorted(wanted), "run `python -m schemas.generate`"
    for name, text in wanted.items():
        assert on_disk[name] == text, f"{name} drifted from its model: run `python -m schemas.generate`"


def test_outcome_results_are_discriminated_by_op() -> None:
    outcome = EffectOutcome(
        at_ms=1,
        key="1:2",
        account_id=1,
        command_id="1:2:1:1",
        op="get_conversation",
        result=ConversationResult(conversation=ConversationView(inbox_id=3, status="pending")),
        requests=1,
    )
    again = EffectOutcome.model_validate_json(outcome.model_dump_json())
    assert again == outcome
    assert isinstance(again.result, ConversationResult)


def test_command_round_trips_with_typed_params() -> None:
    command = EffectCommand(
        at_ms=1, key="1:2", account_id=1, command_id="1:2:1:4", params=SetLabels(labels=("billing",))
    )
    again = EffectCommand.model_validate_json(command.model_dump_json())
    assert again.op == "set_labels"
    assert again == command
