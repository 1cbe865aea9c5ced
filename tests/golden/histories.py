"""Golden histories (DESIGN §8): recorded event logs replayed against the current fold in unit tests.

Each history is a directory under `tests/golden/` with:

- `meta.json`: the fold settings the log was recorded under (`retry_base_ms`) and where it came from;
- `config.json`: the routing configuration in force (no secrets: the fold never sees any);
- `<account>-<conversation>.events.jsonl`: one conversation's events, `{"offset": o, "record": {...}}` a line, in
  offset order, exactly as they were on `<app>.conversations`;
- `<account>-<conversation>.expected.jsonl`: per event, the commands and turn outcomes the fold must produce.

Record a new history from a running router (for example `chatwoot-router demo --keep-running`):

    .venv/bin/python -m tests.golden.histories record --bootstrap 127.0.0.1:19092 --app-id demo-1234abcd \\
        --config streams/demo/router.yaml --retry-base-ms 500 --out tests/golden/demo

After a deliberate change of behaviour, regenerate every expected file (then review the diff like code):

    .venv/bin/python -m tests.golden.histories regenerate
"""

from __future__ import annotations

import argparse
import asyncio
import json
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import TypeAdapter

from projections.fold import Event, fold
from schemas.config import RouterConfig, load_config_file
from schemas.state import ConversationState

ROOT = Path(__file__).resolve().parent
_EVENT: TypeAdapter[Event] = TypeAdapter(Event)


@dataclass
class History:
    """One recorded conversation log and what it must produce."""

    directory: Path
    name: str

    @property
    def events_path(self) -> Path:
        return self.directory / f"{self.name}.events.jsonl"

    @property
    def expected_path(self) -> Path:
        return self.directory / f"{self.name}.expected.jsonl"

    def events(self) -> list[tuple[int, Event]]:
        lines = self.events_path.read_text().splitlines()
        return [(int(row["offset"]), _EVENT.validate_python(row["record"])) for row in map(json.loads, lines)]

    def expected(self) -> list[dict[str, Any]]:
        return [json.loads(line) for line in self.expected_path.read_text().splitlines()]


def settings_of(directory: Path) -> tuple[RouterConfig, int]:
    config = RouterConfig.model_validate(json.loads((directory / "config.json").read_text()))
    meta = json.loads((directory / "meta.json").read_text())
    return config, int(meta["retry_base_ms"])


def histories(root: Path = ROOT) -> list[History]:
    return [
        History(path.parent, path.name.removesuffix(".events.jsonl")) for path in sorted(root.glob("*/*.events.jsonl"))
    ]


def replay(history: History) -> list[dict[str, Any]]:
    """Fold the history with the current code: per event, its commands and turn outcomes (as JSON)."""
    config, retry_base_ms = settings_of(history.directory)
    state = ConversationState()
    produced: list[dict[str, Any]] = []
    for offset, event in history.events():
        result = fold(state, event, offset, config, retry_base_ms=retry_base_ms)
        state = result.state
        produced.append(
            {
                "offset": offset,
                "commands": [c.model_dump(mode="json") for c in result.commands],
                "outcomes": [o.model_dump(mode="json", exclude_none=True) for o in result.outcomes],
            }
        )
    return produced


def regenerate(root: Path = ROOT) -> int:
    found = histories(root)
    for history in found:
        lines = [json.dumps(row, sort_keys=True) for row in replay(history)]
        history.expected_path.write_text("\n".join(lines) + "\n")
    return len(found)


async def record(bootstrap: str, app_id: str, config_path: Path, retry_base_ms: int, out: Path) -> int:
    """Write every conversation of `<app_id>.conversations` as a history under `out`."""
    from handlers.log_reader import read_topic

    by_key: dict[str, list[dict[str, Any]]] = defaultdict(list)

    def keep(raw: Any) -> None:
        try:
            event = _EVENT.validate_json(raw.value or b"")
        except ValueError:
            return
        by_key[event.key].append({"offset": raw.offset, "record": event.model_dump(mode="json")})

    await read_topic(bootstrap, f"{app_id}.conversations", keep)
    out.mkdir(parents=True, exist_ok=True)
    config = load_config_file(config_path)
    (out / "config.json").write_text(json.dumps(config.model_dump(mode="json", by_alias=True), indent=1) + "\n")
    meta = {"retry_base_ms": retry_base_ms, "recorded_from": f"{app_id}.conversations"}
    (out / "meta.json").write_text(json.dumps(meta, indent=1) + "\n")
    for key, rows in sorted(by_key.items()):
        rows.sort(key=lambda row: row["offset"])
        name = key.replace(":", "-")
        (out / f"{name}.events.jsonl").write_text("".join(json.dumps(r, sort_keys=True) + "\n" for r in rows))
    return len(by_key)


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m tests.golden.histories", description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    rec = sub.add_parser("record", help="record the histories of a running router's event log")
    rec.add_argument("--bootstrap", required=True)
    rec.add_argument("--app-id", required=True)
    rec.add_argument("--config", type=Path, required=True)
    rec.add_argument("--retry-base-ms", type=int, required=True)
    rec.add_argument("--out", type=Path, required=True)
    sub.add_parser("regenerate", help="rewrite every expected file with the current fold")
    args = parser.parse_args()
    if args.command == "record":
        count = asyncio.run(record(args.bootstrap, args.app_id, args.config, args.retry_base_ms, args.out))
        print(f"recorded {count} conversations into {args.out}; now run: regenerate")
    else:
        print(f"regenerated {regenerate()} histories")


if __name__ == "__main__":
    main()
