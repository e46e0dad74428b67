"""What a person sees: the live terminal view, the plain progress line, the final summary.

``LiveView`` and ``PlainView`` are a monitor's sinks; everything here reads the snapshot
alone (its values, and the run's histories through ``Snapshot.store``).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Iterable
from typing import TextIO

from rich.live import Live
from rich.table import Table

from driftwatch.detect.goodput import Breakdown
from driftwatch.detect.stats import mann_kendall, theil_sen
from driftwatch.findings import Finding, Severity
from driftwatch.runtime.snapshot import Snapshot
from driftwatch.runtime.store import SeriesView
from driftwatch.series import WATCHED, Labels
from driftwatch.units import clock, count_rate, human_bytes, human_count, human_seconds

RATE_WINDOW_SECONDS = 300.0
"""Seconds of raw samples behind a growth rate shown."""
SEVERITY_STYLE = {Severity.INFO: "cyan", Severity.WARNING: "yellow", Severity.CRITICAL: "bold red"}
"""The rich style of each severity in the live view."""


def rate_per_second(
    history: SeriesView | None, min_span: float, window: float = RATE_WINDOW_SECONDS
) -> float:
    """Growth per second over the newest ``window`` seconds of raw samples.

    NaN until the samples span more than ``min_span`` seconds: for a noisy series, a rate from
    a few seconds of data projected to an hour would be mostly noise.
    """
    times, values = _newest(history, window, keep=2)
    if len(times) < 2:
        return math.nan
    start = 0
    elapsed = times[-1] - times[start]
    return (values[-1] - values[start]) / elapsed if elapsed > min_span else math.nan


def _newest(
    history: SeriesView | None, window: float, keep: int = 0
) -> tuple[list[float], list[float]]:
    """The times and values of the raw samples of the newest ``window`` seconds (at least
    the newest ``keep``)."""
    if history is None:
        return [], []
    times, values = history.raw.last(512, 0), history.raw.last(512, 1)
    if not times:
        return [], []
    start = next(i for i, t in enumerate(times) if t >= times[-1] - window)
    start = max(0, min(start, len(times) - keep))
    return times[start:], values[start:]


class _Reader:
    """Named access to one snapshot's values and histories."""

    def __init__(self, snapshot: Snapshot) -> None:
        self.snapshot = snapshot

    def value(self, series: str, labels: Labels = ()) -> float:
        return self.snapshot.values.get((series, labels), math.nan)

    def history(self, series: str, labels: Labels = ()) -> SeriesView | None:
        return self.snapshot.store.get((series, labels))

    def labels_of(self, series: str) -> list[Labels]:
        return sorted(labels for name, labels in self.snapshot.values if name == series)


Row = tuple[str, str]


def signal_rows(snapshot: Snapshot) -> list[tuple[str, str]]:
    """(signal, reading) pairs shown by both the live view and the plain line: the rows of
    ``WATCHED`` that have a reading, in its order."""
    r = _Reader(snapshot)
    return [
        row
        for series, watched in WATCHED.items()
        if watched.view is not None
        for row in _VIEW_ROWS[series](r, watched.view)
    ]


def _rss_rows(r: _Reader, label: str) -> list[Row]:
    rate = trend_per_second(r.history("rss_bytes")) * 3600
    return [(label, f"{human_bytes(r.value('rss_bytes'))} ({human_bytes(rate)}/h)")]


TREND_SECONDS = 60.0
"""Seconds a trend's samples must span to be shown whether or not it is significant."""
EARLY_TREND_SECONDS = 5.0
"""Seconds a trend's samples must span before the view shows it (if significant)."""
EARLY_TREND_P = 0.01
"""Mann-Kendall p-value under which a young series' trend is shown as its rate."""
TREND_POINTS = 120
"""Samples a trend is fitted to at most (Theil-Sen is quadratic in them)."""


def trend_per_second(history: SeriesView | None, window: float = RATE_WINDOW_SECONDS) -> float:
    """Theil-Sen growth per second over the newest half of the newest ``window`` seconds of
    raw samples (a start-up climb drops out as the run goes on), once that half spans
    ``TREND_SECONDS``, or ``EARLY_TREND_SECONDS`` with a Mann-Kendall trend (a fast leak
    shows within seconds); else NaN."""
    t, y = _newest(history, window)
    if len(t) < 2:
        return math.nan
    half = next(i for i, ti in enumerate(t) if ti >= (t[0] + t[-1]) / 2)
    t, y = t[half:], y[half:]
    if len(t) < 3 or t[-1] - t[0] < EARLY_TREND_SECONDS:
        return math.nan
    step = -(-len(t) // TREND_POINTS)  # ceiling division: every step-th sample
    t, y = t[::step], y[::step]
    if t[-1] - t[0] < TREND_SECONDS and mann_kendall(y).p >= EARLY_TREND_P:
        return math.nan
    return theil_sen(t, y)[0]


def _cpu_rows(r: _Reader, label: str) -> list[Row]:
    cpu = rate_per_second(r.history("cpu_seconds"), window=30.0, min_span=0.5) * 100
    return [(label, f"{cpu:.0f}%" if math.isfinite(cpu) else "-")]


def _count_rows(series: str, limit_series: str) -> Callable[[_Reader, str], list[Row]]:
    """A count's row (threads, open descriptors): the count, its limit and its trend once
    one shows (``trend_per_second``)."""

    def rows(r: _Reader, label: str) -> list[Row]:
        count = r.value(series)
        if not math.isfinite(count):
            return [(label, "-")]
        reading = human_count(count)
        limit = r.value(limit_series)
        if math.isfinite(limit):
            reading += f" of {human_count(limit)}"
        rate = trend_per_second(r.history(series))
        if rate > 0:  # False while NaN
            reading += f" (+{count_rate(rate)})"
        return [(label, reading)]

    return rows


def _workers_rows(r: _Reader, label: str) -> list[Row]:
    memory = r.value("workers_memory_bytes")
    if not math.isfinite(memory):  # no series until the job's first worker is found
        return []
    reading = f"{r.value('job_processes') - 1:.0f} processes, {human_bytes(memory)}"
    largest = r.labels_of("largest_worker_memory_bytes")
    if largest:
        biggest = dict(largest[-1])
        held = human_bytes(r.value("largest_worker_memory_bytes", largest[-1]))
        reading += f", largest pid {biggest['pid']} {held}"
    return [(label, reading)]


def _gpu_memory_rows(r: _Reader, label: str) -> list[Row]:
    rows = []
    for labels in r.labels_of("gpu_process_memory_bytes"):
        used = r.value("gpu_process_memory_bytes", labels)
        total = r.value("gpu_memory_total_bytes", labels)
        rows.append((label.format(**dict(labels)), f"{human_bytes(used)} of {human_bytes(total)}"))
    return rows


def _event_file_rows(r: _Reader, label: str) -> list[Row]:
    files = r.value("event_files")
    if not math.isfinite(files):  # no series until the run's first event file is found
        source = next((s for s in r.snapshot.sources if s.name == "eventfiles"), None)
        return [(label, "none found")] if source is not None and source.up else []
    # Event files only grow, so their projection is honest from the second sample on.
    growth = rate_per_second(r.history("event_file_bytes"), min_span=0.0) * 3600
    reading = (
        f"{files:.0f} files, {human_bytes(r.value('event_file_bytes'))} "
        f"({human_bytes(growth)}/h), largest "
        f"{human_bytes(r.value('event_file_largest_bytes'))}"
    )
    return [(label, reading)]


def _step_rows(r: _Reader, label: str) -> list[Row]:
    if not math.isfinite(r.value("train_step")):
        return []
    step_seconds = r.value("step_seconds")
    rate = 1 / step_seconds if step_seconds > 0 else math.nan
    reading = (
        f"{r.value('train_step'):.0f}, {human_seconds(step_seconds)}/step ({rate:.1f} steps/s)"
    )
    return [(label, reading)]


def _gap_rows(r: _Reader, label: str) -> list[Row]:
    gap, step_seconds = r.value("step_gap_seconds"), r.value("step_seconds")
    if not (math.isfinite(gap) and step_seconds > 0):
        return []
    return [(label, f"{human_seconds(gap)}/step ({gap / step_seconds:.0%})")]


def _share_rows(series: str) -> Callable[[_Reader, str], list[Row]]:
    """The rows of a share of step time (waiting for input, for the other ranks)."""

    def rows(r: _Reader, label: str) -> list[Row]:
        share = r.value(series)
        return [(label, f"{share:.0%} of each step")] if math.isfinite(share) else []

    return rows


def _tf_memory_rows(r: _Reader, label: str) -> list[Row]:
    return [
        (
            label.format(**dict(labels)),
            f"{human_bytes(r.value('tf_allocator_current_bytes', labels))} "
            f"(peak {human_bytes(r.value('tf_allocator_peak_bytes', labels))})",
        )
        for labels in r.labels_of("tf_allocator_current_bytes")
    ]


def _tracing_rows(r: _Reader, label: str) -> list[Row]:
    traces = r.value("tracing_count")
    warnings = r.value("retracing_warnings_total")
    if not (math.isfinite(traces) or (math.isfinite(warnings) and warnings > 0)):
        return []
    # Counted from the watched functions' first reading: their first traces are not in it.
    retraced = "no retracing" if traces == 0 else f"{traces:.0f} retraces"
    shown = [retraced] if math.isfinite(traces) else []
    if math.isfinite(warnings) and warnings > 0:
        shown.append(f"{warnings:.0f} retracing warnings")
    return [(label, ", ".join(shown))]


def _nonfinite_rows(r: _Reader, label: str) -> list[Row]:
    counts = [r.value(s) for s in ("nonfinite_total", "hook_nonfinite_total")]
    nonfinite = max((c for c in counts if math.isfinite(c)), default=0.0)
    return [(label, f"{nonfinite:.0f}")] if nonfinite > 0 else []


def _breakdown(r: _Reader) -> Breakdown | None:
    return Breakdown.of(
        {
            dict(labels)["phase"]: r.value("wall_seconds", labels)
            for labels in r.labels_of("wall_seconds")
        }
    )


def _goodput_rows(r: _Reader, label: str) -> list[Row]:
    breakdown = _breakdown(r)
    if breakdown is None or not math.isfinite(breakdown.ratio):
        return []
    productive = human_seconds(breakdown.seconds["productive"])
    waited = breakdown.seconds["input_wait"]
    input_wait = f"; {human_seconds(waited)} waiting for input" if waited > 0 else ""
    return [
        (
            label,
            f"{breakdown.ratio:.0%} ({productive} in steps of {human_seconds(breakdown.total)}"
            f"{input_wait})",
        )
    ]


_VIEW_ROWS: dict[str, Callable[[_Reader, str], list[Row]]] = {
    "rss_bytes": _rss_rows,
    "cpu_seconds": _cpu_rows,
    "threads": _count_rows("threads", "threads_limit"),
    "open_fds": _count_rows("open_fds", "fd_limit"),
    "workers_memory_bytes": _workers_rows,
    "gpu_process_memory_bytes": _gpu_memory_rows,
    "event_file_bytes": _event_file_rows,
    "step_seconds": _step_rows,
    "step_gap_seconds": _gap_rows,
    "input_wait_share": _share_rows("input_wait_share"),
    "collective_wait_share": _share_rows("collective_wait_share"),
    "tf_allocator_current_bytes": _tf_memory_rows,
    "tracing_count": _tracing_rows,
    "nonfinite_total": _nonfinite_rows,
    "wall_seconds": _goodput_rows,
}
"""How the live view reads each signal of ``WATCHED`` it shows: none, one or more rows."""


def render_table(snapshot: Snapshot, listen_url: str | None) -> Table:
    """The live view of one snapshot."""
    target = snapshot.target
    title = f"driftwatch · {snapshot.title} · pid {target.pid}"
    caption = f"metrics: {listen_url}" if listen_url else None
    table = Table(title=title, caption=caption, show_header=False, expand=False)
    table.add_column("signal", style="bold")
    table.add_column("reading")
    for name, reading in signal_rows(snapshot):
        table.add_row(name, reading)
    for status in snapshot.sources:  # the plain line leaves these to the one-time warning
        if not status.up:
            table.add_row(f"{status.name} source", f"[dim]off: {status.reason}[/]")
    for finding in snapshot.findings:
        table.add_row(
            f"[{SEVERITY_STYLE[finding.severity]}]{finding.severity.value}[/]", finding.message
        )
    return table


def render_line(snapshot: Snapshot) -> str:
    """One line per tick, for logs and terminals that are not interactive."""
    stamp = clock(snapshot.t)
    readings = "; ".join(f"{name}: {reading}" for name, reading in signal_rows(snapshot))
    return f"{stamp} {snapshot.title}: {readings}"


def render_summary(
    snapshot: Snapshot, findings: Iterable[Finding], reason: str, started: float
) -> str:
    """The report printed when monitoring ends; ``findings``: every kind reported in the run."""
    r = _Reader(snapshot)
    lines = [
        f"driftwatch: monitoring of {snapshot.title} (pid {snapshot.target.pid}) stopped: {reason}",
        f"  watched for {human_seconds(snapshot.t - started)}, {snapshot.ticks} samples",
    ]
    for series, watched in WATCHED.items():
        if watched.summary is not None:
            lines.extend(f"  {line}" for line in _SUMMARY_LINES[series](r, watched.summary))
    findings = list(findings)
    if findings:
        lines.append("  findings:")
        lines.extend(f"    [{f.severity.value}] {f.kind}: {f.message}" for f in findings)
    else:
        lines.append("  findings: none")
    return "\n".join(lines)


def _memory_summary(series: str, r: _Reader, label: str) -> list[str]:
    """A memory series at its start, its peak and at the end."""
    history = r.history(series)
    if history is None or history.first is None:
        return []
    return [
        f"{label}: {human_bytes(history.first[1])} at start, peak {human_bytes(history.peak)}, "
        f"{human_bytes(r.value(series))} at the end"
    ]


def _count_summary(series: str, limit_series: str) -> Callable[[_Reader, str], list[str]]:
    """A count's summary line (threads, open descriptors): at the start, its peak, at the
    end, and its limit."""

    def lines(r: _Reader, label: str) -> list[str]:
        history = r.history(series)
        if history is None or history.first is None:
            return []
        line = (
            f"{label}: {human_count(history.first[1])} at start, peak "
            f"{human_count(history.peak)}, {human_count(r.value(series))} at the end"
        )
        limit = r.value(limit_series)
        return [line + (f", limit {human_count(limit)}" if math.isfinite(limit) else "")]

    return lines


def _event_file_summary(r: _Reader, label: str) -> list[str]:
    events = r.history("event_file_bytes")
    if events is None or events.first is None:
        return []
    return [
        f"{label}: {human_bytes(events.first[1])} -> "
        f"{human_bytes(r.value('event_file_bytes'))} in {r.value('event_files'):.0f} file(s)"
    ]


def _step_summary(r: _Reader, label: str) -> list[str]:
    if not math.isfinite(r.value("train_step")):
        return []
    return [
        f"{label}: last step {r.value('train_step'):.0f}, "
        f"recent median {human_seconds(r.value('step_seconds'))}/step"
    ]


def _goodput_summary(r: _Reader, label: str) -> list[str]:
    breakdown = _breakdown(r)
    if breakdown is None or not math.isfinite(breakdown.ratio):
        return []
    return [f"{label}: {breakdown.describe()}"]


_SUMMARY_LINES: dict[str, Callable[[_Reader, str], list[str]]] = {
    "rss_bytes": functools.partial(_memory_summary, "rss_bytes"),
    "workers_memory_bytes": functools.partial(_memory_summary, "workers_memory_bytes"),
    "threads": _count_summary("threads", "threads_limit"),
    "open_fds": _count_summary("open_fds", "fd_limit"),
    "event_file_bytes": _event_file_summary,
    "step_seconds": _step_summary,
    "wall_seconds": _goodput_summary,
}
"""How the summary reads each signal of ``WATCHED`` it shows: none, one or more lines."""


class LiveView:
    """A sink that shows each snapshot in a rich ``Live`` display (the caller's to start and
    stop)."""

    def __init__(self, live: Live, listen_url: str | None) -> None:
        self._live = live
        self._listen_url = listen_url

    def publish(self, snapshot: Snapshot) -> None:
        self._live.update(render_table(snapshot, self._listen_url), refresh=True)

    def close(self, snapshot: Snapshot, ended: str) -> None:
        """Nothing to do: the caller stops the display and prints the summary."""


class PlainView:
    """A sink that prints a ``render_line`` whenever ``every`` seconds of run time have
    passed since the last one, however fast sampling goes."""

    def __init__(self, every: float, file: TextIO | None = None) -> None:
        self._every = every
        self._file = file  # None: the sys.stdout of the moment
        self._printed = -math.inf

    def publish(self, snapshot: Snapshot) -> None:
        if snapshot.t - self._printed >= self._every:
            self._printed = snapshot.t
            print(render_line(snapshot), file=self._file, flush=True)

    def close(self, snapshot: Snapshot, ended: str) -> None:
        """Nothing to do: the caller prints the summary."""
