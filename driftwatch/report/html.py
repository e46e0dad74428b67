"""The report as one self-contained HTML page: inline CSS and SVG plots, no script, no network.

Every plot shares the run's time axis, so a finding's onset lines up across step time,
memory and event files; each finding is marked by its number from the table at the top.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from html import escape

from driftwatch import __version__
from driftwatch.causes import cause_line
from driftwatch.findings import KINDS, Severity
from driftwatch.history.reader import StoredFinding
from driftwatch.report.model import Line, Panel, Report
from driftwatch.units import human_bytes, human_seconds, local_clock, local_time

WIDTH, HEIGHT = 880, 240
LEFT, RIGHT, TOP, BOTTOM = 78, 16, 26, 30
LINE_COLOURS = ("#0f766e", "#7c3aed", "#c2410c")
"""Plot lines, in order; the first (teal) is what the screenshot test looks for."""
TREND_COLOUR = "#111827"
SEVERITY_COLOURS = {
    Severity.INFO: "#2563eb",
    Severity.WARNING: "#d97706",
    Severity.CRITICAL: "#dc2626",
}

CSS = """
body { font: 14px/1.45 system-ui, -apple-system, "Segoe UI", sans-serif; color: #1f2937;
       background: #f3f4f6; margin: 0; }
main { max-width: 940px; margin: 0 auto; padding: 24px 16px 40px; }
h1 { font-size: 22px; margin: 0 0 4px; }
h2 { font-size: 16px; margin: 28px 0 10px; }
.sub { color: #4b5563; margin: 0 0 16px; }
.card { background: #fff; border-radius: 8px; box-shadow: 0 1px 2px rgba(0,0,0,.08);
        padding: 14px 16px; margin-bottom: 14px; }
dl { display: grid; grid-template-columns: max-content 1fr; gap: 4px 16px; margin: 0; }
dt { color: #6b7280; } dd { margin: 0; word-break: break-all; }
table { border-collapse: collapse; width: 100%; }
th, td { text-align: left; vertical-align: top; padding: 6px 8px; border-top: 1px solid #e5e7eb; }
th { color: #6b7280; font-weight: 600; border-top: none; }
.chip { display: inline-block; color: #fff; border-radius: 10px; padding: 0 8px; font-size: 12px; }
.num { display: inline-block; width: 20px; height: 20px; border-radius: 10px; color: #fff;
       text-align: center; font-size: 12px; line-height: 20px; }
.ev { color: #4b5563; font-size: 12px; }
.when { white-space: nowrap; }
.none { color: #047857; font-weight: 600; }
.legend span { margin-right: 14px; white-space: nowrap; }
.swatch { display: inline-block; width: 14px; height: 3px; vertical-align: middle;
          margin-right: 5px; }
.note { color: #4b5563; font-size: 13px; }
svg text { font: 11px system-ui, sans-serif; fill: #4b5563; }
footer { color: #9ca3af; font-size: 12px; margin-top: 24px; }
"""


def render(report: Report) -> str:
    """The whole page."""
    run = report.run
    span = _span(report)
    ended = escape(run.ended) if run.ended else "monitoring did not end cleanly (killed?)"
    parts = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        f"<title>driftwatch report: {escape(run.name)}</title>",
        f"<style>{CSS}</style></head><body><main>",
        f"<h1>{escape(run.name)}</h1>",
        f'<p class="sub">watched {local_time(report.start)} to {local_time(report.end)} '
        f"({human_seconds(report.end - report.start)}): {ended}</p>",
        '<div class="card"><dl>',
        f"<dt>command</dt><dd>{escape(' '.join(run.command))}</dd>",
        f"<dt>process</dt><dd>pid {run.pid} on {escape(run.host)}, user {escape(run.user)}, "
        f"started {local_time(run.create_time)}</dd>",
        *(f"<dt>{escape(k)}</dt><dd>{escape(str(v))}</dd>" for k, v in sorted(run.meta.items())),
        "</dl></div>",
        "<h2>Findings</h2>",
        _findings_table(report.findings, report.start),
        *_goodput(report),
        *_captures(report),
        "<h2>Signals</h2>",
    ]
    if not report.panels:
        parts.append('<div class="card">No samples of these signals were recorded.</div>')
    for panel in report.panels:
        parts.append(_panel(panel, report.findings, span))
    parts.append(
        f"<footer>driftwatch {__version__}, from {escape(report.db)}, "
        f"{local_time(time.time())}</footer></main></body></html>"
    )
    return "\n".join(parts)


GOODPUT_COLOURS = {
    "productive": "#0f766e",
    "input_wait": "#7c3aed",
    "startup": "#9ca3af",
    "periodic_stall": "#2563eb",
    "stalled": "#dc2626",
    "host_overhead": "#d97706",
}
"""The colour of each goodput phase in the report's bar."""


def _goodput(report: Report) -> list[str]:
    """Where the wall time went: one bar of the phases, and their seconds."""
    goodput = report.goodput
    if goodput is None or not goodput.total > 0:
        return []
    bar, legend = [], []
    for phase, seconds in goodput.seconds.items():
        share, colour = seconds / goodput.total, GOODPUT_COLOURS[phase]
        bar.append(f'<div style="width:{share:.2%};background:{colour}"></div>')
        legend.append(
            f'<span><span class="swatch" style="background:{colour}"></span>'
            f"{phase.replace('_', ' ')} {human_seconds(seconds)} ({share:.0%})</span>"
        )
    return [
        "<h2>Goodput</h2>",
        f'<div class="card"><p style="margin-top:0">{goodput.ratio:.0%} of '
        f"{human_seconds(goodput.total)} in productive train steps</p>"
        f'<div style="display:flex;height:14px;border-radius:4px;overflow:hidden">'
        f'{"".join(bar)}</div><div class="legend" style="margin-top:8px">'
        f"{''.join(legend)}</div></div>",
    ]


def _span(report: Report) -> tuple[float, float]:
    """The time axis every plot shares: the run, and its projections."""
    start, end = report.start, report.end
    for panel in report.panels:
        for line in panel.lines:
            if line.points:
                start = min(start, line.points[0][0])
                end = max(end, line.points[-1][0])
            if line.trend is not None:
                end = max(end, line.trend.until)
    return start, max(end, start + 1)


def _chip(severity: Severity) -> str:
    colour = SEVERITY_COLOURS[severity]
    return f'<span class="chip" style="background:{colour}">{severity.value}</span>'


def _number(index: int, severity: Severity) -> str:
    colour = SEVERITY_COLOURS[severity]
    return f'<span class="num" style="background:{colour}">{index}</span>'


def _findings_table(findings: list[StoredFinding], start: float) -> str:
    """The findings, each dated by its clock time (with its date where it is not the day
    the report starts: the header gives that)."""
    if not findings:
        return '<div class="card"><span class="none">No findings</span>: nothing drifted.</div>'
    rows = [
        '<div class="card"><table><tr><th></th><th>severity</th><th>kind</th><th>since</th>'
        "<th>what happened, likely cause, what to try</th></tr>"
    ]
    for index, f in enumerate(findings, 1):
        evidence = ", ".join(f"{escape(k)} {escape(_evidence(v))}" for k, v in f.evidence.items())
        rows.append(
            f"<tr><td>{_number(index, f.severity)}</td><td>{_chip(f.severity)}</td>"
            f'<td{_kind_title(f.kind)}>{escape(f.kind)}</td><td class="when">'
            f"{local_clock(f.since, start)}<br>"
            f'<span class="ev">seen {local_clock(f.first_seen, start)}-'
            f"{local_clock(f.last_seen, start)}"
            f"</span></td><td>{escape(f.message)}"
            f'<div class="ev">{evidence}</div>{_causes(f)}</td></tr>'
        )
    rows.append("</table></div>")
    return "\n".join(rows)


def _causes(finding: StoredFinding) -> str:
    """The finding's ranked causes as a numbered list (nothing when it has none)."""
    if not finding.causes:
        return ""
    items = "".join(f"<li>{escape(cause_line(c))}</li>" for c in finding.causes)
    return f'<ol class="ev causes" title="likely causes, best first">{items}</ol>'


def _captures(report: Report) -> list[str]:
    """The evidence captured at drift, if any: what, when, how big, where."""
    if not report.captures:
        return []
    rows = [
        "<h2>Captures</h2>",
        '<div class="card"><table><tr><th>what</th><th>for</th><th>taken</th><th>size</th>'
        "<th>where</th></tr>",
    ]
    for c in report.captures:
        rows.append(
            f"<tr><td>{escape(c.what)}</td><td>{escape(c.label)}</td><td>{local_time(c.t)}</td>"
            f"<td>{human_bytes(c.bytes)}</td><td>{escape(str(c.path))}</td></tr>"
        )
    rows.append("</table>")
    if any(c.what == "trace" for c in report.captures):
        rows.append(
            f'<p class="ev">Profiler traces: tensorboard --logdir '
            f"{escape(report.capture_logdir)} (Profile tab)</p>"
        )
    rows.append("</div>")
    return rows


def _kind_title(kind: str) -> str:
    """The kind's title (``KINDS``) as the cell's hover text; none for a kind this version
    does not know (a history written by another)."""
    spec = KINDS.get(kind)
    return f' title="{escape(spec.title)}"' if spec is not None else ""


def _evidence(value: float | str) -> str:
    return f"{value:.4g}" if isinstance(value, float) else str(value)


def _panel(panel: Panel, findings: list[StoredFinding], span: tuple[float, float]) -> str:
    legend = "".join(
        f'<span><i class="swatch" style="background:{LINE_COLOURS[i % len(LINE_COLOURS)]}">'
        f"</i>{escape(line.label)}</span>"
        for i, line in enumerate(panel.lines)
    )
    notes = "".join(
        f'<div class="note">{escape(line.label)}: {escape(line.note)}</div>'
        for line in panel.lines
        if line.note
    )
    return (
        f'<div class="card"><h2 style="margin-top:0">{escape(panel.title)}</h2>'
        f'<div class="legend">{legend}</div>{notes}{_chart(panel, findings, span)}</div>'
    )


class _Axes:
    """Maps times and values to the plot's pixel coordinates."""

    def __init__(self, span: tuple[float, float], low: float, high: float) -> None:
        self.t0, self.t1 = span
        self.low, self.high = low, high

    def x(self, t: float) -> float:
        return LEFT + (t - self.t0) / (self.t1 - self.t0) * (WIDTH - LEFT - RIGHT)

    def y(self, value: float) -> float:
        return (
            HEIGHT - BOTTOM - (value - self.low) / (self.high - self.low) * (HEIGHT - TOP - BOTTOM)
        )


def _value_range(panel: Panel) -> tuple[float, float]:
    values = [v for line in panel.lines for _, v in line.points if math.isfinite(v)]
    for line in panel.lines:
        if line.trend is not None:
            values += [line.trend.at(line.trend.start), line.trend.at(line.trend.until)]
        if line.limit is not None:
            values.append(line.limit)
    low, high = min(values), max(values)
    pad = (high - low) * 0.08 or abs(high) * 0.05 or 1.0
    floor = 0.0 if low >= 0 else -math.inf  # sizes and durations: no axis below zero
    return max(low - pad, floor), high + pad


def _chart(panel: Panel, findings: list[StoredFinding], span: tuple[float, float]) -> str:
    axes = _Axes(span, *_value_range(panel))
    bottom, right = HEIGHT - BOTTOM, WIDTH - RIGHT
    svg = [
        f'<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {WIDTH} {HEIGHT}" '
        f'width="100%" role="img" aria-label="{escape(panel.title)}">',
        f'<rect x="{LEFT}" y="{TOP}" width="{right - LEFT}" height="{bottom - TOP}" '
        'fill="#fafafa" stroke="#e5e7eb"/>',
    ]
    for value, label in _ticks(axes.low, axes.high, panel.unit):
        y = axes.y(value)
        svg.append(f'<line x1="{LEFT}" x2="{right}" y1="{y:.1f}" y2="{y:.1f}" stroke="#eee"/>')
        svg.append(f'<text x="{LEFT - 6}" y="{y + 4:.1f}" text-anchor="end">{label}</text>')
    for i in range(6):
        t = axes.t0 + (axes.t1 - axes.t0) * i / 5
        anchor = "start" if i == 0 else "end" if i == 5 else "middle"
        svg.append(
            f'<text x="{axes.x(t):.1f}" y="{HEIGHT - 10}" text-anchor="{anchor}">'
            f"{_time_label(t, axes.t1 - axes.t0)}</text>"
        )
    for index, finding in enumerate(findings, 1):
        svg.append(_marker(axes, index, finding))
    for i, line in enumerate(panel.lines):
        svg.extend(_line(axes, line, LINE_COLOURS[i % len(LINE_COLOURS)]))
    svg.append("</svg>")
    return "".join(svg)


SCALES = {
    "bytes": ((2.0**40, "TiB"), (2.0**30, "GiB"), (2.0**20, "MiB"), (2.0**10, "KiB"), (1.0, "B")),
    "seconds": ((3600.0, "h"), (60.0, "min"), (1.0, "s"), (1e-3, "ms"), (1e-6, "µs")),
    "count": ((1e6, "M"), (1e3, "k"), (1.0, "")),
}


def _ticks(low: float, high: float, unit: str) -> list[tuple[float, str]]:
    """Round values between ``low`` and ``high`` (about five), all labelled in one unit."""
    scales = SCALES[unit]
    magnitude = max(abs(low), abs(high))
    factor, name = next((s for s in scales if magnitude >= s[0]), scales[-1])
    low, high = low / factor, high / factor
    rough = (high - low) / 5
    power = 10 ** math.floor(math.log10(rough))
    step = next(m * power for m in (1, 2, 2.5, 5, 10) if m * power >= rough)
    decimals = max(0, -math.floor(math.log10(step) + 1e-9))
    if round(step * 10**decimals) != step * 10**decimals:
        decimals += 1  # 0.25, 2.5 and so on
    first = math.ceil(low / step)
    count = math.floor(high / step) - first + 1
    return [
        ((first + i) * step * factor, f"{(first + i) * step:.{decimals}f} {name}".rstrip())
        for i in range(count)
    ]


def _time_label(t: float, span: float) -> str:
    fmt = "%H:%M:%S" if span < 600 else "%H:%M" if span < 2 * 86400 else "%b %d %H:%M"
    return time.strftime(fmt, time.localtime(t))


def _marker(axes: _Axes, index: int, finding: StoredFinding) -> str:
    """The finding's span (onset to last seen) shaded, its onset a line with its number."""
    colour = SEVERITY_COLOURS[finding.severity]
    since = axes.x(max(axes.t0, finding.since))
    until = axes.x(max(finding.last_seen, finding.since))
    bottom = HEIGHT - BOTTOM
    return (
        f'<rect x="{since:.1f}" y="{TOP}" width="{max(until - since, 1):.1f}" '
        f'height="{bottom - TOP}" fill="{colour}" fill-opacity="0.06"/>'
        f'<line x1="{since:.1f}" x2="{since:.1f}" y1="{TOP}" y2="{bottom}" stroke="{colour}" '
        'stroke-width="1.5"/>'
        f'<circle cx="{since:.1f}" cy="{TOP - 10}" r="8" fill="{colour}"/>'
        f'<text x="{since:.1f}" y="{TOP - 6}" text-anchor="middle" style="fill:#fff">{index}</text>'
    )


def _line(axes: _Axes, line: Line, colour: str) -> list[str]:
    svg = []
    for segment in line.segments:
        xy = [(axes.x(t), axes.y(v)) for t, v in segment if math.isfinite(v)]
        if len(xy) == 1:
            svg.append(f'<circle cx="{xy[0][0]:.1f}" cy="{xy[0][1]:.1f}" r="2.5" fill="{colour}"/>')
        elif xy:
            coords = " ".join(f"{x:.1f},{y:.1f}" for x, y in xy)
            svg.append(
                f'<polyline points="{coords}" fill="none" stroke="{colour}" stroke-width="2" '
                'stroke-linejoin="round"/>'
            )
    trend = line.trend
    if trend is not None:
        fitted = (trend.start, trend.end)
        svg.append(_straight(axes, trend.at, fitted, 'stroke-dasharray="7 4"'))
        if trend.until > trend.end:
            ahead = (trend.end, trend.until)
            svg.append(_straight(axes, trend.at, ahead, 'stroke-dasharray="2 4" opacity="0.7"'))
    if line.limit is not None:
        y = axes.y(line.limit)
        svg.append(
            f'<line x1="{LEFT}" x2="{WIDTH - RIGHT}" y1="{y:.1f}" y2="{y:.1f}" '
            f'stroke="{SEVERITY_COLOURS[Severity.CRITICAL]}" stroke-dasharray="4 3"/>'
            f'<text x="{LEFT + 4}" y="{y - 4:.1f}">limit</text>'
        )
    return svg


def _straight(
    axes: _Axes, at: Callable[[float], float], span: tuple[float, float], style: str
) -> str:
    t0, t1 = span
    return (
        f'<line x1="{axes.x(t0):.1f}" y1="{axes.y(at(t0)):.1f}" x2="{axes.x(t1):.1f}" '
        f'y2="{axes.y(at(t1)):.1f}" stroke="{TREND_COLOUR}" stroke-width="1.5" {style}/>'
    )
