"""The what-if report as text (stdout) and as a self-contained HTML page (`whatif --html`). Pure.

Both show the same things: totals, the live → candidate matrix of outcomes, the changed turns with both sides
and the configuration diff. Neither shows customer text: a turn is named by its conversation, run and time.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from datetime import UTC, datetime
from html import escape
from typing import Any

from projections.whatif.replay import TurnComparison
from projections.whatif.report import Report

NEEDS = "needs a new decision"


def iso(at_ms: int) -> str:
    return datetime.fromtimestamp(at_ms / 1000, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _value(value: Any) -> str:
    return "(absent)" if value is None else json.dumps(value, ensure_ascii=False)


def candidate_text(t: TurnComparison) -> str:
    if t.candidate is None:
        return f"{NEEDS} ({', '.join(t.needs)})"
    return t.candidate.describe()


def _totals_lines(report: Report) -> list[str]:
    totals = report.totals
    lines = [
        f"  turns compared        {totals['compared']:>6}",
        f"  unchanged             {totals['unchanged']:>6}",
        f"  changed               {totals['changed']:>6}",
        f"  {NEEDS}  {totals['needs_new_decision']:>6}",
    ]
    if report.undecided:
        lines.append(f"  ({report.undecided} runs ended before a decision; not compared)")
    if report.asked or report.cached or report.ask_failures:
        lines.append(
            f"  System One: {report.asked} asked, {report.cached} from the cache, {report.ask_failures} failed"
        )
    return lines


def render_text(report: Report) -> str:
    versions = ", ".join(report.diffs) or "none"
    lines = [
        f"what-if: candidate configuration {report.candidate_version} against the recorded turns "
        f"(live versions: {versions})",
        *_totals_lines(report),
        "",
        "live → candidate",
    ]
    matrix = report.matrix
    width = max((len(live) for live, _ in matrix), default=0)
    for (live, candidate), n in matrix.items():
        mark = " " if live == candidate else "*"
        lines.append(f" {mark}{live:<{width}}  →  {candidate}: {n}")
    if not matrix:
        lines.append("  (no decided turns)")
    changed = report.changed()
    lines += ["", f"changed turns ({report.changed_count})"]
    for t in changed:
        lines += [
            f"  {t.key} run {t.run} at {iso(t.at_ms)} (live version {t.live_version})",
            f"    live:      {t.live.describe()}",
            f"    candidate: {candidate_text(t)}",
        ]
        if t.candidate is not None and t.candidate.assumptions:
            lines.append(f"    assuming:  {'; '.join(t.candidate.assumptions)}")
    if not changed:
        lines.append("  (none)")
    elif report.changed_count > len(changed):
        lines.append(f"  … and {report.changed_count - len(changed)} more (not listed)")
    for version, changes in report.diffs.items():
        lines += ["", f"configuration changes (live version {version} → candidate {report.candidate_version})"]
        lines += [f"  {c.path}: {_value(c.live)} → {_value(c.candidate)}" for c in changes] or ["  (none)"]
    return "\n".join(lines) + "\n"


_STYLE = """
body{font:14px/1.45 system-ui,sans-serif;margin:2rem;color:#1d2733;background:#fbfcfd}
h1{font-size:1.4rem}h2{font-size:1.1rem;margin-top:2rem}
table{border-collapse:collapse;margin:.5rem 0}td,th{border:1px solid #d5dbe3;padding:.3rem .6rem;text-align:left}
th{background:#eef2f6}td.n{text-align:right;font-variant-numeric:tabular-nums}
td.same{background:#eef8ee}td.diff{background:#fdf1e4}code{font-size:13px}
.totals td{min-width:5rem}
"""


class Html(str):
    """A table cell that is HTML already (built from escaped parts), inserted as it is."""


def _cell(cell: str) -> str:
    return cell if isinstance(cell, Html) else escape(cell)


def _table(head: list[str], rows: list[list[str]], classes: list[list[str]] | None = None) -> str:
    cells = "".join(f"<th>{escape(h)}</th>" for h in head)
    body = []
    for i, row in enumerate(rows):
        tds = []
        for j, cell in enumerate(row):
            cls = classes[i][j] if classes is not None else ""
            tds.append(f'<td class="{cls}">{_cell(cell)}</td>' if cls else f"<td>{_cell(cell)}</td>")
        body.append("<tr>" + "".join(tds) + "</tr>")
    return f"<table><thead><tr>{cells}</tr></thead><tbody>{''.join(body)}</tbody></table>"


def render_html(report: Report) -> str:
    """The same report as one standalone page: inline CSS, no script, no external asset, all text escaped."""
    return (
        "<!doctype html><html lang=en><head><meta charset=utf-8>"
        f"<title>what-if {escape(report.candidate_version)}</title><style>{_STYLE}</style></head><body>"
        + render_html_body(report)
        + "</body></html>\n"
    )


def render_html_body(report: Report, *, conversation_href: Callable[[str], str] | None = None) -> str:
    """The report's HTML without the page around it: what `render_html` wraps and the console's what-if page
    shows, where `conversation_href(key)` links each changed turn's conversation to its timeline."""
    totals = report.totals
    total_rows = [
        ["turns compared", str(totals["compared"])],
        ["unchanged", str(totals["unchanged"])],
        ["changed", str(totals["changed"])],
        [NEEDS, str(totals["needs_new_decision"])],
    ]
    if report.undecided:
        total_rows.append(["runs ended before a decision (not compared)", str(report.undecided)])
    if report.asked or report.cached or report.ask_failures:
        total_rows.append(
            ["System One asked / cached / failed", f"{report.asked} / {report.cached} / {report.ask_failures}"]
        )
    matrix = report.matrix
    lives = sorted({live for live, _ in matrix})
    targets = sorted({candidate for _, candidate in matrix})
    grid_rows, grid_classes = [], []
    for live in lives:
        row, cls = [live], [""]
        for target in targets:
            n = matrix.get((live, target), 0)
            row.append(str(n) if n else "")
            cls.append(("same n" if live == target else "diff n") if n else "n")
        grid_rows.append(row)
        grid_classes.append(cls)
    changed = report.changed()

    def conversation(key: str) -> str:
        if conversation_href is None:
            return key
        return Html(f'<a href="{escape(conversation_href(key))}" data-conversation="{escape(key)}">{escape(key)}</a>')

    changed_rows = [
        [
            conversation(t.key),
            str(t.run),
            iso(t.at_ms),
            t.live_version,
            t.live.describe(),
            candidate_text(t),
            "; ".join(t.candidate.assumptions) if t.candidate is not None else "",
        ]
        for t in changed
    ]
    parts = [
        f"<h1>What-if: candidate configuration <code>{escape(report.candidate_version)}</code></h1>",
        "<p>Recorded turns re-decided under the candidate with the router's own rules; nothing was sent to "
        "Chatwoot.</p>",
        '<div class="totals">' + _table(["", "turns"], total_rows) + "</div>",
        "<h2>Live → candidate</h2>",
        _table(["live \\ candidate", *targets], grid_rows, grid_classes) if lives else "<p>No decided turns.</p>",
        f"<h2>Changed turns ({report.changed_count})</h2>",
        _table(["conversation", "run", "at", "live version", "live", "candidate", "assuming"], changed_rows)
        if changed
        else "<p>None.</p>",
    ]
    if report.changed_count > len(changed):
        parts.append(f"<p>… and {report.changed_count - len(changed)} more (not listed).</p>")
    for version, changes in report.diffs.items():
        parts.append(f"<h2>Configuration changes: live <code>{escape(version)}</code> → candidate</h2>")
        rows = [[c.path, _value(c.live), _value(c.candidate)] for c in changes]
        parts.append(_table(["key path", "live", "candidate"], rows) if rows else "<p>None.</p>")
    return "".join(parts)
