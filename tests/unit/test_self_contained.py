"""The repository stands on its own (issue 41): no tracked file points at documents outside it, and every citation of
the three documents it carries (DESIGN for docs/design.md, behavior.md or spec for docs/behavior.md, chatwoot.md for
docs/chatwoot.md, each followed by a section sign and a number) names a heading of that document."""

from __future__ import annotations

import functools
import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

# built by concatenation, so this file does not hold what it forbids
OUTSIDE = re.compile(re.escape("../") + "(?:" + "|".join(("shared", "DESIGN", "spec/")) + ")")

DOCS = {
    "design": "docs/design.md",
    "behavior": "docs/behavior.md",
    "chatwoot": "docs/chatwoot.md",
}
# the name a citation starts with → the document it cites
CITED_AS = {
    "DESIGN": "design",
    "DESIGN.md": "design",
    "design.md": "design",
    "behavior.md": "behavior",
    "spec": "behavior",
    "chatwoot.md": "chatwoot",
}
_NUMBER = r"§\s?\d+(?:\.\d+)*"
# a name, then one section or a run of them: `§4.3-§4.5, §4.7, §5`, `§3.2 and §3.3`, `§6.5–§6.6`
CITATION = re.compile(
    r"(?<![\w.-])(?P<name>DESIGN\.md|DESIGN|design\.md|behavior\.md|chatwoot\.md|spec)\s*"
    rf"(?P<sections>{_NUMBER}(?:(?:\s*[-–,]\s*|\s+and\s+){_NUMBER})*)"
)
SECTION = re.compile(r"§\s?(\d+(?:\.\d+)*)")
HEADING = re.compile(r"^#{2,6}[ \t]+(\d+(?:\.\d+)*)\.?(?=[\s:]|$)", re.MULTILINE)


@functools.cache
def tracked_texts() -> tuple[tuple[str, str], ...]:
    """Every tracked text file (UTF-8, no NUL byte) as (path, content); binaries and deleted files left out."""
    try:
        listed = subprocess.run(
            ["git", "-C", str(ROOT), "ls-files", "-z"], capture_output=True, check=True, timeout=60
        ).stdout
    except (OSError, subprocess.CalledProcessError, subprocess.TimeoutExpired):
        pytest.skip("not inside a git checkout: no tracked files to check")
    texts = []
    for name in sorted(filter(None, listed.decode("utf-8", "surrogateescape").split("\0"))):
        path = ROOT / name
        if not path.is_file():
            continue  # deleted in the working tree
        data = path.read_bytes()
        if b"\0" in data:
            continue
        try:
            texts.append((name, data.decode("utf-8")))
        except UnicodeDecodeError:
            continue
    return tuple(texts)


def line_of(text: str, offset: int) -> int:
    return text.count("\n", 0, offset) + 1


def headings(doc: str) -> set[str] | None:
    """The section numbers of a document's headings (`## 6.` → "6", `### 9.7` → "9.7"); None when it is missing."""
    path = ROOT / DOCS[doc]
    if not path.is_file():
        return None
    return {match.group(1) for match in HEADING.finditer(path.read_text(encoding="utf-8"))}


def test_no_tracked_file_points_outside_the_repository() -> None:
    found = [
        f"{name}:{line_of(text, match.start())}: {match.group(0)}"
        for name, text in tracked_texts()
        for match in OUTSIDE.finditer(text)
    ]
    if found:
        pytest.fail("paths outside the repository (the documents are under docs/):\n" + "\n".join(found), pytrace=False)


def test_every_citation_names_a_heading_of_its_document() -> None:
    sections = {doc: headings(doc) for doc in DOCS}
    unresolved = []
    for name, text in tracked_texts():
        for match in CITATION.finditer(text):
            doc = CITED_AS[match.group("name")]
            known = sections[doc]
            for number in SECTION.findall(match.group("sections")):
                if known is None or number not in known:
                    missing = " (the document is missing)" if known is None else ""
                    unresolved.append(
                        f"{name}:{line_of(text, match.start())}: {match.group('name')} §{number}"
                        f" → no heading {number} in {DOCS[doc]}{missing}"
                    )
    if unresolved:
        pytest.fail(f"{len(unresolved)} unresolved citations:\n" + "\n".join(unresolved), pytrace=False)
