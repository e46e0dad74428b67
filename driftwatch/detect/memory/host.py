"""Host memory (RSS) drift, with the class of the leak: tensors kept alive, retracing, or
Python and framework state, told from TensorFlow's allocator and tracing over the window
that found it. Reasoning: docs/detectors.md, "Memory drift".
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Iterable

import numpy as np

from driftwatch.detect.memory.drift import MemoryDriftDetector
from driftwatch.detect.memory.startup import LOADING_SERIES
from driftwatch.detect.memory.trends import DEFAULT_THRESHOLDS, MemoryThresholds, Trend
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


class HostMemoryDetector(MemoryDriftDetector):
    """Host RSS drift, with the likely leak class from how TF memory and tracing behave.

    TF allocator memory is kept at the same scales as RSS, so the class is judged over the
    window that found the trend, whether that is seconds or hours. Retracing shows as the
    hook's tracing count or, without the hook (custom loops), TF's retracing warnings.
    """

    def __init__(self, thresholds: MemoryThresholds = DEFAULT_THRESHOLDS) -> None:
        super().__init__(
            "rss_bytes", "host_memory_drift", "host memory (RSS)", "memory_limit_bytes", thresholds
        )
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
        and tracing over ``trend``'s window."""
        tf_rising = False
        tf_known = False
        tf_slope = math.nan  # the steepest device's
        for scales in self._tf.values():
            points = _covering(scales.values(), trend.since)
            if len(points) >= 4:  # at most ``points`` means: cheap
                tf_known = True
                times = np.array([t for t, _ in points])
                values = np.array([m for _, m in points])
                slope, _ = theil_sen(times, values)
                tf_slope = max(slope, tf_slope) if math.isfinite(tf_slope) else slope
                keeps_pace = slope >= TF_SHARE_OF_LEAK * trend.slope
                tf_rising = tf_rising or (keeps_pace and mann_kendall(values).p < TF_RISE_P)
        if tf_rising:
            return (
                "tensors_kept_alive",
                (
                    "TensorFlow's own allocator grows with it: tensors are being kept alive, "
                    "e.g. outputs or losses appended to a Python list, or a tf.Variable/metric "
                    "that accumulates, or whole models kept alive (models built in a loop: "
                    "keras.backend.clear_session() between them). Keep Python floats "
                    "(loss.numpy()) instead of tensors."
                ),
                tf_slope,
            )
        if self._retraced(trend.since):
            return (
                "retracing",
                (
                    "TensorFlow allocator memory is flat while the train function keeps being "
                    "retraced: each trace keeps a new graph alive. Pass tensors, not Python "
                    "numbers, to tf.function (tf.constant(lr)), or give it an input_signature; "
                    "use reduce_retracing=True for varying shapes."
                ),
                tf_slope,
            )
        if tf_known:
            return (
                "framework_state",
                (
                    "TensorFlow allocator memory and tracing are flat: Python or framework "
                    "state grows, e.g. models or layers built in a loop without "
                    "keras.backend.clear_session(), histories or caches that keep growing, or "
                    "allocator fragmentation (try TCMALLOC or jemalloc)."
                ),
                tf_slope,
            )
        if self._tf:
            advice = (
                "TensorFlow's allocator has not been probed over this window yet: the likely "
                "class follows once it has."
            )
        elif self._traces["tracing_count"]:  # the hook runs: the allocator keeps no statistics
            advice = (
                "TensorFlow's allocator keeps no statistics here (its CPU allocator does not "
                "by default; driftwatch run --cpu-allocator-stats turns them on), so tensors "
                "cannot be told from Python state: compare two tracemalloc snapshots."
            )
        else:
            advice = (
                "Without the in-process hook driftwatch cannot tell tensors from Python state: "
                "run the job under driftwatch run, or compare two tracemalloc snapshots."
            )
        return "unknown", advice, tf_slope

    def explain(self, trend: Trend) -> tuple[str, dict[str, float | str]]:
        leak_class, advice, tf_slope = self.leak_class(trend)
        evidence: dict[str, float | str] = {"leak_class": leak_class}
        if math.isfinite(tf_slope):
            evidence["tf_allocator_slope_bytes_per_hour"] = tf_slope * 3600
        return advice, evidence
