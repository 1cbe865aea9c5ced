"""Golden histories (DESIGN §8): recorded event logs replayed against the current fold in unit tests.

Each history is a directory under `tests/golden/` with:

- either `configs.jsonl`: the configuration documents of `<app>.configs` in the order they were applied (routing
  configuration and fold settings, no secrets: the fold never sees any), and the events files then hold the
  `ConfigApplied` markers of the conversation's partition, so the fold switches versions where the log did;
- or, for a log recorded before configurations were events, `config.json` (the routing configuration) and
  `meta.json` (the fold settings, `retry_base_ms`), in force for the whole log;
- `<account>-<conversation>.events.jsonl`: one conversation's events, `{"offset": o, "record": {...}}` a line, in
  offset order, as they were on `<app>.conversations` (with its partition's markers, if versioned);
- `<account>-<conversation>.expected.jsonl`: per event, the commands and turn outcomes the fold must produce.

**Recorded files are never regenerated.** The events, `configs.jsonl`, `config.json` and `meta.json` files are
what an earlier release wrote, kept byte for byte: `MANIFEST.sha256` holds their sha256 (`sha256sum` format, run
`cd tests/golden && sha256sum -c MANIFEST.sha256`) and `tests/unit/test_golden.py` fails when one changes or goes
missing. Each record is decoded from its stored bytes by the worker's own decoder (`schemas/codec.py`), so a
change of a record's shape that cannot read the old records fails here. Such a change keeps the old records
readable with an *upcaster*: a function from the old record's JSON object to today's shape, registered for its
`type` in `schemas.codec.UPCASTERS` (see that module), with a test in `tests/unit/test_upcast.py`. Never
re-record or edit a recorded log to make a test pass.

Record a new history from a running router's log (for example `chatwoot-router demo --keep-running`) into a new
directory (`record` refuses one that already holds a recorded history), then seal it into the manifest and
write its expected files; the configuration versions come from `<app>.configs`:

    .venv/bin/python -m tests.golden.histories record --bootstrap 127.0.0.1:19092 --app-id demo-1234abcd \\
        --out tests/golden/NAME
    .venv/bin/python -m tests.golden.histories seal
    .venv/bin/python -m tests.golden.histories regenerate

(`tests/golden/config_change.py` drives the sandbox through a configuration change and records a history this
way; `tests/golden/config-change` was recorded by it.)

After a deliberate change of behaviour, regenerate the expected files (only `*.expected.jsonl` are written; then
review their diff like code):

    .venv/bin/python -m tests.golden.histories regenerate
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import re
from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from projections.fold import Event, fold, fold_under
from schemas.codec import decode_conversation_event, decode_marker
from schemas.config import RouterConfig, load_config_file
from schemas.configs import ConfigBook, ConfigDocument
from schemas.records import ConfigApplied
from schemas.state import ConversationState

ROOT = Path(__file__).resolve().parent
CONFIGS = "configs.jsonl"
MANIFEST = "MANIFEST.sha256"
EVENTS_SUFFIX = ".events.jsonl"
EXPECTED_SUFFIX = ".expected.jsonl"
SETTINGS = frozenset({CONFIGS, "config.json", "meta.json"})
# a line of an events file, as `record` writes it: the record's JSON is kept as the bytes between the braces
_LINE = re.compile(rb'\{"offset": ([0-9]+), "record": (\{.*\})\}')


def is_recorded(path: Path) -> bool:
    """Whether `path` is a recorded file (an earlier release's bytes: never rewritten) rather than an expectation."""
    return path.name.endswith(EVENTS_SUFFIX) or path.name in SETTINGS


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

    @property
    def versioned(self) -> bool:
        """Whether the log carries its configuration versions (markers and `configs.jsonl`)."""
        return (self.directory / CONFIGS).exists()

    def events(self) -> list[tuple[int, Event | ConfigApplied]]:
        """Each record decoded from its stored bytes as the worker decodes a `conversations` record: a marker, or
        an event through `schemas.codec` (its upcasters included); an undecodable record raises `Undecodable`."""
        events: list[tuple[int, Event | ConfigApplied]] = []
        for number, line in enumerate(self.events_path.read_bytes().splitlines(), 1):
            match = _LINE.fullmatch(line)
            if match is None:
                raise ValueError(f"{self.events_path}:{number}: not a recorded line")
            offset, raw = int(match[1]), match[2]
            events.append((offset, decode_marker(raw) or decode_conversation_event(raw)))
        return events

    def expected(self) -> list[dict[str, Any]]:
        return [json.loads(line) for line in self.expected_path.read_text().splitlines()]


def book_of(directory: Path) -> ConfigBook:
    """The configuration versions of a versioned history, in the order they were applied."""
    lines = (directory / CONFIGS).read_text().splitlines()
    return ConfigBook([ConfigDocument.model_validate_json(line) for line in lines])


def settings_of(directory: Path) -> tuple[RouterConfig, int]:
    """The configuration and retry base in force for a whole history (the first version of a versioned one)."""
    if (directory / CONFIGS).exists():
        first = book_of(directory).first
        assert first is not None, f"{directory / CONFIGS} is empty"
        return first.config, first.fold.retry_base_ms
    config = RouterConfig.model_validate(json.loads((directory / "config.json").read_text()))
    meta = json.loads((directory / "meta.json").read_text())
    return config, int(meta["retry_base_ms"])


def histories(root: Path = ROOT) -> list[History]:
    return [
        History(path.parent, path.name.removesuffix(".events.jsonl")) for path in sorted(root.glob("*/*.events.jsonl"))
    ]


def demo_logs() -> list[tuple[int, list[str]]]:
    """(conversation id, compact JSON records) of the demo's account-1 histories: the benchmarks fill topics of
    any size with them, each copy under a new id (`renamed`)."""
    logs = []
    for history in histories():
        account, conversation = history.name.split("-")
        if account != "1" or history.directory.name != "demo":
            continue
        rows = [json.loads(line)["record"] for line in history.events_path.read_text().splitlines()]
        logs.append((int(conversation), [json.dumps(r, separators=(",", ":")) for r in rows]))
    return logs


def renamed(record: str, old: int, new: int) -> str:
    """A compact record of account 1's conversation `old` as conversation `new` would have it."""
    return (
        record.replace(f'"key":"1:{old}"', f'"key":"1:{new}"')
        .replace(f'"command_id":"1:{old}:', f'"command_id":"1:{new}:')
        .replace(f'"conversation_id":{old},', f'"conversation_id":{new},')
    )


def interleaved(wanted: int, interleave: int = 50, first_id: int = 100_001) -> Iterator[tuple[str, str]]:
    """(key, compact record) of at least `wanted` records of the demo's histories (`demo_logs`), each copy renamed
    to the next conversation id from `first_id` (`renamed`), `interleave` conversations in flight at a time, each
    conversation's records in order: how the benchmarks and tests fill a topic of any size."""
    logs = demo_logs()
    written, started = 0, 0
    active: list[tuple[str, list[str], int]] = []  # (key, records, next index)
    while written < wanted or active:
        while len(active) < interleave and written < wanted:
            old, records = logs[started % len(logs)]
            new = first_id + started
            started += 1
            active.append((f"1:{new}", [renamed(r, old, new) for r in records], 0))
        still = []
        for key, records, index in active:
            yield key, records[index]
            written += 1
            if index + 1 < len(records):
                still.append((key, records, index + 1))
        active = still


def replay(history: History) -> list[dict[str, Any]]:
    """Fold the history with the current code: per event, its commands and turn outcomes (as JSON).

    A versioned history switches to a marker's version where the marker is, as a worker does; a marker row
    produces a row of its own (no commands, no outcomes, the version now in force).
    """
    state = ConversationState()
    produced: list[dict[str, Any]] = []
    if history.versioned:
        book, version = book_of(history.directory), None
    else:
        config, retry_base_ms = settings_of(history.directory)
    for offset, event in history.events():
        if isinstance(event, ConfigApplied):
            version = event.version if event.version in book else version
            produced.append({"offset": offset, "commands": [], "outcomes": [], "version": version})
            continue
        if history.versioned:
            document = book.in_force(version)
            assert document is not None, "a versioned history has at least one document"
            result = fold_under(document, state, event, offset)
        else:
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
    """Rewrite every expected file with the current fold; the recorded files are only read."""
    found = histories(root)
    for history in found:
        lines = [json.dumps(row, sort_keys=True) for row in replay(history)]
        write_expected(history.expected_path, "\n".join(lines) + "\n")
    return len(found)


def write_expected(path: Path, text: str) -> None:
    """The one place expected files are written: anything else under `tests/golden` is an earlier release's."""
    if not path.name.endswith(EXPECTED_SUFFIX) or is_recorded(path):
        raise ValueError(f"{path} is not an expected file: recorded files are never rewritten")
    path.write_text(text)


# --- the manifest of recorded files ------------------------------------------------------------------------


def recorded_files(root: Path = ROOT) -> list[Path]:
    """Every recorded file under `root`, by its path relative to `root`, sorted."""
    return sorted(p.relative_to(root) for p in root.rglob("*") if p.is_file() and is_recorded(p))


def digests(root: Path = ROOT) -> dict[str, str]:
    """sha256 of every recorded file under `root`, by relative path."""
    return {path.as_posix(): hashlib.sha256((root / path).read_bytes()).hexdigest() for path in recorded_files(root)}


def read_manifest(root: Path = ROOT) -> dict[str, str]:
    """The sealed digests (`<sha256>  <path>` a line, as `sha256sum` writes and checks them)."""
    sealed: dict[str, str] = {}
    for line in (root / MANIFEST).read_text().splitlines():
        digest, _, path = line.partition("  ")
        sealed[path] = digest
    return sealed


def seal(root: Path = ROOT) -> list[str]:
    """Add the recorded files the manifest does not list yet; an entry already there is never changed."""
    manifest = root / MANIFEST
    sealed = read_manifest(root) if manifest.exists() else {}
    new = {path: digest for path, digest in digests(root).items() if path not in sealed}
    entries = {**sealed, **new}
    manifest.write_text("".join(f"{entries[path]}  {path}\n" for path in sorted(entries)))
    return sorted(new)


async def record(
    bootstrap: str, app_id: str, out: Path, config_path: Path | None = None, retry_base_ms: int | None = None
) -> int:
    """Write every conversation of `<app_id>.conversations` as a history under `out`.

    With configuration versions on the log (`<app>.configs`), the history is versioned: each conversation's
    file holds its partition's markers too. Without, `config_path` and `retry_base_ms` say what was in force.
    """
    already = [p for p in out.glob("*") if is_recorded(p)] if out.exists() else []
    if already:
        raise SystemExit(f"{out} already holds a recorded history: record into a new directory (never re-record)")
    from handlers.kafka.config_store import read_book
    from handlers.kafka.topic_io import read_topic

    by_key: dict[str, list[dict[str, Any]]] = defaultdict(list)
    markers: dict[int, list[dict[str, Any]]] = defaultdict(list)
    partition_of: dict[str, int] = {}

    def keep(raw: Any) -> None:
        try:
            parsed: Event | ConfigApplied = decode_marker(raw.value) or decode_conversation_event(raw.value)
        except ValueError:
            return
        row = {"offset": raw.offset, "record": json.loads(raw.value)}  # as the topic holds it, not re-dumped
        if isinstance(parsed, ConfigApplied):
            markers[raw.partition].append(row)
        else:
            by_key[parsed.key].append(row)
            partition_of[parsed.key] = raw.partition

    await read_topic(bootstrap, f"{app_id}.conversations", keep)
    book = await read_book(bootstrap, app_id)
    out.mkdir(parents=True, exist_ok=True)
    if len(book):
        lines = [d.model_dump_json() for d in book.documents()]
        (out / CONFIGS).write_text("\n".join(lines) + "\n")
    else:
        if config_path is None or retry_base_ms is None:
            raise SystemExit(f"{app_id}.configs holds no version: pass --config and --retry-base-ms")
        config = load_config_file(config_path)
        body = config.model_dump(mode="json", by_alias=True)
        (out / "config.json").write_text(json.dumps(body, indent=1) + "\n")
        meta = {"retry_base_ms": retry_base_ms, "recorded_from": f"{app_id}.conversations"}
        (out / "meta.json").write_text(json.dumps(meta, indent=1) + "\n")
    for key, rows in sorted(by_key.items()):
        rows = rows + (markers[partition_of[key]] if len(book) else [])
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
    rec.add_argument("--config", type=Path, help="only for a log without configuration versions")
    rec.add_argument("--retry-base-ms", type=int, help="only for a log without configuration versions")
    rec.add_argument("--out", type=Path, required=True)
    sub.add_parser("regenerate", help="rewrite every expected file with the current fold (never a recorded file)")
    sub.add_parser("seal", help=f"add newly recorded files to {MANIFEST} (never changes an entry)")
    args = parser.parse_args()
    if args.command == "record":
        count = asyncio.run(record(args.bootstrap, args.app_id, args.out, args.config, args.retry_base_ms))
        print(f"recorded {count} conversations into {args.out}; now run: seal, then regenerate")
    elif args.command == "seal":
        added = seal()
        print(f"sealed {len(added)} recorded files into {ROOT / MANIFEST}")
    else:
        print(f"regenerated {regenerate()} histories")


if __name__ == "__main__":
    main()
