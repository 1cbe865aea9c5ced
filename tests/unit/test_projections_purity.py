"""Everything under `projections/` is pure: no clock, no randomness, no I/O, no network (STYLE: "the fold's clock
is the event's time, nothing else"; the agents' logic is testable without a broker).

Each module is parsed with `ast`, not imported, and fails on:

- an import of a module that reads the clock, draws randomness, touches files, processes, the environment or
  the network, or logs (logging handlers write to streams and files), or of the layers that do (`handlers`,
  `streams`): see FORBIDDEN;
- a call that reads the clock or the local time zone through an allowed module: `datetime.now()`,
  `datetime.utcnow()`, `date.today()`, and `datetime.fromtimestamp(...)` without a time zone;
- a call of the built-ins `open`, `print`, `input`, `breakpoint` or `__import__`.

`datetime` itself is allowed: turning an event's epoch milliseconds into a UTC date (`fromtimestamp(ms / 1000,
tz=UTC)`) is a pure function. Only each module's own imports are checked; what `schemas` imports is its own
business (it loads configuration files).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PROJECTIONS = Path(__file__).resolve().parents[2] / "projections"

# a module is forbidden when it is one of these or inside one of them (`urllib.request`, `os.path`, …)
FORBIDDEN = {
    # clock
    "time": "the clock",
    "sched": "the clock",
    # randomness
    "random": "randomness",
    "secrets": "randomness",
    "uuid": "randomness (uuid1 and uuid4)",
    # files, processes, the environment
    "os": "files and the environment",
    "sys": "the process's streams and state",
    "io": "I/O",
    "pathlib": "files",
    "shutil": "files",
    "tempfile": "files",
    "glob": "files",
    "fileinput": "files",
    "sqlite3": "files",
    "rocksdict": "files",
    "subprocess": "processes",
    "signal": "processes",
    "multiprocessing": "processes",
    "threading": "threads",
    "concurrent": "threads and processes",
    "importlib": "loading code at run time",
    "logging": "I/O (log handlers)",
    # network
    "socket": "the network",
    "ssl": "the network",
    "select": "the network",
    "selectors": "the network",
    "asyncio": "the event loop (sleeping, sockets, subprocesses)",
    "urllib.request": "the network",
    "http.client": "the network",
    "http.server": "the network",
    "httpx": "the network",
    "aiohttp": "the network",
    "requests": "the network",
    "aiokafka": "the network (Kafka)",
    "kafka": "the network (Kafka)",
    "faust": "the network (Kafka) and the event loop",
    "mode": "the event loop (Faust's services)",
    # the layers that do I/O
    "handlers": "the I/O layer (handlers/)",
    "streams": "the Kafka wiring (streams/)",
}
CLOCK_CALLS = {"now", "utcnow", "today"}  # datetime.now(), datetime.utcnow(), date.today(), datetime.today()
LOCAL_TIME_CALLS = {"fromtimestamp"}  # without tz=..., it reads the local time zone
FORBIDDEN_BUILTINS = {"open", "print", "input", "breakpoint", "__import__"}


def modules() -> list[Path]:
    return sorted(PROJECTIONS.rglob("*.py"))


def forbidden_module(name: str) -> str | None:
    for module, why in FORBIDDEN.items():
        if name == module or name.startswith(module + "."):
            return why
    return None


def impurities(source: str) -> list[str]:
    """Every line of `source` that imports or calls something impure, as `line N: what (why)`."""
    found: list[str] = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            for alias in node.names:
                why = forbidden_module(alias.name)
                if why:
                    found.append(f"line {node.lineno}: import {alias.name} ({why})")
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            for alias in node.names:
                why = forbidden_module(f"{node.module}.{alias.name}") or forbidden_module(node.module)
                if why:
                    found.append(f"line {node.lineno}: from {node.module} import {alias.name} ({why})")
        elif isinstance(node, ast.Call):
            func = node.func
            if isinstance(func, ast.Attribute) and func.attr in CLOCK_CALLS:
                found.append(f"line {node.lineno}: .{func.attr}() (the clock)")
            elif (
                isinstance(func, ast.Attribute)
                and func.attr in LOCAL_TIME_CALLS
                and len(node.args) < 2
                and not any(keyword.arg == "tz" for keyword in node.keywords)
            ):
                found.append(f"line {node.lineno}: .{func.attr}() without tz (the local time zone)")
            elif isinstance(func, ast.Name) and func.id in FORBIDDEN_BUILTINS:
                found.append(f"line {node.lineno}: {func.id}() (I/O)")
    return found


def test_there_are_projections_to_check() -> None:
    assert PROJECTIONS.is_dir()
    assert len(modules()) > 10


@pytest.mark.parametrize("path", modules(), ids=lambda path: str(path.relative_to(PROJECTIONS)))
def test_projection_module_is_pure(path: Path) -> None:
    found = impurities(path.read_text(encoding="utf-8"))
    assert not found, f"projections/{path.relative_to(PROJECTIONS)} is not pure:\n" + "\n".join(found)


@pytest.mark.parametrize(
    "source",
    [
        "import time",
        "import os.path",
        "from os import environ",
        "from random import choice",
        "import uuid",
        "from urllib.request import urlopen",
        "from aiokafka import AIOKafkaProducer",
        "import logging",
        "from handlers.worker.effects import EffectExecutor",
        "from datetime import datetime\nx = datetime.now()",
        "import datetime\nx = datetime.date.today()",
        "from datetime import datetime\nx = datetime.fromtimestamp(0)",
        "x = open('f').read()",
        "print('x')",
    ],
)
def test_the_check_catches(source: str) -> None:
    assert impurities(source)


@pytest.mark.parametrize(
    "source",
    [
        "from datetime import UTC, datetime\nx = datetime.fromtimestamp(0, tz=UTC)",
        "from datetime import UTC, datetime\nx = datetime.fromtimestamp(0, UTC)",
        "from urllib.parse import urlsplit",
        "from http import HTTPStatus",
        "import hashlib, hmac, json, re, math, heapq",
        "from schemas.records import EffectCommand",
        "from projections.fold import fold",
        "from . import fold",
    ],
)
def test_the_check_allows(source: str) -> None:
    assert impurities(source) == []
