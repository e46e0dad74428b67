"""What happened in a run, from the history: the model behind ``driftwatch report``.

``build`` reads one run and turns it into panels (the signals a person looks at first, each
with its trend or projection), summaries of every series, and the findings. The text, JSON
(here) and HTML (``driftwatch.report.html``) renderings only format this model.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from driftwatch.detect.stats import theil_sen
from driftwatch.history.reader import HistoryReader, RunRecord, StoredBucket, StoredFinding
from driftwatch.series import Labels, SeriesKey
from driftwatch.units import human_bytes, human_seconds, local_time

MAX_POINTS = 1000
"""Points per plotted line; longer histories are averaged into this many time bins."""
GAP_SPACINGS = 5
"""Buckets further apart than this many usual spacings have a gap between them."""
FIT_POINTS = 200
"""Points a trend is fitted to (Theil-Sen is quadratic in them)."""
WARMUP_SHARE = 0.05
"""Share of the run left out of the step-time trend: compiling, caches, the first epoch."""
PROJECTION_SHARE = 0.25
"""How far past the end a projection is drawn, as a share of the run's span."""

Point = tuple[float, float]


@dataclass(frozen=True, slots=True)
class Trend:
    """A straight line ``value = slope * t + intercept`` fitted over ``[start, end]``."""

    slope: float  # units per second
    intercept: float
    start: float
    end: float
    until: float  # where the drawn line stops: ``end``, or later for a projection

    def at(self, t: float) -> float:
        return self.slope * t + self.intercept


@dataclass(frozen=True, slots=True)
class Line:
    label: str
    segments: list[list[Point]]  # bucket means at bucket centres; NaN: a bucket had none
    trend: Trend | None = None
    limit: float | None = None  # the value the projection runs into, when it does in view
    note: str = ""  # the trend or projection in words

    @property
    def points(self) -> list[Point]:
        return [point for segment in self.segments for point in segment]


@dataclass(frozen=True, slots=True)
class Panel:
    title: str
    unit: str  # "bytes" or "seconds"
    lines: list[Line]

    def format(self, value: float) -> str:
        return FORMATS[self.unit](value)


FORMATS: dict[str, Callable[[float], str]] = {"bytes": human_bytes, "seconds": human_seconds}


@dataclass(frozen=True, slots=True)
class SeriesSummary:
    series: str
    labels: Labels
    first: Point
    last: Point
    min: float
    max: float
    mean: float
    buckets: int

    def to_dict(self) -> dict[str, object]:
        return {
            "series": self.series,
            "labels": dict(self.labels),
            "first": {"t": self.first[0], "value": _finite(self.first[1])},
            "last": {"t": self.last[0], "value": _finite(self.last[1])},
            "min": _finite(self.min),
            "max": _finite(self.max),
            "mean": _finite(self.mean),
            "buckets": self.buckets,
        }


@dataclass(frozen=True, slots=True)
class Report:
    db: str
    run: RunRecord
    panels: list[Panel]
    series: list[SeriesSummary]
    findings: list[StoredFinding]

    @property
    def start(self) -> float:
        return self.run.first_seen

    @property
    def end(self) -> float:
        return self.run.last_seen


def build(reader: HistoryReader, selector: str | None) -> Report:
    """The report of the run ``selector`` names (the latest run when ``None``)."""
    run = reader.run(selector)
    series = reader.series(run.id)
    summaries = [s for key, buckets in sorted(series.items()) if (s := _summary(key, buckets))]
    return Report(str(reader.path), run, _panels(series), summaries, reader.findings(run.id))


def _summary(key: SeriesKey, buckets: list[StoredBucket]) -> SeriesSummary | None:
    finite = [b for b in buckets if b.count > 0]
    if not finite:
        return None
    total = sum(b.count for b in finite)
    return SeriesSummary(
        key[0],
        key[1],
        (finite[0].start, finite[0].mean),
        (finite[-1].start + finite[-1].width, finite[-1].last),
        min(b.min for b in finite),
        max(b.max for b in finite),
        sum(b.mean * b.count for b in finite) / total,
        len(buckets),
    )


def _segments(buckets: list[StoredBucket]) -> list[list[Point]]:
    """Bucket means at bucket centres, split where driftwatch was not running.

    A gap is a distance between buckets of one tier of more than ``GAP_SPACINGS`` times that
    tier's usual spacing (the sampling interval can be longer than a bucket). Longer
    histories are averaged into ``MAX_POINTS`` time bins in all.
    """
    usual: dict[float, float] = {}
    for width in {b.width for b in buckets}:
        starts = [b.start for b in buckets if b.width == width]
        deltas = np.diff(starts)
        usual[width] = max(float(np.median(deltas)) if deltas.size else width, width)
    segments: list[list[Point]] = [[]]
    previous: StoredBucket | None = None
    for bucket in buckets:
        if previous is not None:
            spacing = max(usual[bucket.width], usual[previous.width])
            if bucket.start - previous.start > GAP_SPACINGS * spacing:
                segments.append([])
        segments[-1].append((bucket.start + bucket.width / 2, bucket.mean))
        previous = bucket
    total = sum(len(s) for s in segments)
    if total <= MAX_POINTS:
        return segments
    return [_binned(s, max(1, len(s) * MAX_POINTS // total)) for s in segments]


def _binned(points: list[Point], bins: int) -> list[Point]:
    """Means of ``points`` (finite values only) in ``bins`` equal time bins."""
    t = np.array([p[0] for p in points])
    y = np.array([p[1] for p in points])
    edges = np.linspace(t[0], t[-1], bins + 1)
    index = np.clip(np.searchsorted(edges, t, side="right") - 1, 0, bins - 1)
    binned: list[Point] = []
    for i in range(bins):
        inside = (index == i) & np.isfinite(y)
        if inside.any():
            binned.append((float(t[inside].mean()), float(y[inside].mean())))
    return binned


def _fit(points: list[Point], start: float) -> Trend | None:
    """Theil-Sen line through the points from ``start`` on; ``None`` with too few."""
    kept = [p for p in points if p[0] >= start and math.isfinite(p[1])]
    if len(kept) < 3:
        return None
    if len(kept) > FIT_POINTS:
        kept = _binned(kept, FIT_POINTS)
    slope, intercept = theil_sen([p[0] for p in kept], [p[1] for p in kept])
    if not math.isfinite(slope):
        return None
    return Trend(slope, intercept, kept[0][0], kept[-1][0], kept[-1][0])


def _step_line(buckets: list[StoredBucket]) -> Line:
    segments = _segments(buckets)
    points = [p for segment in segments for p in segment]
    t0, t1 = points[0][0], points[-1][0]
    trend = _fit(points, t0 + WARMUP_SHARE * (t1 - t0))
    note = ""
    if trend is not None and trend.at(trend.start) > 0:
        per_hour = trend.slope * 3600 / trend.at(trend.start)
        note = f"trend {per_hour:+.1%} per hour ({human_seconds(trend.at(trend.end))}/step now)"
    return Line("step time", segments, trend, note=note)


def _memory_line(label: str, buckets: list[StoredBucket], limit: float | None) -> Line:
    """The signal with the newest half's trend projected ahead, and when it meets ``limit``."""
    segments = _segments(buckets)
    points = [p for segment in segments for p in segment]
    t0, t1 = points[0][0], points[-1][0]
    fit = _fit(points, (t0 + t1) / 2)
    if fit is None:
        return Line(label, segments)
    ahead = t1 + PROJECTION_SHARE * (t1 - t0)
    note = f"{human_bytes(fit.slope * 3600)}/h over the newest half"
    shown_limit = None
    if limit is not None and fit.slope > 0:
        reaches = (limit - fit.at(t1)) / fit.slope + t1
        note += f"; at this rate it reaches {human_bytes(limit)} in {human_seconds(reaches - t1)}"
        if reaches <= ahead:
            ahead, shown_limit = max(reaches, t1), limit
    trend = Trend(fit.slope, fit.intercept, fit.start, fit.end, ahead)
    return Line(label, segments, trend, shown_limit, note)


def _plain_line(label: str, buckets: list[StoredBucket]) -> Line:
    return Line(label, _segments(buckets))


def _last_mean(buckets: list[StoredBucket] | None) -> float | None:
    values = [b.mean for b in buckets or () if math.isfinite(b.mean)]
    return values[-1] if values else None


def _panels(series: dict[SeriesKey, list[StoredBucket]]) -> list[Panel]:
    """The signals a person looks at first, in that order; those the run lacks are left out."""

    def labelled(name: str) -> list[tuple[Labels, list[StoredBucket]]]:
        return [(key[1], b) for key, b in sorted(series.items()) if key[0] == name and b]

    panels: list[Panel] = []
    steps = series.get(("step_seconds", ()))
    if steps:
        panels.append(Panel("Step time", "seconds", [_step_line(steps)]))
    memory = []
    rss = series.get(("rss_bytes", ()))
    if rss:
        memory.append(_memory_line("RSS", rss, _last_mean(series.get(("memory_limit_bytes", ())))))
    for labels, buckets in labelled("tf_allocator_current_bytes"):
        memory.append(_memory_line(f"TF {dict(labels)['device']}", buckets, None))
    for labels, buckets in labelled("gpu_process_memory_bytes"):
        total = _last_mean(series.get(("gpu_memory_total_bytes", labels)))
        memory.append(_memory_line(f"GPU {dict(labels)['gpu']}", buckets, total))
    panels.extend(Panel(f"Memory: {line.label}", "bytes", [line]) for line in memory)
    files = [
        _plain_line(label, series[(name, ())])
        for name, label in (("event_file_bytes", "all"), ("event_file_largest_bytes", "largest"))
        if series.get((name, ()))
    ]
    if files:
        panels.append(Panel("Event files", "bytes", files))
    uploads = series.get(("nondisk_write_bytes", ()))
    if uploads:
        panels.append(
            Panel(
                "Uploads and other non-disk writes",
                "bytes",
                [_memory_line("written", uploads, None)],
            )
        )
    return panels


def _finite(value: float) -> float | None:
    return value if math.isfinite(value) else None


def to_json(report: Report) -> str:
    """One JSON document: the run, a summary of each series, the findings."""
    run = report.run
    document = {
        "db": report.db,
        "run": {
            "id": run.id,
            "name": run.name,
            "host": run.host,
            "pid": run.pid,
            "create_time": run.create_time,
            "command": run.command,
            "user": run.user,
            "meta": run.meta,
            "first_seen": run.first_seen,
            "last_seen": run.last_seen,
            "ended": run.ended,
        },
        "trends": [
            {
                "panel": panel.title,
                "line": line.label,
                "per_hour": line.trend.slope * 3600,
                "note": line.note,
            }
            for panel in report.panels
            for line in panel.lines
            if line.trend is not None
        ],
        "series": [s.to_dict() for s in report.series],
        "findings": [
            {
                "kind": f.kind,
                "severity": f.severity.value,
                "since": f.since,
                "first_seen": f.first_seen,
                "last_seen": f.last_seen,
                "message": f.message,
                "evidence": f.evidence,
                "changes": [
                    {"t": t, "severity": s.value if s is not None else None} for t, s in f.changes
                ],
            }
            for f in report.findings
        ],
    }
    return json.dumps(document, indent=2, sort_keys=True)


def to_text(report: Report) -> str:
    """A readable summary for the terminal."""
    run = report.run
    lines = [
        f"run {run.name} (#{run.id}): pid {run.pid} on {run.host}, user {run.user}",
        f"  command: {' '.join(run.command)}",
        f"  watched {local_time(report.start)} to {local_time(report.end)} "
        f"({human_seconds(report.end - report.start)}); "
        + (f"ended: {run.ended}" if run.ended else "monitoring did not end cleanly (killed?)"),
    ]
    for panel in report.panels:
        for line in panel.lines:
            finite = [v for _, v in line.points if math.isfinite(v)]
            if not finite:
                continue
            reading = (
                f"{panel.format(finite[0])} -> {panel.format(finite[-1])}, "
                f"peak {panel.format(max(finite))}"
            )
            note = f"; {line.note}" if line.note else ""
            name = panel.title if len(panel.lines) == 1 else f"{panel.title} ({line.label})"
            lines.append(f"  {name}: {reading}{note}")
    if report.findings:
        lines.append("findings:")
        for f in report.findings:
            lines.append(
                f"  [{f.severity.value}] {f.kind} since {local_time(f.since)} "
                f"(seen {local_time(f.first_seen)} to {local_time(f.last_seen)}): {f.message}"
            )
    else:
        lines.append("findings: none")
    return "\n".join(lines)
