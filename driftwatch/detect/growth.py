"""Things that should stay proportional to training but grow: event files and uploads."""

from __future__ import annotations

import itertools
import math
from collections import deque
from typing import NamedTuple

import numpy as np

from driftwatch.detect import Detector, Evaluation
from driftwatch.detect.windows import WindowMeans
from driftwatch.findings import JUDGED_AT_END, KINDS, WHOLE_RUN, Finding
from driftwatch.series import Sample
from driftwatch.units import MIB, clock, human_bytes, human_seconds


class PerStepGrowthDetector:
    """Bytes written per training step, per window, against the run's own baseline: each
    step writing more than it used to (image summaries of growing tensors, an upload that
    re-sends everything so far) is what no fixed rate threshold would see.

    Windows are long (5 min) because TensorFlow flushes event files in bursts (every 2 min
    by default); the baseline is the median of ``baseline_windows`` windows after the first
    ``skip_windows``, the current value the median of the newest ``recent_windows``.
    """

    def __init__(
        self,
        bytes_series: str,
        kind: str,
        what: str,
        advice: str,
        width: float = 300.0,
        skip_windows: int = 1,
        baseline_windows: int = 6,
        recent_windows: int = 6,
        min_increase: float = 0.5,
    ) -> None:
        self.name = kind
        self.kind = kind
        self.what = what
        self.advice = advice
        self.bytes_series = bytes_series
        self.series = frozenset({bytes_series, "train_step"})
        self.width = width
        self.min_increase = min_increase
        self._skip = skip_windows
        self._baseline_size = baseline_windows
        self._baseline: list[float] = []
        self._recent_size = recent_windows
        self._recent: deque[tuple[float, float]] = deque(maxlen=recent_windows)
        self._window = math.nan  # start of the open window
        self._opened: tuple[float, float] | None = None  # (bytes, steps) at its start
        self._latest: tuple[float, float] = (math.nan, math.nan)

    def observe(self, sample: Sample) -> None:
        if not math.isfinite(sample.value):
            return
        total, steps = self._latest
        if sample.series == self.bytes_series:
            total = sample.value
        else:
            steps = sample.value
        self._latest = (total, steps)
        window = math.floor(sample.t / self.width) * self.width
        if window <= self._window:  # False while no window is open (NaN)
            return
        if self._opened is not None and math.isfinite(total) and math.isfinite(steps):
            self._close(self._window, total - self._opened[0], steps - self._opened[1])
        self._window = window
        self._opened = (total, steps) if math.isfinite(total) and math.isfinite(steps) else None

    def _close(self, start: float, grown: float, advanced: float) -> None:
        if advanced <= 0 or grown < 0:  # no training, or the file was rotated or deleted
            return
        ratio = grown / advanced
        if self._skip > 0:
            self._skip -= 1
        elif len(self._baseline) < self._baseline_size:
            self._baseline.append(ratio)
        else:
            self._recent.append((start, ratio))

    def evaluate(self, now: float) -> Evaluation:
        if len(self._baseline) < self._baseline_size or len(self._recent) < self._recent_size:
            return Evaluation(0.0)
        baseline = float(np.median(self._baseline))
        current = float(np.median([r for _, r in self._recent]))
        increase = current / baseline - 1 if baseline > 0 else (math.inf if current > 0 else 0.0)
        score = max(0.0, increase / self.min_increase)
        if score < 1:
            return Evaluation(score)
        since = self._recent[0][0]
        message = (
            f"{self.what} per training step rose from {human_bytes(baseline)} to "
            f"{human_bytes(current)} (since about {clock(since)}). {self.advice}"
        )
        evidence: dict[str, float | str] = {
            "bytes_per_step_baseline": baseline,
            "bytes_per_step_now": current,
        }
        finding = Finding(self.kind, KINDS[self.kind].severity, since, message, evidence)
        return Evaluation(min(score, 10.0), (finding,))


FAST_EVENT_FILE_RATE = 10e9 / 3600
"""Growth of one event file, in bytes per second, that is urgent whatever the phase (10 GB/h)."""


class EventFileScale(NamedTuple):
    """One scale at which an event file's growth is judged."""

    width: float
    """Window width, seconds."""
    needed: int
    """Windows needed to judge."""
    kept: int
    """Newest windows judged."""
    min_rate: float
    """Growth reported from, bytes per second."""
    quantile: float
    """Quantile of the window-to-window rates taken as the file's rate."""


EVENT_FILE_SCALES = (
    EventFileScale(1.0, 4, 4, FAST_EVENT_FILE_RATE, 0.0),
    EventFileScale(5.0, 6, 16, 1000 * MIB / 3600, 0.25),
    EventFileScale(60.0, 5, 16, 100 * MIB / 3600, 0.25),
)
"""The scales, narrowest first: seconds for urgent growth, minutes for slow."""
CONCLUDE_EVENT_FILE_POINTS = 3
"""Windows (the open one included) each scale needs at a run's end."""


class UnrotatedEventFileDetector:
    """A single event file growing fast and without end: TensorBoard never rotates them.

    Judged at three scales, so a 15-second run and a week-long one are both covered:
    the newest four 1-second windows for 10 GB/h and more (image summaries every step: urgent
    in any phase, with or without a step signal; every window must grow that fast),
    5-second windows over half a minute for 1 GB/h, and 1-minute windows over 5 to 16
    minutes for 100 MB/h (the lower quartile of the window-to-window growth). A burst of
    summaries cannot pass for steady growth; any shrinking means the file was rotated or
    replaced. At a run's end each scale is judged once more over its windows so far, the
    open one included, from 3 windows.
    """

    name = "event_file_unrotated"
    series = frozenset({"event_file_largest_bytes"})

    def __init__(
        self,
        scales: tuple[EventFileScale, ...] = EVENT_FILE_SCALES,
        horizon: float = 24 * 3600.0,
    ) -> None:
        self.horizon = horizon
        self._scales = [(WindowMeans(scale.width, scale.kept), scale) for scale in scales]
        self._evaluated: dict[float, tuple[int, Evaluation]] = {}

    def observe(self, sample: Sample) -> None:
        for sizes, _ in self._scales:
            sizes.add(sample.t, sample.value)

    def evaluate(self, now: float) -> Evaluation:
        """The scale with the most evidence; each recomputed only when a window closes."""
        evaluations = []
        for sizes, scale in self._scales:
            cached = self._evaluated.get(sizes.width)
            if cached is None or cached[0] != sizes.version:
                means = [(t, mean) for t, mean, _, _ in sizes.windows()]
                cached = self._evaluated[sizes.width] = (
                    sizes.version,
                    self._evaluate(means, scale, scale.needed, ended=False),
                )
            evaluations.append(cached[1])
        return max(evaluations, key=lambda e: e.score)

    def conclude(self, now: float) -> Evaluation:
        """What the run's event file did over all of it: each scale's windows so far, the
        open one included, judged from ``CONCLUDE_EVENT_FILE_POINTS`` windows."""
        live = self.evaluate(now)
        if live.findings:
            return live
        evaluations = [live]
        for sizes, scale in self._scales:
            means = [(t, mean) for t, mean, _, _ in sizes.windows(with_open=True)]
            needed = min(scale.needed, CONCLUDE_EVENT_FILE_POINTS)
            evaluations.append(self._evaluate(means[-scale.kept :], scale, needed, ended=True))
        return max(evaluations, key=lambda e: e.score)

    def _evaluate(
        self, means: list[tuple[float, float]], scale: EventFileScale, needed: int, *, ended: bool
    ) -> Evaluation:
        if len(means) < needed:
            return Evaluation(0.0)
        # A few windows each: plain Python costs a tenth of numpy here.
        rates = []
        for (t0, s0), (t1, s1) in itertools.pairwise(means):
            if s1 < s0:  # the largest file shrank: rotated or deleted
                return Evaluation(0.0)
            rates.append((s1 - s0) / (t1 - t0))
        rate = _quantile(rates, scale.quantile)
        score = rate / scale.min_rate
        if score < 1:
            return Evaluation(max(score, 0.0))
        since, size = means[0][0], means[-1][1]
        projected = size + rate * self.horizon
        grows = "grew" if ended else "grows"
        message = (
            f"one TensorBoard event file {grows} by {human_bytes(rate * 3600)}/h "
            + (
                f"until the run ended (to {human_bytes(size)}); had it gone on, in "
                if ended
                else f"(now {human_bytes(size)}); in "
            )
            + f"{human_seconds(self.horizon)} it would be {human_bytes(projected)}. Summaries "
            "written every step (images, histograms, text) grow without bound: log them every "
            "N steps (update_freq, tf.summary.record_if) or write heavy summaries to their own "
            "directory."
        )
        evidence: dict[str, float | str] = {
            "bytes_per_hour": rate * 3600,
            "size_bytes": size,
            "projected_bytes": projected,
            "window_seconds": scale.width,
        }
        if ended:
            evidence[JUDGED_AT_END] = WHOLE_RUN
        kind = "event_file_unrotated"
        finding = Finding(kind, KINDS[kind].severity, since, message, evidence)
        return Evaluation(score, (finding,))


def _quantile(values: list[float], q: float) -> float:
    """The ``q`` quantile of ``values``, interpolated linearly (numpy's default)."""
    ordered = sorted(values)
    position = q * (len(ordered) - 1)
    below = math.floor(position)
    above = min(below + 1, len(ordered) - 1)
    return ordered[below] + (ordered[above] - ordered[below]) * (position - below)


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
