"""Host memory (RSS) drift, with the class of the leak: tensors kept alive, retracing, or
Python and framework state, told from TensorFlow's allocator and tracing over the window
that found it. Reasoning: docs/memory.md, "The leak class".
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np

from driftwatch.causes import LEAK_CLASSES, UNKNOWN_LEAK_CLASS
from driftwatch.detect.memory.drift import ResourceDriftDetector
from driftwatch.detect.memory.resources import RESOURCES
from driftwatch.detect.memory.startup import LOADING_SERIES
from driftwatch.detect.memory.trends import MemoryThresholds, Trend
from driftwatch.detect.stats import mann_kendall, theil_sen
from driftwatch.detect.windows import WindowMeans
from driftwatch.series import Labels, Sample

TF_SHARE_OF_LEAK = 0.25
"""Share of RSS's rate at which a rising TF allocator makes the leak one of tensors."""
TF_RISE_P = 0.1
"""Mann-Kendall level (uncorrected) of the allocator's rise once it keeps pace."""


def _covering(scales: Iterable[WindowMeans], since: float) -> list[tuple[float, float]]:
    """(start, floor) since ``since``, the window still filling included (a leak found
    within seconds has few windows behind it), from the narrowest scale that reaches back
    that far with at least 4 windows (probes may be sparser than the windows), else the one
    with the most windows since then."""
    best: list[tuple[float, float]] = []
    for means in sorted(scales, key=lambda m: m.width):
        windows = means.windows(with_open=True)
        points = [(t, floor) for t, _, floor, _ in windows if t >= since]
        if len(points) >= 4 and windows[0][0] <= since:
            return points
        if len(points) > len(best):
            best = points
    return best


@dataclass(frozen=True, slots=True)
class AllocatorTrend:
    """TF allocator memory over a leak's window: whether any device was probed enough to
    tell (``known``), whether one rose with RSS, and the steepest one's slope (bytes/s)."""

    known: bool = False
    rising: bool = False
    slope: float = math.nan


class HostMemoryDetector(ResourceDriftDetector):
    """Host RSS drift, with the likely leak class from how TF memory and tracing behave.

    TF allocator memory is kept at the same scales as RSS, so the class is judged over the
    window that found the trend, whether that is seconds or hours. Retracing shows as the
    hook's tracing count or, without the hook (custom loops), TF's retracing warnings.
    """

    def __init__(self, thresholds: MemoryThresholds | None = None) -> None:
        super().__init__(RESOURCES["host_memory"], thresholds)
        self.series = self.series | {
            "tf_allocator_current_bytes",
            "tracing_count",
            "retracing_warnings_total",
            *LOADING_SERIES,
        }
        self._tf: dict[Labels, dict[float, WindowMeans]] = {}
        self._traces: dict[str, deque[tuple[float, float]]] = {
            "tracing_count": deque(maxlen=4096),
            "retracing_warnings_total": deque(maxlen=1),
        }

    def observe(self, sample: Sample) -> None:
        if sample.series == "tf_allocator_current_bytes":
            scales = self._tf.get(sample.labels)
            if scales is None:
                scales = self._tf[sample.labels] = {
                    w: WindowMeans(w, self.thresholds.points) for w in self.thresholds.scales
                }
            for means in scales.values():
                means.add(sample.t, sample.value)
        elif sample.series in self._traces:
            self._traces[sample.series].append((sample.t, sample.value))
        else:
            super().observe(sample)

    def _retraced(self, since: float) -> bool:
        """Whether the train function was traced again since ``since``, or TF ever warned
        of frequent retracing: it warns at most twice per function, early on, however
        long the retracing goes on (``FREQUENT_TRACING_WARNING_MAX_WARNING_PER_DETECTOR``)."""
        counts = self._traces["tracing_count"]
        traces = [c for t, c in counts if t >= since]
        if len(traces) >= 2 and traces[-1] - traces[0] >= 2:
            return True
        warnings = self._traces["retracing_warnings_total"]
        return bool(warnings) and warnings[-1][1] > 0

    def leak_class(self, trend: Trend) -> tuple[str, str, float]:
        """(class, advice, TF allocator slope in bytes/s or NaN) from TF allocator memory
        and tracing over ``trend``'s window; the advice is the class's in ``LEAK_CLASSES``
        (``UNKNOWN_LEAK_CLASS`` for ``unknown``)."""
        allocator = self._allocator_over(trend)
        name = self._classify(allocator, trend.since)
        if name in LEAK_CLASSES:
            return name, LEAK_CLASSES[name].advice, allocator.slope
        return "unknown", UNKNOWN_LEAK_CLASS[self._why_unknown()], allocator.slope

    def _allocator_over(self, trend: Trend) -> AllocatorTrend:
        """How TF allocator memory moved over ``trend``'s window, on every device probed:
        rising with it (at ``TF_SHARE_OF_LEAK`` of its rate, significant at ``TF_RISE_P``) on
        any of them, and the steepest one's slope."""
        found = AllocatorTrend()
        for scales in self._tf.values():
            points = _covering(scales.values(), trend.since)
            if len(points) < 4:
                continue
            times = np.array([t for t, _ in points])  # at most ``points`` means: cheap
            values = np.array([m for _, m in points])
            slope, _ = theil_sen(times, values)
            keeps_pace = slope >= TF_SHARE_OF_LEAK * trend.slope
            found = AllocatorTrend(
                known=True,
                rising=found.rising or (keeps_pace and mann_kendall(values).p < TF_RISE_P),
                slope=max(slope, found.slope) if math.isfinite(found.slope) else slope,
            )
        return found

    def _classify(self, allocator: AllocatorTrend, since: float) -> str:
        """The leak class's name in ``LEAK_CLASSES``, or ``unknown``: tensors when the
        allocator rises with RSS, retracing when the train function was traced again, Python
        or framework state when the allocator was probed and neither holds."""
        if allocator.rising:
            return "tensors_kept_alive"
        if self._retraced(since):
            return "retracing"
        return "framework_state" if allocator.known else "unknown"

    def _why_unknown(self) -> str:
        """Why the class cannot be told, as ``UNKNOWN_LEAK_CLASS`` names it."""
        if self._tf:
            return "not_probed_yet"
        if self._traces["tracing_count"]:  # the hook runs: the allocator keeps no statistics
            return "no_allocator_statistics"
        return "no_hook"

    def explain(self, trend: Trend) -> tuple[str, dict[str, float | str]]:
        leak_class, advice, tf_slope = self.leak_class(trend)
        evidence: dict[str, float | str] = {"leak_class": leak_class}
        if math.isfinite(tf_slope):
            evidence["tf_allocator_slope_bytes_per_hour"] = tf_slope * 3600
        return advice, evidence
