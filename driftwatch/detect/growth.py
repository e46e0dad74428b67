"""Things that should stay proportional to training but grow: event files and uploads."""

from __future__ import annotations

import itertools
import math

import numpy as np

from driftwatch.detect import Detector, Evaluation
from driftwatch.detect.basic import clock
from driftwatch.detect.memory import WindowMeans, human_bytes, human_duration
from driftwatch.detect.stats import mann_kendall, theil_sen
from driftwatch.findings import Finding, Severity
from driftwatch.series import Sample

MIB = 1 << 20


class PerStepGrowthDetector:
    """Bytes written per training step, per window: a rising trend means each step writes
    more than the one before (image summaries, histograms, an upload that re-sends
    everything), which no fixed rate threshold would see."""

    def __init__(
        self,
        bytes_series: str,
        kind: str,
        what: str,
        advice: str,
        width: float = 60.0,
        points: int = 24,
        min_points: int = 8,
        alpha: float = 0.001,
        min_increase: float = 0.5,
    ) -> None:
        self.name = kind
        self.kind = kind
        self.what = what
        self.advice = advice
        self.bytes_series = bytes_series
        self.series = frozenset({bytes_series, "train_step"})
        self.width = width
        self.min_points = min_points
        self.alpha = alpha
        self.min_increase = min_increase
        self._bytes = WindowMeans(width, points + 1)
        self._steps = WindowMeans(width, points + 1)
        self._evaluated: tuple[tuple[int, int], Evaluation] | None = None

    def observe(self, sample: Sample) -> None:
        target = self._bytes if sample.series == self.bytes_series else self._steps
        target.add(sample.t, sample.value)

    def per_step(self) -> tuple[np.ndarray, np.ndarray]:
        """(window start, bytes per step) for consecutive windows where steps advanced."""
        steps = dict(self._steps.means)
        rows = [(t, b, steps[t]) for t, b in self._bytes.means if t in steps]
        times, ratios = [], []
        for (_, b0, s0), (t1, b1, s1) in itertools.pairwise(rows):
            if s1 > s0 and b1 >= b0:
                times.append(t1)
                ratios.append((b1 - b0) / (s1 - s0))
        return np.array(times), np.array(ratios)

    def evaluate(self, now: float) -> Evaluation:
        """Recomputed only when a window has closed since the last call."""
        key = (self._bytes.version, self._steps.version)
        if self._evaluated is None or self._evaluated[0] != key:
            self._evaluated = (key, self._evaluate())
        return self._evaluated[1]

    def _evaluate(self) -> Evaluation:
        times, ratios = self.per_step()
        if len(ratios) < self.min_points:
            return Evaluation(0.0)
        slope, intercept = theil_sen(times, ratios)
        test = mann_kendall(ratios, lag1_correction=True)
        start = intercept + slope * times[0]
        end = intercept + slope * times[-1]
        increase = end / start - 1 if start > 0 else math.inf
        score = max(0.0, increase / self.min_increase) if test.p < self.alpha else 0.0
        if score < 1 or not slope > 0:
            return Evaluation(min(score, 0.99))
        message = (
            f"{self.what} per training step keeps rising: {human_bytes(max(start, 0))} -> "
            f"{human_bytes(end)} per step since {clock(float(times[0]))}. {self.advice}"
        )
        evidence: dict[str, float | str] = {
            "bytes_per_step_start": float(start),
            "bytes_per_step_now": float(end),
            "p_value": test.p,
        }
        finding = Finding(self.kind, Severity.WARNING, float(times[0]), message, evidence)
        return Evaluation(score, (finding,))


class UnrotatedEventFileDetector:
    """A single event file growing fast and without end: TensorBoard never rotates them."""

    name = "event_file_unrotated"
    series = frozenset({"event_file_largest_bytes"})

    def __init__(
        self,
        rate_threshold: float = 100 * MIB / 3600,
        width: float = 60.0,
        min_points: int = 5,
        horizon: float = 24 * 3600.0,
    ) -> None:
        self.rate_threshold = rate_threshold
        self.min_points = min_points
        self.horizon = horizon
        self._sizes = WindowMeans(width, 16)
        self._evaluated: tuple[int, Evaluation] | None = None

    def observe(self, sample: Sample) -> None:
        self._sizes.add(sample.t, sample.value)

    def evaluate(self, now: float) -> Evaluation:
        """Recomputed only when a window has closed since the last call."""
        if self._evaluated is None or self._evaluated[0] != self._sizes.version:
            self._evaluated = (self._sizes.version, self._evaluate())
        return self._evaluated[1]

    def _evaluate(self) -> Evaluation:
        means = list(self._sizes.means)
        if len(means) < self.min_points:
            return Evaluation(0.0)
        times = np.array([t for t, _ in means])
        sizes = np.array([s for _, s in means])
        if np.any(np.diff(sizes) < 0):  # the largest file shrank: rotated or deleted
            return Evaluation(0.0)
        slope, _ = theil_sen(times, sizes)
        score = slope / self.rate_threshold if math.isfinite(slope) else 0.0
        if score < 1:
            return Evaluation(max(score, 0.0))
        projected = sizes[-1] + slope * self.horizon
        message = (
            f"one TensorBoard event file grows by {human_bytes(slope * 3600)}/h "
            f"(now {human_bytes(float(sizes[-1]))}); in {human_duration(self.horizon)} it will "
            f"be {human_bytes(projected)}. Summaries written every step (images, histograms, "
            "text) grow without bound: log them every N steps (update_freq, "
            "tf.summary.record_if) or write heavy summaries to their own directory."
        )
        evidence = {
            "bytes_per_hour": slope * 3600,
            "size_bytes": float(sizes[-1]),
            "projected_bytes": float(projected),
        }
        finding = Finding(
            "event_file_unrotated", Severity.WARNING, float(times[0]), message, evidence
        )
        return Evaluation(score, (finding,))


def growth_detectors() -> list[Detector]:
    return [
        PerStepGrowthDetector(
            "event_file_bytes",
            "event_file_growth",
            "TensorBoard event-file bytes",
            "Something logged each step grows (images or histograms of growing tensors, "
            "text summaries of the whole history): log it less often or smaller.",
        ),
        PerStepGrowthDetector(
            "nondisk_write_bytes",
            "upload_growth",
            "data sent to sockets and pipes (uploads)",
            "An upload or sync that re-sends everything it has so far (checkpoints, logs, "
            "experiment trackers' files) costs more each time: make it incremental.",
        ),
        UnrotatedEventFileDetector(),
    ]
