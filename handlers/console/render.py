"""Server-side rendering of the console's pages and of the fragments its live pages swap in (Jinja2).

Every value reaches HTML through Jinja's autoescaping. The pages carry their CSS inline and use no external
asset, so the conversation page also works as a standalone file (`audit --conversation A:C --html FILE`).
"""

from __future__ import annotations

from typing import Any

from jinja2 import Environment, PackageLoader, select_autoescape
from markupsafe import escape

from handlers.console.status import ConsoleStatus, TailStatus
from projections.console.layout import format_time, hours_chart, layout_timeline, step_rows
from projections.console.model import Overview, merge_stuck
from projections.logs.timeline import Timeline, describe_outcome
from schemas.records import TurnOutcome

LIVE_EVERY_MS = 2000
OVERVIEW_FRAGMENTS = ("live", "tiles", "hours", "reasons", "stuck", "lag", "recent")
CONVERSATION_FRAGMENTS = ("live", "facts", "ending", "timeline", "decisions", "events")


def _time(ms: int | None) -> str:
    return "—" if ms is None else format_time(ms)


def _outcome(outcome: TurnOutcome) -> str:
    return describe_outcome(outcome)


def _environment() -> Environment:
    env = Environment(
        loader=PackageLoader("handlers.console", "templates"),
        autoescape=select_autoescape(["html"], default_for_string=True, default=True),
        trim_blocks=True,
        lstrip_blocks=True,
    )
    env.filters["time"] = _time
    env.filters["outcome"] = _outcome
    return env


ENV = _environment()


# --- the overview ---


def overview_context(overview: Overview, status: ConsoleStatus) -> dict[str, Any]:
    workers = [(w.url, w.stuck) for w in status.workers if w.stuck is not None]
    chart = hours_chart([(bar.start_ms, bar.counts) for bar in overview.hours])
    return {
        "o": overview,
        "status": status,
        "chart": chart,
        "stuck_rows": merge_stuck(overview.stuck, workers),
        "standalone": False,
    }


def render_overview(overview: Overview, status: ConsoleStatus) -> str:
    context = overview_context(overview, status)
    context.update(live_url="/api/overview", live_every_ms=LIVE_EVERY_MS)
    return ENV.get_template("overview.html").render(context)


def overview_fragments(overview: Overview, status: ConsoleStatus) -> dict[str, str]:
    context = overview_context(overview, status)
    module: Any = ENV.get_template("fragments.html").make_module(context)
    o, rows = context["o"], context["stuck_rows"]
    calls = {
        "live": lambda: module.live(status),
        "tiles": lambda: module.tiles(o, rows),
        "hours": lambda: module.hours(context["chart"]),
        "reasons": lambda: module.reasons(o),
        "stuck": lambda: module.stuck(rows, status),
        "lag": lambda: module.lag(status, o.undecodable),
        "recent": lambda: module.recent(o),
    }
    return {name: str(calls[name]()) for name in OVERVIEW_FRAGMENTS}


# --- a conversation ---


def conversation_context(
    key: str,
    timeline: Timeline | None,
    *,
    status: ConsoleStatus | None = None,
    standalone: bool = False,
    reading: bool = False,
) -> dict[str, Any]:
    return {
        "key": key,
        "t": timeline,
        "reading": reading,
        "layout": layout_timeline(timeline) if timeline is not None else None,
        "rows": step_rows(timeline) if timeline is not None else [],
        "status": status,
        "standalone": standalone,
        "query": key,
    }


def render_conversation(
    key: str,
    timeline: Timeline | None,
    *,
    status: ConsoleStatus | None = None,
    standalone: bool = False,
    reading: bool = False,
) -> str:
    """The conversation page; `standalone` = the self-contained file `audit --html` writes (no server links);
    `reading` = its records are still being read from the log."""
    context = conversation_context(key, timeline, status=status, standalone=standalone, reading=reading)
    if not standalone:
        context.update(live_url=f"/api/conversations/{key}", live_every_ms=LIVE_EVERY_MS)
    return ENV.get_template("conversation.html").render(context)


def conversation_fragments(key: str, timeline: Timeline | None, *, status: ConsoleStatus) -> dict[str, str]:
    context = conversation_context(key, timeline, status=status)
    module: Any = ENV.get_template("fragments.html").make_module(context)
    fragments = {"live": str(module.live(status))}
    if timeline is not None:
        fragments.update(
            facts=str(module.facts(timeline)),
            ending=str(module.ending(timeline)),
            timeline=str(module.timeline(context["layout"])),
            decisions=str(module.decisions(timeline)),
            events=str(module.events(context["rows"])),
        )
    return fragments


def reading_fragment(key: str) -> str:
    """The live line of a conversation whose records are still being read from the log."""
    return f"reading {escape(key)}'s records from the log …"


def render_login(*, failed: bool = False) -> str:
    return ENV.get_template("login.html").render(standalone=False, bare=True, failed=failed)


def render_message(title: str, text: str) -> str:
    """A small page for a bad search or an unknown path."""
    source = '{% extends "base.html" %}{% block body %}<h1>{{ title }}</h1><p>{{ text }}</p>{% endblock %}'
    return ENV.from_string(source).render(title=title, text=text, standalone=False)


def empty_status(topic: str, group: str) -> ConsoleStatus:
    return ConsoleStatus(tail=TailStatus(topic=topic), group=group)
