"""Detectors that need no statistics: non-finite values and stalled training."""

from __future__ import annotations

import itertools
import math
import statistics
import time

from driftwatch.findings import Finding, Severity
from driftwatch.store import Store


def _clock(t: float) -> str:
    return time.strftime("%H:%M:%S", time.localtime(t))


class NonFiniteDetector:
    """Any NaN or infinity among the run's logged scalars: the run has likely diverged."""

    def __init__(self) -> None:
        self._first_seen: float | None = None

    def update(self, store: Store, now: float) -> list[Finding]:
        history = store.get(("nonfinite_total", ()))
        latest = history.latest() if history else None
        if latest is None or latest[1] <= 0:
            return []
        if self._first_seen is None:
            self._first_seen = latest[0]
        count = int(latest[1])
        return [
            Finding(
                kind="nonfinite",
                severity=Severity.CRITICAL,
                since=self._first_seen,
                message=(
                    f"{count} non-finite (NaN/Inf) scalar value(s) logged since "
                    f"{_clock(self._first_seen)}: training has likely diverged. Try a lower "
                    "learning rate, gradient clipping, or guard the loss against log(0) and "
                    "division by zero."
                ),
                evidence={"nonfinite_values": count},
            )
        ]


class StallDetector:
    """No new training step for much longer than steps usually take to be logged."""

    def __init__(self, min_seconds: float = 120.0, factor: float = 10.0, window: int = 64):
        self.min_seconds = min_seconds
        self.factor = factor
        self.window = window

    def update(self, store: Store, now: float) -> list[Finding]:
        history = store.get(("step_timestamp", ()))
        if history is None:
            return []
        stamps = sorted(set(history.recent_values(self.window)))
        if not stamps:
            return []
        gaps = [b - a for a, b in itertools.pairwise(stamps) if b > a]
        typical = statistics.median(gaps) if gaps else 0.0
        limit = max(self.min_seconds, self.factor * typical)
        silent_for = now - stamps[-1]
        if not math.isfinite(silent_for) or silent_for <= limit:
            return []
        return [
            Finding(
                kind="stalled",
                severity=Severity.WARNING,
                since=stamps[-1],
                message=(
                    f"no training step logged for {silent_for:.0f} s (since "
                    f"{_clock(stamps[-1])}; steps are usually logged every {typical:.1f} s). "
                    "The job may be hung (data pipeline, deadlock, a collective waiting on "
                    "another rank) or stuck in a long checkpoint or validation: look at its "
                    "stack with py-spy dump."
                ),
                evidence={"seconds_since_last_step": silent_for, "usual_log_interval": typical},
            )
        ]
