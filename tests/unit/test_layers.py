"""The floors of the house (README "Layout", docs/architecture.md "The layers"): no import runs back up, the sandbox
stands beside the router, no import circle inside a package, and no folder grows past a dozen modules."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
NEVER = {
    "schemas": {"projections", "handlers", "streams", "sandbox"},
    "projections": {"handlers", "streams", "sandbox"},
    "handlers": {"streams", "sandbox"},
    "sandbox": {"projections", "handlers", "streams"},
}
MAX_MODULES = 12


def imports_of(path: Path) -> set[str]:
    """Every module a file imports at run time (imports under `if TYPE_CHECKING:` included: they are edges too)."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
            found.update(f"{node.module}.{alias.name}" for alias in node.names)
    return found


def modules(package: str) -> dict[str, Path]:
    return {
        ".".join(path.relative_to(ROOT).with_suffix("").parts): path
        for path in (ROOT / package).rglob("*.py")
        if "__pycache__" not in path.parts
    }


@pytest.mark.parametrize("floor", sorted(NEVER))
def test_no_import_runs_back_up(floor: str) -> None:
    wrong = {
        name: sorted(i for i in imports_of(path) if i.split(".")[0] in NEVER[floor])
        for name, path in modules(floor).items()
    }
    assert {name: found for name, found in wrong.items() if found} == {}


@pytest.mark.parametrize("package", ["schemas", "projections", "handlers", "streams", "sandbox"])
def test_no_import_circles(package: str) -> None:
    known = modules(package)
    graph = {
        name: {i for i in imports_of(path) if i in known and i != name and not name.startswith(i + ".")}
        for name, path in known.items()
    }
    cycles: list[list[str]] = []

    def visit(name: str, trail: list[str]) -> None:
        for target in sorted(graph[name]):
            if target in trail:
                cycles.append([*trail[trail.index(target) :], target])
            elif len(trail) < 30:
                visit(target, [*trail, target])

    for name in sorted(graph):
        visit(name, [name])
    assert cycles[:3] == []


@pytest.mark.parametrize("package", ["schemas", "projections", "handlers", "streams", "sandbox"])
def test_no_folder_holds_more_than_a_dozen_modules(package: str) -> None:
    folders = {path.parent for path in (ROOT / package).rglob("*.py") if "__pycache__" not in path.parts}
    crowded = {
        str(folder.relative_to(ROOT)): n
        for folder in folders
        if (n := sum(1 for p in folder.glob("*.py") if p.name != "__init__.py")) > MAX_MODULES
    }
    assert crowded == {}
