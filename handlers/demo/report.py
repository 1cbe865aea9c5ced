"""The demo's readable report: per conversation what Jev saw and said and what the router did; then totals."""

from __future__ import annotations

import textwrap
from collections import Counter
from typing import Any

from handlers.demo.run import check_expectation


def _decision_text(decision: dict[str, Any] | None) -> str:
    if decision is None:
        return "not asked"
    parts = [f"owner {decision['owner'] or 'unclear'} ({decision['owner_confidence']:.2f})"]
    if decision.get("topic") is not None:
        parts.append(f"topic {decision['topic']} ({decision['topic_confidence']:.2f})")
    parts.append(f"kind {decision.get('kind') or 'none'} ({decision['kind_confidence']:.2f})")
    parts.append("no request yet" if decision["no_request"] else "a request")
    return ", ".join(parts)


def _result_text(row: dict[str, Any]) -> str:
    result = row["result"]
    if result == "assigned":
        return f"assigned to user {row['assignee_id']}"
    if result == "ended":
        return f"ended as {row['status']}"
    if result == "handed_off":
        return f"handed off to people ({row['reason']})"
    if result is None:
        return "no outcome"
    return f"{result}" + (f" ({row['reason']})" if row["reason"] else "")


def render(rows: list[dict[str, Any]], seconds: float) -> str:
    lines = ["", "chatwoot-router demo report", "=" * 27, ""]
    for n, row in enumerate(rows, 1):
        lines.append(f"{n:2}. {row['title']}  [conversation {row['key']}]")
        lines.append(f"    outcome:  {_result_text(row)}")
        if row["input"] is not None:
            shown = row["input"].replace("\n", " | ")
            wrapped = textwrap.wrap(shown, 96) or [""]
            lines.append(f"    Jev saw:  {wrapped[0]}")
            lines.extend(f"              {more}" for more in wrapped[1:])
        lines.append(f"    Jev said: {_decision_text(row['decision'])}")
        labels = ", ".join(row["labels"]) or "none"
        reply = "sent once" if row["replies"] == 1 else ("not sent" if row["replies"] == 0 else f"{row['replies']}×!")
        assignee = f"user {row['assignee_id']}" if row["assignee_id"] else "nobody"
        lines.append(f"    labels {labels}; canned reply {reply}; now {row['status']}, assigned to {assignee}")
        problems = check_expectation(row)
        if problems:
            lines.append(f"    NOT AS EXPECTED: {'; '.join(problems)}")
        lines.append("")
    results = Counter(row["result"] for row in rows)
    reasons = Counter(row["reason"] for row in rows if row["result"] == "handed_off")
    unexpected = sum(1 for row in rows if check_expectation(row))
    lines.append("Totals")
    lines.append(f"  conversations {len(rows)}; " + ", ".join(f"{k} {v}" for k, v in sorted(results.items(), key=str)))
    if reasons:
        lines.append("  handoffs: " + ", ".join(f"{k} {v}" for k, v in sorted(reasons.items(), key=str)))
    lines.append(f"  canned replies sent {sum(row['replies'] for row in rows)}")
    lines.append(f"  as expected {len(rows) - unexpected} of {len(rows)}")
    lines.append(f"  time taken {seconds:.1f} s")
    return "\n".join(lines) + "\n"
