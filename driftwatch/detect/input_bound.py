"""Input-bound runs: steps that wait for their next batch from the input pipeline.

Judged on ``input_wait_share``, which the hook measures in custom loops (the time spent in the
``tf.data`` iterator's ``next`` against step time); with the TF Profiler's bands. Reasoning:
docs/input-bound.md, "The algorithm".
"""

from __future__ import annotations

import math
import statistics
from collections import deque
from collections.abc import Iterable
from typing import NamedTuple

from driftwatch.detect import Evaluation
from driftwatch.findings import KINDS, Finding, Severity
from driftwatch.series import Sample
from driftwatch.units import human_seconds

MODERATE_SHARE = 0.05
"""Share of step time waiting for input from which a run is reported, at info (0-1)."""
INPUT_BOUND_SHARE = 0.20
"""Share of step time waiting for input from which a run is input-bound: a warning (0-1)."""
MIN_WAIT_SECONDS = 0.001
"""The typical batch's wait (median) below which nothing is reported (seconds): an
iterator's own dispatch, however long a few waits on a loaded machine."""
WINDOW_SECONDS = 60.0
"""Newest span of readings (one per hook probe) whose time-weighted median is judged (seconds)."""
SUSTAINED_SECONDS = 10.0
"""Time the readings in a band must cover before it is reported live (seconds)."""
MIN_READINGS = 3
"""Readings needed before anything is judged (the first may hold the pipeline's fill)."""
MAX_READINGS = 2048
"""Most readings kept, whatever the window holds (a probe every 100 steps of 0.3 ms: 2000)."""
STEP_WINDOW = 64
"""Newest step times kept, whose median converts the share into a wait per step."""
INPUT_FIXES = (
    "Prefetch (dataset.prefetch(tf.data.AUTOTUNE)), map in parallel "
    "(map(..., num_parallel_calls=tf.data.AUTOTUNE)), cache what is decoded or augmented the "
    "same each epoch (dataset.cache()), move Python work in tf.py_function or "
    "tf.numpy_function into TensorFlow ops (they hold the GIL and run one at a time), read "
    "with more workers (interleave(..., num_parallel_calls=...), or more processes for a "
    "PyDataset), and avoid host syncs in the loop (.numpy() or float(loss) every step)."
)
"""What to do about an input-bound run, as the finding says it."""


class _Reading(NamedTuple):
    """One probe's share and the seconds it stands for (since the reading before)."""

    t: float
    share: float
    seconds: float


class InputBoundDetector:
    """The time-weighted median of the input-wait shares read over the newest
    ``WINDOW_SECONDS`` against the TF Profiler's bands: under 5 % fine, 5-20 % moderate
    (info), over 20 % input-bound (warning). A band is reported live once its readings
    cover ``SUSTAINED_SECONDS``; at the run's end, on the share alone. When the typical
    batch (the median of the hook's per-probe medians) waits under ``MIN_WAIT_SECONDS``,
    nothing is reported: the score is scaled below 1."""

    name = "input_bound"
    series = frozenset({"input_wait_share", "input_wait_batch_seconds", "step_seconds"})

    def __init__(self) -> None:
        self._readings: deque[_Reading] = deque(maxlen=MAX_READINGS)
        self._batch_waits: deque[tuple[float, float]] = deque(maxlen=MAX_READINGS)
        self._steps: deque[float] = deque(maxlen=STEP_WINDOW)
        self._first_step_t = math.nan  # the end of the first step: readings cover from here
        self._since = math.nan  # when the share first reached the moderate band
        self._since_bound = math.nan  # when it first reached the input-bound band

    def observe(self, sample: Sample) -> None:
        if not math.isfinite(sample.value):
            return
        if sample.series == "step_seconds":
            self._steps.append(sample.value)
            if math.isnan(self._first_step_t):
                self._first_step_t = sample.t
            return
        if sample.series == "input_wait_batch_seconds":
            if sample.value >= 0:
                self._batch_waits.append((sample.t, sample.value))
            return
        if 0 <= sample.value <= 1:  # else no share: a malformed recording
            self._share_reading(sample.value, sample.t)

    def _share_reading(self, value: float, t: float) -> None:
        """One reading of the share, standing for the time since the one before; when the
        window's share entered each band."""
        previous = self._readings[-1].t if self._readings else self._first_step_t
        seconds = t - previous if math.isfinite(previous) else 0.0
        self._readings.append(_Reading(t, value, max(0.0, seconds)))
        while self._readings[0].t < t - WINDOW_SECONDS:
            self._readings.popleft()
        while self._batch_waits and self._batch_waits[0][0] < t - WINDOW_SECONDS:
            self._batch_waits.popleft()
        if len(self._readings) < MIN_READINGS:
            return
        share = _weighted_median(self._readings)
        if share < MODERATE_SHARE:
            self._since = self._since_bound = math.nan
            return
        if math.isnan(self._since):
            self._since = self._band_start(MODERATE_SHARE)
        if share < INPUT_BOUND_SHARE:
            self._since_bound = math.nan
        elif math.isnan(self._since_bound):
            self._since_bound = self._band_start(INPUT_BOUND_SHARE)

    def _band_start(self, band: float) -> float:
        """When the oldest reading of the window at or over ``band`` began."""
        return next(r.t - r.seconds for r in self._readings if r.share >= band)

    def _covered(self, band: float) -> float:
        """Seconds the window's readings at or over ``band`` stand for."""
        return sum(r.seconds for r in self._readings if r.share >= band)

    def evaluate(self, now: float) -> Evaluation:
        return self._judged(now, sustained=SUSTAINED_SECONDS)

    def conclude(self, now: float) -> Evaluation:
        """At the run's end the window's share is judged however short the run was: a run
        input-bound for most of its 8 seconds was input-bound."""
        return self._judged(now, sustained=0.0)

    def _judged(self, now: float, sustained: float) -> Evaluation:
        if len(self._readings) < MIN_READINGS or not self._steps:
            return Evaluation(0.0)
        share = _weighted_median(self._readings)
        step = statistics.median(self._steps)
        wait = share * step
        # The typical batch's wait where the hook sends it, else the mean per step.
        batch_waits = [value for _, value in self._batch_waits]
        typical = statistics.median(batch_waits) if batch_waits else wait
        score = share / MODERATE_SHARE
        if typical < MIN_WAIT_SECONDS:  # under the floor: never 1, whatever the share
            score = min(score, 1.0) * typical / MIN_WAIT_SECONDS
        covered = self._covered(MODERATE_SHARE)
        if score >= 1 and covered < sustained:  # a pipeline filling, not yet a run's habit
            score = covered / sustained
        if score < 1:
            return Evaluation(score)
        bound = share >= INPUT_BOUND_SHARE and self._covered(INPUT_BOUND_SHARE) >= sustained
        severity = Severity.WARNING if bound else KINDS["input_bound"].severity
        since = self._since_bound if bound else self._since
        since = since if math.isfinite(since) else now
        band = "the run is input-bound" if bound else "a moderate share"
        message = (
            f"{share:.0%} of each step ({human_seconds(wait)} of {human_seconds(step)}) waits "
            f"for the next batch from the input pipeline, {human_seconds(step - wait)} "
            f"computes: {band}. {INPUT_FIXES}"
        )
        evidence = {
            "share": share,
            "step_seconds": step,
            "wait_seconds": wait,
            "compute_seconds": step - wait,
        }
        if batch_waits:
            evidence["batch_wait_seconds"] = typical
        return Evaluation(score, (Finding("input_bound", severity, since, message, evidence),))


def _weighted_median(readings: Iterable[_Reading]) -> float:
    """The share that half the readings' time is at or under (their plain median where no
    reading stands for any time)."""
    ordered = sorted(readings, key=lambda r: r.share)
    total = sum(r.seconds for r in ordered)
    if total <= 0:
        return statistics.median(r.share for r in ordered)
    covered = 0.0
    for reading in ordered:
        covered += reading.seconds
        if covered >= total / 2:
            return reading.share
    return ordered[-1].share
