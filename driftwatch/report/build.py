"""A run's report from its history: panels of the signals a person looks at (``WATCHED``),
each with its trend or projection, summaries of every series, and the findings."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import numpy as np

from driftwatch.capture.store import list_captures, run_dir, trace_logdir
from driftwatch.detect.goodput import Breakdown
from driftwatch.detect.stats import theil_sen
from driftwatch.history.reader import HistoryReader, StoredBucket
from driftwatch.report.model import (
    FORMATS,
    RATES,
    Line,
    Panel,
    Point,
    Report,
    SeriesSummary,
    TrendLine,
)
from driftwatch.series import WATCHED, Labels, SeriesKey
from driftwatch.units import human_seconds, rate_unit

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


def build(reader: HistoryReader, selector: str | None) -> Report:
    """The report of the run ``selector`` names (the latest run when ``None``)."""
    run = reader.run(selector)
    series = reader.series(run.id)
    summaries = [s for key, buckets in sorted(series.items()) if (s := _summary(key, buckets))]
    goodput = Breakdown.of(
        {dict(s.labels)["phase"]: s.last[1] for s in summaries if s.series == "wall_seconds"}
    )
    findings = reader.findings(run.id)
    captures = run_dir(Path(reader.path), run.host, run.pid, run.create_time)
    return Report(
        str(reader.path),
        run,
        _panels(series),
        summaries,
        findings,
        goodput=goodput,
        captures=list_captures(captures),
        capture_logdir=str(trace_logdir(captures)),
    )


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


def _fit(points: list[Point], start: float, fewest: int = 3) -> TrendLine | None:
    """Theil-Sen line through the points from ``start`` on; ``None`` with fewer than
    ``fewest``."""
    kept = [p for p in points if p[0] >= start and math.isfinite(p[1])]
    if len(kept) < fewest:
        return None
    if len(kept) > FIT_POINTS:
        kept = _binned(kept, FIT_POINTS)
    slope, intercept = theil_sen([p[0] for p in kept], [p[1] for p in kept])
    if not math.isfinite(slope):
        return None
    return TrendLine(slope, intercept, kept[0][0], kept[-1][0], kept[-1][0])


def _readings(line: Line, buckets: list[StoredBucket]) -> Line:
    """``line`` with the run's last and highest readings, which bucket means smooth away."""
    finite = [b for b in buckets if b.count > 0]
    if not finite:
        return line
    return replace(line, end=finite[-1].last, peak=max(b.max for b in finite))


def _step_line(buckets: list[StoredBucket]) -> Line:
    segments = _segments(buckets)
    points = [p for segment in segments for p in segment]
    t0, t1 = points[0][0], points[-1][0]
    trend = _fit(points, t0 + WARMUP_SHARE * (t1 - t0))
    note = ""
    if trend is not None and trend.at(trend.start) > 0:
        seconds, _, name = rate_unit(trend.end - trend.start)
        rate = trend.slope * seconds / trend.at(trend.start)
        now = human_seconds(trend.at(trend.end))
        note = f"trend {rate:+.1%} per {name} ({now}/step now)"
    return Line("step time", segments, trend, note=note)  # per step: the means are the view


def _memory_line(
    label: str, buckets: list[StoredBucket], limit: float | None, unit: str = "bytes"
) -> Line:
    """The signal with the newest half's trend projected ahead, and when it meets ``limit``;
    its amounts in ``unit`` (bytes for memory, a count for descriptors and threads)."""
    segments = _segments(buckets)
    points = [p for segment in segments for p in segment]
    t0, t1 = points[0][0], points[-1][0]
    # The newest half, or the newest 3 readings of a run too short for 3 in its half; a run
    # of two buckets (a 15-s job in 10-s buckets) has the line through both.
    finite = [p[0] for p in points if math.isfinite(p[1])]
    newest = finite[-3] if len(finite) >= 3 else t0
    fit = _fit(points, min((t0 + t1) / 2, newest), fewest=min(3, max(2, len(finite))))
    if fit is None:
        return _readings(Line(label, segments), buckets)
    ahead = t1 + PROJECTION_SHARE * (t1 - t0)
    span = t1 - fit.start
    note = f"{RATES[unit](fit.slope, span)} over the newest {human_seconds(span)}"
    shown_limit = None
    if limit is not None and fit.slope > 0:
        reaches = (limit - fit.at(t1)) / fit.slope + t1
        note += f"; at this rate it reaches {FORMATS[unit](limit)} in {human_seconds(reaches - t1)}"
        if reaches <= ahead:
            ahead, shown_limit = max(reaches, t1), limit
    trend = TrendLine(fit.slope, fit.intercept, fit.start, fit.end, ahead)
    return _readings(Line(label, segments, trend, shown_limit, note), buckets)


def _plain_line(label: str, buckets: list[StoredBucket]) -> Line:
    return _readings(Line(label, _segments(buckets)), buckets)


def _last_mean(buckets: list[StoredBucket] | None) -> float | None:
    values = [b.mean for b in buckets or () if math.isfinite(b.mean)]
    return values[-1] if values else None


Buckets = dict[SeriesKey, list[StoredBucket]]


def _panels(series: Buckets) -> list[Panel]:
    """The signals a person looks at first (``WATCHED``), in the report's order; those the run
    lacks are left out."""
    shown = sorted((w.panel_rank, name, w.panel) for name, w in WATCHED.items() if w.panel)
    return [panel for _, name, title in shown for panel in _PANELS[name](series, title)]


def _labelled(series: Buckets, name: str) -> list[tuple[Labels, list[StoredBucket]]]:
    return [(key[1], b) for key, b in sorted(series.items()) if key[0] == name and b]


def _step_panels(series: Buckets, title: str) -> list[Panel]:
    steps = series.get(("step_seconds", ()))
    return [Panel(title, "seconds", [_step_line(steps)])] if steps else []


def _rss_panels(series: Buckets, title: str) -> list[Panel]:
    rss = series.get(("rss_bytes", ()))
    if not rss:
        return []
    limit = _last_mean(series.get(("memory_limit_bytes", ())))
    return [Panel(title, "bytes", [_memory_line("RSS", rss, limit)])]


def _workers_panels(series: Buckets, title: str) -> list[Panel]:
    workers = series.get(("workers_memory_bytes", ()))
    if not workers:
        return []
    limit = _last_mean(series.get(("workers_memory_limit_bytes", ())))
    return [Panel(title, "bytes", [_memory_line("workers", workers, limit)])]


def _count_panels(name: str, limit_series: str) -> Callable[[Buckets, str], list[Panel]]:
    """A count's panel (descriptors, threads) with its trend projected to its limit."""

    def panels(series: Buckets, title: str) -> list[Panel]:
        buckets = series.get((name, ()))
        if not buckets:
            return []
        limit = _last_mean(series.get((limit_series, ())))
        return [Panel(title, "count", [_memory_line(title, buckets, limit, "count")])]

    return panels


def _tf_memory_panels(series: Buckets, title: str) -> list[Panel]:
    return [
        Panel(
            title.format(**dict(labels)),
            "bytes",
            [_memory_line(f"TF {dict(labels)['device']}", buckets, None)],
        )
        for labels, buckets in _labelled(series, "tf_allocator_current_bytes")
    ]


def _gpu_memory_panels(series: Buckets, title: str) -> list[Panel]:
    panels = []
    for labels, buckets in _labelled(series, "gpu_process_memory_bytes"):
        total = _last_mean(series.get(("gpu_memory_total_bytes", labels)))
        line = _memory_line(f"GPU {dict(labels)['gpu']}", buckets, total)
        panels.append(Panel(title.format(**dict(labels)), "bytes", [line]))
    return panels


def _event_file_panels(series: Buckets, title: str) -> list[Panel]:
    files = [
        _plain_line(label, series[(name, ())])
        for name, label in (("event_file_bytes", "all"), ("event_file_largest_bytes", "largest"))
        if series.get((name, ()))
    ]
    return [Panel(title, "bytes", files)] if files else []


def _upload_panels(series: Buckets, title: str) -> list[Panel]:
    uploads = series.get(("nondisk_write_bytes", ()))
    return [Panel(title, "bytes", [_memory_line("written", uploads, None)])] if uploads else []


_PANELS: dict[str, Callable[[Buckets, str], list[Panel]]] = {
    "step_seconds": _step_panels,
    "rss_bytes": _rss_panels,
    "workers_memory_bytes": _workers_panels,
    "tf_allocator_current_bytes": _tf_memory_panels,
    "gpu_process_memory_bytes": _gpu_memory_panels,
    "event_file_bytes": _event_file_panels,
    "nondisk_write_bytes": _upload_panels,
    "open_fds": _count_panels("open_fds", "fd_limit"),
    "threads": _count_panels("threads", "threads_limit"),
}
"""How the report draws each signal of ``WATCHED`` that has a panel."""
