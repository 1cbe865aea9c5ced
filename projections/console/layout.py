"""Geometry of the console's conversation timeline: swimlanes, call bars, timer spans, on a compressed time axis.

A conversation's activity comes in bursts (a turn takes a second; the next webhook may come a day later), so the
axis is piecewise linear: bursts of activity ("clusters") get widths in proportion to their durations, and each
quiet stretch longer than `GAP_MS` between them is drawn as a narrow break labelled with its length. Within a
lane, items that would overlap (or whose labels would) go on extra rows. The templates only draw what this
computes; nothing here does I/O.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime

from projections.console.model import Mark, TimerSpan, marks_of, timer_spans_of
from projections.logs.timeline import Call, Timeline

WIDTH = 1100
LEFT = 150  # the lane titles' gutter
RIGHT = 16
TOP = 30  # room for the axis labels
ROW_H = 20
LANE_PAD = 7
GAP_MS = 1500
BREAK_PX = 34
MIN_CLUSTER_PX = 80
FUTURE_PX = 60  # how far past the last activity a pending timer is drawn
CHAR_PX = 6.3  # average glyph width of the 11 px labels
MAX_ROWS = 10

LANES: tuple[tuple[str, str], ...] = (
    ("webhooks", "Webhooks"),
    ("router", "Router steps"),
    ("chatwoot", "Calls → Chatwoot"),
    ("systemone", "Calls → System One"),
    ("timers", "Timers"),
)


def format_duration(ms: int | float) -> str:
    """84 ms, 1.25 s, 3 min 20 s, 2 h 05 min, 3 d 4 h."""
    ms = max(0, ms)
    if ms < 1000:
        return f"{ms:.0f} ms"
    if ms < 60_000:
        return f"{ms / 1000:.2f} s"
    seconds = int(ms // 1000)
    if seconds < 3600:
        return f"{seconds // 60} min {seconds % 60} s"
    if seconds < 86_400:
        return f"{seconds // 3600} h {seconds % 3600 // 60:02d} min"
    return f"{seconds // 86_400} d {seconds % 86_400 // 3600} h"


def format_time(ms: int) -> str:
    """Epoch milliseconds as `2025-06-01 12:00:03.123 UTC`."""
    moment = datetime.fromtimestamp(ms / 1000, tz=UTC)
    return moment.strftime("%Y-%m-%d %H:%M:%S.") + f"{ms % 1000:03d} UTC"


@dataclass(frozen=True)
class Cluster:
    start_ms: int
    end_ms: int
    x0: float
    x1: float


class TimeScale:
    """Maps epoch milliseconds to x: clusters linearly, the gaps between them squeezed into breaks."""

    def __init__(self, times: list[int], left: float = LEFT) -> None:
        spans = _clusters(sorted(times))
        self.clusters: list[Cluster] = []
        # a long history of bursts widens the drawing (it scrolls) rather than squeezing each burst to nothing
        needed = left + len(spans) * MIN_CLUSTER_PX + max(0, len(spans) - 1) * BREAK_PX + FUTURE_PX + RIGHT
        self.width = max(WIDTH, int(needed) + 1)
        right = self.width - RIGHT - FUTURE_PX
        if not spans:
            return
        available = right - left - BREAK_PX * (len(spans) - 1) - MIN_CLUSTER_PX * len(spans)
        available = max(available, 0.0)
        total = sum(end - start for start, end in spans)
        x = left
        for start, end in spans:
            share = (end - start) / total if total else 1 / len(spans)
            width = MIN_CLUSTER_PX + available * share
            self.clusters.append(Cluster(start, end, x, x + width))
            x += width + BREAK_PX

    def x(self, ms: int) -> float:
        if not self.clusters:
            return LEFT
        first, last = self.clusters[0], self.clusters[-1]
        if ms <= first.start_ms:
            return first.x0
        if ms > last.end_ms:
            return min(last.x1 + FUTURE_PX, self.width - RIGHT)
        for before, after in zip(self.clusters, [*self.clusters[1:], None], strict=True):
            if ms <= before.end_ms:
                return _lerp(ms, before.start_ms, before.end_ms, before.x0, before.x1)
            if after is not None and ms < after.start_ms:
                return _lerp(ms, before.end_ms, after.start_ms, before.x1, after.x0)
        return last.x1

    def breaks(self) -> list[tuple[float, str]]:
        """Each break's centre x and the quiet time it stands for."""
        return [
            ((a.x1 + b.x0) / 2, format_duration(b.start_ms - a.end_ms))
            for a, b in zip(self.clusters, self.clusters[1:], strict=False)
        ]


def _lerp(ms: int, start: int, end: int, x0: float, x1: float) -> float:
    if end <= start:
        return (x0 + x1) / 2
    return x0 + (x1 - x0) * (ms - start) / (end - start)


def _clusters(times: list[int]) -> list[tuple[int, int]]:
    spans: list[tuple[int, int]] = []
    for t in times:
        if spans and t - spans[-1][1] <= GAP_MS:
            spans[-1] = (spans[-1][0], max(spans[-1][1], t))
        else:
            spans.append((t, t))
    return spans


@dataclass(frozen=True)
class Bar:
    """A call or a timer span: a rectangle with a label beside it and a tooltip."""

    x: float
    y: float
    w: float
    cls: str
    label: str
    label_x: float
    anchor: str
    title: str
    op: str = ""
    result: str = ""
    attempt: int = 0
    target: str = ""


@dataclass(frozen=True)
class Dot:
    x: float
    y: float
    cls: str
    label: str
    title: str
    lane: str
    anchor: str = "start"


@dataclass(frozen=True)
class LaneBox:
    name: str
    title: str
    y: float
    h: float


@dataclass
class TimelineLayout:
    width: int = WIDTH
    height: float = TOP
    lanes: list[LaneBox] = field(default_factory=list)
    bars: list[Bar] = field(default_factory=list)
    dots: list[Dot] = field(default_factory=list)
    ticks: list[tuple[float, str]] = field(default_factory=list)
    breaks: list[tuple[float, str]] = field(default_factory=list)
    left: int = LEFT


class _Rows:
    """Greedy row packing: an item goes on the first row where it does not overlap the row's last item."""

    def __init__(self) -> None:
        self.ends: list[float] = []

    def place(self, start: float, end: float) -> int | None:
        for row, last in enumerate(self.ends):
            if start > last + 3:
                self.ends[row] = end
                return row
        if len(self.ends) < MAX_ROWS:
            self.ends.append(end)
            return len(self.ends) - 1
        return None

    def force(self, end: float) -> int:
        row = min(range(len(self.ends)), key=lambda r: self.ends[r])
        self.ends[row] = max(self.ends[row], end)
        return row

    @property
    def count(self) -> int:
        return max(1, len(self.ends))


def _label_width(text: str) -> float:
    return len(text) * CHAR_PX


def call_label(call: Call) -> str:
    retry = f"↻{call.attempt} " if call.attempt > 1 else ""
    duration = format_duration(call.duration_ms) if call.duration_ms is not None else "…"
    return f"{retry}{call.op} {duration} {call.result}"


def call_title(call: Call) -> str:
    lines = [
        f"{call.op} → {call.target} ({call.command_id}, attempt {call.attempt})",
        f"issued {format_time(call.issued_ms)}",
        f"result: {call.summary}" + (f" after {format_duration(call.duration_ms)}" if call.duration_ms else ""),
    ]
    if call.detail:
        lines.append(call.detail)
    if call.requests:
        lines.append(f"{call.requests} HTTP request(s)")
    return "\n".join(lines)


def _call_class(call: Call) -> str:
    if call.result == "ok":
        return "ok" if not call.ignored else "ignored"
    if call.result == "pending":
        return "pending"
    return "bad" if call.result in ("failed", "timeout", "unconfirmed", "overdue") else "warn"


@dataclass(frozen=True)
class _PlacedMark:
    row: int
    x: float
    mark: Mark
    label: str
    anchor: str


@dataclass(frozen=True)
class _PlacedBar:
    row: int
    x: float
    w: float
    thing: Call | TimerSpan
    label: str
    label_x: float
    anchor: str


def layout_timeline(timeline: Timeline) -> TimelineLayout:
    """Place every mark, call and timer of `timeline` on its lane."""
    spans = timer_spans_of(timeline)
    marks = marks_of(timeline)
    times = [m.at_ms for m in marks]
    for call in timeline.calls:
        times.append(call.issued_ms)
        if call.ended_ms is not None:
            times.append(call.ended_ms)
    times += [s.start_ms for s in spans if s.kind == "backoff"] + [s.end_ms for s in spans if s.kind == "backoff"]
    scale = TimeScale(times)
    width = scale.width
    layout = TimelineLayout(width=width)
    if not scale.clusters:
        return layout
    origin = scale.clusters[0].start_ms
    placed: dict[str, list[_PlacedMark | _PlacedBar]] = {name: [] for name, _ in LANES}
    rows = {name: _Rows() for name, _ in LANES}

    def place(lane: str, start: float, end: float) -> int:
        row = rows[lane].place(start, end)
        return row if row is not None else rows[lane].force(end)

    def bar(lane: str, x0: float, x1: float, thing: Call | TimerSpan, label: str) -> None:
        w = max(3.0, x1 - x0)
        lw = _label_width(label)
        right = x0 + w + 5 + lw <= width - RIGHT  # the label goes right of the bar, else left of it
        start, end = (x0, x0 + w + 5 + lw) if right else (x0 - 5 - lw, x0 + w)
        row = rows[lane].place(start, end)
        if row is None:  # crowded: the bar alone, its label in the tooltip
            label, row = "", place(lane, x0, x0 + w)
        label_x, anchor = (x0 + w + 4, "start") if right else (x0 - 4, "end")
        placed[lane].append(_PlacedBar(row, x0, w, thing, label, label_x, anchor))

    for mark in sorted(marks, key=lambda m: m.at_ms):
        x = scale.x(mark.at_ms)
        lw = _label_width(mark.label)
        right = x + 9 + lw <= width - RIGHT  # the label goes right of the dot, else left of it
        row = rows[mark.lane].place(x - 5, x + 9 + lw) if right else rows[mark.lane].place(x - 9 - lw, x + 5)
        label = mark.label
        if row is None:  # no room for its label: the dot alone, the label in its tooltip
            label = ""
            row = place(mark.lane, x - 5, x + 5)
        placed[mark.lane].append(_PlacedMark(row, x, mark, label, "start" if right else "end"))
    for call in timeline.calls:
        lane = "systemone" if call.target == "System One" else "chatwoot"
        x0 = scale.x(call.issued_ms)
        x1 = scale.x(call.ended_ms) if call.ended_ms is not None else width - RIGHT - 4
        bar(lane, x0, x1, call, call_label(call))
    for span in spans:
        bar("timers", scale.x(span.start_ms), scale.x(span.end_ms), span, span.label)

    y = float(TOP)
    for name, title in LANES:
        height = rows[name].count * ROW_H + 2 * LANE_PAD
        layout.lanes.append(LaneBox(name, title, y, height))
        for item in placed[name]:
            _emit(layout, name, y + LANE_PAD + item.row * ROW_H, item, origin)
        y += height
    layout.height = y + 8
    for cluster in scale.clusters:
        _tick(layout, cluster.x0, f"+{format_duration(cluster.start_ms - origin)}")
        if cluster.end_ms > cluster.start_ms:
            _tick(layout, cluster.x1, f"+{format_duration(cluster.end_ms - origin)}")
    layout.breaks = scale.breaks()
    return layout


def _tick(layout: TimelineLayout, x: float, label: str) -> None:
    """An axis label, unless it would run into the previous one."""
    if layout.ticks and x - layout.ticks[-1][0] < _label_width(label) + 12:
        return
    layout.ticks.append((x, label))


def _emit(layout: TimelineLayout, lane: str, top: float, item: _PlacedMark | _PlacedBar, origin: int) -> None:
    if isinstance(item, _PlacedMark):
        mark = item.mark
        title = f"{mark.label}\n{format_time(mark.at_ms)} (+{format_duration(mark.at_ms - origin)})"
        if mark.detail:
            title += f"\n{mark.detail}"
        layout.dots.append(Dot(item.x, top + ROW_H / 2, mark.tone, item.label, title, lane, item.anchor))
        return
    thing = item.thing
    if isinstance(thing, Call):
        layout.bars.append(
            Bar(
                item.x,
                top + 3,
                item.w,
                f"call {_call_class(thing)}",
                item.label,
                item.label_x,
                item.anchor,
                call_title(thing),
                op=thing.op,
                result=thing.result,
                attempt=thing.attempt,
                target=thing.target,
            )
        )
    else:
        title = f"{thing.label}\nset {format_time(thing.start_ms)}\ndue {format_time(thing.end_ms)}"
        layout.bars.append(
            Bar(item.x, top + 3, item.w, f"timer {thing.kind}", item.label, item.label_x, item.anchor, title)
        )


# --- the overview's chart: turns per hour, stacked by result ---

RESULT_ORDER = ("assigned", "ended", "handed_off", "waited", "dropped", "nothing", "deferred", "retry")
CHART_W, CHART_H, CHART_LEFT, CHART_BOTTOM = 1100, 180, 36, 22


@dataclass(frozen=True)
class ChartBar:
    x: float
    y: float
    w: float
    h: float
    result: str
    title: str


@dataclass
class HoursChart:
    width: int = CHART_W
    height: int = CHART_H
    bars: list[ChartBar] = field(default_factory=list)
    labels: list[tuple[float, str]] = field(default_factory=list)
    y_max: int = 0
    plot_top: float = 8
    plot_bottom: float = CHART_H - CHART_BOTTOM
    left: int = CHART_LEFT
    results: list[str] = field(default_factory=list)  # the results present, for the legend


def hours_chart(hours: list[tuple[int, dict[str, int]]]) -> HoursChart:
    """Stacked bars, one per hour (oldest first), for `(hour start ms, counts by result)` pairs."""
    chart = HoursChart()
    if not hours:
        return chart
    chart.y_max = max(1, *(sum(c.values()) for _, c in hours))
    slot = (CHART_W - CHART_LEFT - 4) / len(hours)
    plot_h = chart.plot_bottom - chart.plot_top
    present: set[str] = set()
    for i, (start, counts) in enumerate(hours):
        x = CHART_LEFT + i * slot + 1
        base = chart.plot_bottom
        hour = datetime.fromtimestamp(start / 1000, tz=UTC).strftime("%H:00")
        for result in RESULT_ORDER:
            n = counts.get(result, 0)
            if not n:
                continue
            present.add(result)
            h = plot_h * n / chart.y_max
            base -= h
            chart.bars.append(ChartBar(x, base, max(1.0, slot - 2), h, result, f"{hour} UTC: {n} {result}"))
        if i % 3 == (len(hours) - 1) % 3:
            chart.labels.append((x + slot / 2, hour))
    chart.results = [r for r in RESULT_ORDER if r in present]
    return chart


@dataclass(frozen=True)
class StepRow:
    """One line of the conversation page's step table."""

    at_ms: int
    rel: str
    lane: str
    what: str
    detail: str


def step_rows(timeline: Timeline) -> list[StepRow]:
    """Every mark and call in time order (a call at the time it was issued), for the table under the timeline."""
    origin = timeline.first_ms or 0
    items: list[tuple[int, int, str, str, str]] = []
    titles = dict(LANES)
    for mark in marks_of(timeline):
        items.append((mark.at_ms, mark.seq, titles[mark.lane], mark.label, mark.detail))
    for call in timeline.calls:
        retry = f" (attempt {call.attempt})" if call.attempt > 1 else ""
        took = f" after {format_duration(call.duration_ms)}" if call.duration_ms is not None else ""
        detail = ", ".join(p for p in (call.detail, f"{call.summary}{took}") if p)
        lane = titles["systemone" if call.target == "System One" else "chatwoot"]
        items.append((call.issued_ms, call.seq, lane, f"{call.op}{retry}", detail))
    for span in timer_spans_of(timeline):
        items.append((span.start_ms, 10**9, titles["timers"], span.label, f"due {format_time(span.end_ms)}"))
    items.sort(key=lambda item: (item[0], item[1]))
    return [StepRow(at, format_duration(at - origin), lane, what, detail) for at, _, lane, what, detail in items]
