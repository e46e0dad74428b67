"""Detectors that need no statistics: non-finite values and stalled training."""

from __future__ import annotations

import itertools
import math
import statistics
from collections import deque

from driftwatch.detect import Evaluation
from driftwatch.findings import KINDS, Finding
from driftwatch.series import Sample
from driftwatch.units import clock


class NonFiniteDetector:
    """Any NaN or infinity in the logged scalars or the hook's checks: a diverged run."""

    name = "nonfinite"
    series = frozenset({"nonfinite_total", "hook_nonfinite_total"})

    def __init__(self) -> None:
        self._counts: dict[str, float] = {}
        self._first_seen: float | None = None

    def observe(self, sample: Sample) -> None:
        if math.isfinite(sample.value) and sample.value > 0:
            self._counts[sample.series] = sample.value
            if self._first_seen is None or sample.t < self._first_seen:
                self._first_seen = sample.t

    def evaluate(self, now: float) -> Evaluation:
        if self._first_seen is None:
            return Evaluation(0.0)
        count = int(max(self._counts.values()))
        where = " and ".join(
            {"nonfinite_total": "event files", "hook_nonfinite_total": "the hook"}[s]
            for s in sorted(self._counts)
        )
        finding = Finding(
            kind="nonfinite",
            severity=KINDS["nonfinite"].severity,
            since=self._first_seen,
            message=(
                f"{count} non-finite (NaN/Inf) value(s) seen by {where} since "
                f"{clock(self._first_seen)}: training has likely diverged. Try a lower "
                "learning rate, gradient clipping, or guard the loss against log(0) and "
                "division by zero."
            ),
            evidence={"nonfinite_values": count},
        )
        return Evaluation(1.0, (finding,))


VALIDATION_ALLOWANCE = 2.0
"""Times the longest of the last 8 validations that a pause may last and be one more."""


class StallDetector:
    """No new training step for much longer than steps usually take to be logged."""

    name = "stalled"
    series = frozenset({"step_timestamp", "validation_seconds"})

    def __init__(self, min_seconds: float = 120.0, factor: float = 10.0, window: int = 64):
        self.min_seconds = min_seconds
        self.factor = factor
        self._stamps: deque[float] = deque(maxlen=window)
        self._validations: deque[float] = deque(maxlen=8)

    def observe(self, sample: Sample) -> None:
        if not math.isfinite(sample.value):
            return
        if sample.series == "validation_seconds":
            self._validations.append(sample.value)
        elif not self._stamps or sample.value > self._stamps[-1]:
            self._stamps.append(sample.value)

    def evaluate(self, now: float) -> Evaluation:
        if not self._stamps:
            return Evaluation(0.0)
        gaps = [b - a for a, b in itertools.pairwise(self._stamps)]
        typical = statistics.median(gaps) if gaps else 0.0
        # Validation pauses training for as long as it takes: that is no stall.
        validation = VALIDATION_ALLOWANCE * max(self._validations, default=0.0)
        limit = max(self.min_seconds, self.factor * typical, validation)
        last = self._stamps[-1]
        silent_for = now - last
        score = max(0.0, silent_for / limit)
        if silent_for <= limit:
            return Evaluation(score)
        finding = Finding(
            kind="stalled",
            severity=KINDS["stalled"].severity,
            since=last,
            message=(
                f"no training step for {silent_for:.0f} s (since {clock(last)}; steps are "
                f"usually logged every {typical:.1f} s). The job may be hung (input pipeline, "
                "deadlock, a collective waiting for another rank) or stuck in a long "
                "checkpoint or validation: look at its stacks with py-spy dump."
            ),
            evidence={"seconds_since_last_step": silent_for, "usual_log_interval": typical},
        )
        return Evaluation(score, (finding,))
