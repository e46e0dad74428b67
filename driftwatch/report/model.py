"""The report's model: a run's panels (plotted lines with their trends), summaries of its
series and its findings, as ``build`` makes them and the renderings format them."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

from driftwatch.capture.store import Capture
from driftwatch.detect.goodput import Breakdown
from driftwatch.history.reader import RunRecord, StoredFinding
from driftwatch.series import Labels
from driftwatch.units import count_rate, human_bytes, human_count, human_seconds, rate_unit

Point = tuple[float, float]


@dataclass(frozen=True, slots=True)
class TrendLine:
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
    trend: TrendLine | None = None
    limit: float | None = None  # the value the projection runs into, when it does in view
    note: str = ""  # the trend or projection in words
    end: float = math.nan  # the last reading (the last bucket's), not a bucket mean
    peak: float = math.nan  # the highest reading (the buckets' maxima)

    @property
    def points(self) -> list[Point]:
        return [point for segment in self.segments for point in segment]


@dataclass(frozen=True, slots=True)
class Panel:
    title: str
    unit: str  # "bytes", "seconds" or "count"
    lines: list[Line]

    def format(self, value: float) -> str:
        return FORMATS[self.unit](value)


FORMATS: dict[str, Callable[[float], str]] = {
    "bytes": human_bytes,
    "seconds": human_seconds,
    "count": human_count,
}
"""How a panel's unit reads in its notes and tables."""


def bytes_rate(slope: float, span: float) -> str:
    """Growth in bytes a second, seen over ``span`` seconds, per the longest unit the span
    holds: a 14-s climb in MiB/s, hours of growth in GiB/h."""
    seconds, symbol, _ = rate_unit(span)
    return f"{human_bytes(slope * seconds)}/{symbol}"


RATES: dict[str, Callable[[float, float], str]] = {
    "bytes": bytes_rate,
    "count": lambda slope, span: count_rate(slope),
}
"""How a growing signal's rate, given per second and seen over a span of seconds, reads in
a panel of that unit (counts pick their unit by their size)."""


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
    goodput: Breakdown | None = None  # where the wall time went, at the end of the history
    captures: list[Capture] = field(default_factory=list)  # captured at drift, oldest first
    capture_logdir: str = ""  # the TensorBoard logdir of its profiler traces

    @property
    def start(self) -> float:
        return self.run.first_seen

    @property
    def end(self) -> float:
        return self.run.last_seen


def _finite(value: float) -> float | None:
    return value if math.isfinite(value) else None
