"""Input-bound runs: steps that wait for their next batch from the input pipeline.

Judged on ``input_wait_share``, which the hook measures in custom loops (the time spent in the
``tf.data`` iterator's ``next`` against step time); with the TF Profiler's bands. Reasoning:
docs/input-bound.md, "The algorithm".
"""

from __future__ import annotations

import math
import statistics
from collections import deque

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
READINGS = 5
"""Newest readings of the share (one per hook probe) whose median is judged."""
MIN_READINGS = 3
"""Readings needed before anything is judged (the first may hold the pipeline's fill)."""
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


class InputBoundDetector:
    """The median of the newest ``READINGS`` input-wait shares against the TF Profiler's
    bands: under 5 % fine, 5-20 % moderate (info), over 20 % input-bound (warning). When the
    typical batch (the median of the hook's per-probe medians) waits under
    ``MIN_WAIT_SECONDS``, nothing is reported: the score is scaled below 1."""

    name = "input_bound"
    series = frozenset({"input_wait_share", "input_wait_batch_seconds", "step_seconds"})

    def __init__(self) -> None:
        self._shares: deque[float] = deque(maxlen=READINGS)
        self._batch_waits: deque[float] = deque(maxlen=READINGS)  # median wait per batch
        self._steps: deque[float] = deque(maxlen=STEP_WINDOW)
        self._since = math.nan  # when the median first reached the moderate band
        self._since_bound = math.nan  # when it first reached the input-bound band

    def observe(self, sample: Sample) -> None:
        if not math.isfinite(sample.value):
            return
        if sample.series == "step_seconds":
            self._steps.append(sample.value)
            return
        if sample.series == "input_wait_batch_seconds":
            if sample.value >= 0:
                self._batch_waits.append(sample.value)
            return
        if 0 <= sample.value <= 1:  # else no share: a malformed recording
            self._share_reading(sample.value, sample.t)

    def _share_reading(self, value: float, t: float) -> None:
        """One reading of the share: when the median of the newest ones entered each band."""
        self._shares.append(value)
        if len(self._shares) < MIN_READINGS:
            return
        share = statistics.median(self._shares)
        if share < MODERATE_SHARE:
            self._since = self._since_bound = math.nan
            return
        if math.isnan(self._since):
            self._since = t
        if share < INPUT_BOUND_SHARE:
            self._since_bound = math.nan
        elif math.isnan(self._since_bound):
            self._since_bound = t

    def evaluate(self, now: float) -> Evaluation:
        if len(self._shares) < MIN_READINGS or not self._steps:
            return Evaluation(0.0)
        share = statistics.median(self._shares)
        step = statistics.median(self._steps)
        wait = share * step
        # The typical batch's wait where the hook sends it, else the mean per step.
        typical = statistics.median(self._batch_waits) if self._batch_waits else wait
        score = share / MODERATE_SHARE
        if typical < MIN_WAIT_SECONDS:  # under the floor: never 1, whatever the share
            score = min(score, 1.0) * typical / MIN_WAIT_SECONDS
        if score < 1:
            return Evaluation(score)
        bound = share >= INPUT_BOUND_SHARE
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
        if self._batch_waits:
            evidence["batch_wait_seconds"] = typical
        return Evaluation(score, (Finding("input_bound", severity, since, message, evidence),))
