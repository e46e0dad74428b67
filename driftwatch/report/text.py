"""``driftwatch report``'s text: a readable summary of a run for the terminal."""

from __future__ import annotations

import math

from driftwatch.causes import cause_line
from driftwatch.report.model import Report
from driftwatch.units import human_bytes, human_seconds, local_time


def to_text(report: Report) -> str:
    """A readable summary for the terminal."""
    run = report.run
    rank = run.meta.get("rank")
    of_rank = f", rank {rank}" if rank else ""
    lines = [
        f"run {run.name} (#{run.id}{of_rank}): pid {run.pid} on {run.host}, user {run.user}",
        f"  command: {' '.join(run.command)}",
        f"  watched {local_time(report.start)} to {local_time(report.end)} "
        f"({human_seconds(report.end - report.start)}); "
        + (f"ended: {run.ended}" if run.ended else "monitoring did not end cleanly (killed?)"),
        *_signal_lines(report),
    ]
    if report.goodput is not None:
        lines.append(f"  goodput: {report.goodput.describe()}")
    lines += _finding_lines(report)
    lines += _capture_lines(report)
    return "\n".join(lines)


def _signal_lines(report: Report) -> list[str]:
    """A line per plotted signal: its first, last and peak values, and its note."""
    lines = []
    for panel in report.panels:
        for line in panel.lines:
            finite = [v for _, v in line.points if math.isfinite(v)]
            if not finite:
                continue
            end = line.end if math.isfinite(line.end) else finite[-1]
            peak = line.peak if math.isfinite(line.peak) else max(finite)
            reading = f"{panel.format(finite[0])} -> {panel.format(end)}, peak {panel.format(peak)}"
            note = f"; {line.note}" if line.note else ""
            name = panel.title if len(panel.lines) == 1 else f"{panel.title} ({line.label})"
            lines.append(f"  {name}: {reading}{note}")
    return lines


def _finding_lines(report: Report) -> list[str]:
    """The findings, each with its ranked causes, or ``findings: none``."""
    if not report.findings:
        return ["findings: none"]
    lines = ["findings:"]
    for f in report.findings:
        lines.append(
            f"  [{f.severity.value}] {f.kind} since {local_time(f.since)} "
            f"(seen {local_time(f.first_seen)} to {local_time(f.last_seen)}): {f.message}"
        )
        lines += (
            f"    cause {rank}: {cause_line(cause)}" for rank, cause in enumerate(f.causes, 1)
        )
    return lines


def _capture_lines(report: Report) -> list[str]:
    """The evidence captured, and how to open its traces; nothing when none was."""
    if not report.captures:
        return []
    lines = ["captures:"]
    lines += (
        f"  {c.what} ({c.label}) at {local_time(c.t)}, {human_bytes(c.bytes)}: {c.path}"
        for c in report.captures
    )
    if any(c.what == "trace" for c in report.captures):
        lines.append(f"  traces: tensorboard --logdir {report.capture_logdir}")
    return lines
