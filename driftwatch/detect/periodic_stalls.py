"""Pauses of training that come back at a regular interval: checkpoints, validation, the
first step of an epoch. Reasoning: docs/stalls.md, "Periodic stalls".
"""

from __future__ import annotations

import math
from collections import deque

import numpy as np

from driftwatch.detect import Evaluation
from driftwatch.detect.stall_band import STALL_FACTOR, StallBand
from driftwatch.detect.stats import FloatArray, mann_kendall, theil_sen
from driftwatch.findings import Finding, Severity
from driftwatch.series import Sample
from driftwatch.units import human_seconds

MOST_WALL_TIME = 0.5
"""Share of wall time that periodic stalls must take to be a warning."""
STILL_MOST_WALL_TIME = 0.4
"""Share of wall time below which a warning on the stalls' share ends."""


class PeriodicStallDetector:
    """Pauses of training that come back at a regular interval: checkpoints, validation,
    the first step of an epoch. Information with their period, duration and share of wall
    time; a warning when they take ``MOST_WALL_TIME`` of it or more (until they fall below
    ``STILL_MOST_WALL_TIME``), or when they keep getting longer.

    Each ``step_seconds`` sample is the mean step time of the interval it closes: one step
    (the hook) or every step since the previous logged record (event files). Whether it is
    a stall, and for how long, is ``StallBand``'s rule (the one goodput's pauses follow): it
    stands out from the recent samples and its interval lasted more than its steps at the
    typical step time by over ``STALL_FACTOR - 1`` typical steps. A sample that follows a
    pause the source already set apart (its time is not its steps': the hook left out
    validation or the start of a ``fit``) is none (``StallBand.steps_of``): what is slow in
    it is the first step after that pause, not steady training interrupted. Stalls recur
    when most of their intervals, in samples, are within a tenth of the period or one sample
    (the resolution of the logging); the period in steps is that in samples times the usual
    steps per sample. See docs/stalls.md.
    """

    name = "periodic_stall"
    series = frozenset({"step_seconds"})

    def __init__(self, factor: float = STALL_FACTOR, min_stalls: int = 4, window: int = 64) -> None:
        self.factor = factor
        self.min_stalls = min_stalls
        self._band = StallBand(factor)
        self._last_t = math.nan
        self._samples = 0  # samples seen
        # sample index, t, stall seconds
        self._stalls: deque[tuple[int, float, float]] = deque(maxlen=window)
        self._stalls_seen = 0
        self._most_wall_time = False  # the last verdict warned on the share
        self._judged: tuple[int, Evaluation] = (0, Evaluation(0.0))  # (stalls seen, verdict)

    def observe(self, sample: Sample) -> None:
        value, t = sample.value, sample.t
        if not 0 < value < math.inf:
            return
        interval, self._last_t = t - self._last_t, t
        self._samples += 1
        band = self._band
        band.add(value, t, interval)
        if value > band.band:  # else no stall: the steps are not even counted
            steps = band.steps_of(value, interval)
            stall = 0.0 if steps is None else band.excess(value, steps)
            if stall > 0:
                self._stalls.append((self._samples, t, stall))
                self._stalls_seen += 1

    def _recurring(self, stalls: FloatArray) -> tuple[FloatArray, float] | None:
        """The stalls that recur at a regular period, and that period in samples; None if
        none do. The odd GC pause or slow batch between checkpoints would break their
        rhythm: the stalls at least half as long as the shortest one are tried, then as the
        next shortest, and so on; the first set that recurs is kept."""
        extras = stalls[:, 2]  # columns: sample index, t, stall seconds
        tried = -1
        for shortest in np.sort(extras)[: len(extras) - self.min_stalls + 1]:
            kept = stalls[extras >= 0.5 * shortest]
            if len(kept) < self.min_stalls:
                break
            if len(kept) == tried:
                continue
            tried = len(kept)
            period = self._period(np.diff(kept[:, 0]))
            if period is not None:
                return kept, period
        return None

    @staticmethod
    def _period(intervals: FloatArray) -> float | None:
        """The period of stalls this many samples apart, if most of them are regular; None
        if not. A period of p steps logged every n reads as intervals of the two whole
        numbers of samples around p / n: their mean is the period."""
        median = float(np.median(intervals))
        around = intervals[np.abs(intervals - median) <= max(0.1 * median, 1)]
        period = float(np.mean(around)) if len(around) else median
        regular = np.mean(np.abs(intervals - period) < max(0.1 * period, 1))
        if period < 2 or regular < 0.7:
            return None
        return period

    def evaluate(self, now: float) -> Evaluation:
        """The verdict on the stalls seen, judged again only once another one came."""
        count = self._stalls_seen
        if self._judged[0] != count:
            self._judged = (count, self._judge())
        return self._judged[1]

    def _judge(self) -> Evaluation:
        if len(self._stalls) < self.min_stalls:
            return Evaluation(0.0)
        recurring = self._recurring(np.array(self._stalls))
        if recurring is None:
            return Evaluation(0.0)
        stalls, period = recurring
        samples, times, extras = stalls[:, 0], stalls[:, 1], stalls[:, 2]
        span = float(times[-1] - times[0])
        every = span / max(1, round(float(samples[-1] - samples[0]) / period))
        # Each stall but the first falls inside the span (a stall ends its interval).
        share = float(extras[1:].sum()) / span if span > 0 else 0.0
        stall = float(np.median(extras))
        steps_per_sample = self._band.steps_per_sample
        steps = period * steps_per_sample
        evidence: dict[str, float | str] = {
            "period_steps": steps,
            "period_seconds": every,
            "stall_seconds": stall,
            "share_of_wall_time": share,
            "steps_per_sample": float(steps_per_sample),
            "last_stall_t": float(times[-1]),
        }
        said_every = f"{every:.1f} s" if every >= 1 else human_seconds(every)  # under 1 s: ms
        message = (
            f"about every {said_every} ({steps:.0f} steps) training pauses for "
            f"{human_seconds(stall)} (checkpoint, validation or epoch start): {share:.1%} "
            "of wall time."
        )
        severity = Severity.INFO
        self._most_wall_time = share >= (
            STILL_MOST_WALL_TIME if self._most_wall_time else MOST_WALL_TIME
        )
        if self._most_wall_time:
            severity = Severity.WARNING
            message += (
                " Pauses that cost as much as training itself are rarely meant: checkpoint "
                "or validate less often (ModelCheckpoint's save_freq counts batches; fit's "
                "validation_freq and validation_steps), or make them cheaper (weights only, "
                "a smaller validation set, asynchronous checkpointing)."
            )
        trend = mann_kendall(extras, lag1_correction=len(extras) >= 16)
        slope, _ = theil_sen(times, extras)
        grown = float(np.median(extras[-3:])) > 1.5 * float(np.median(extras[:3]))
        if len(extras) >= 8 and trend.p < 0.001 and slope > 0 and grown:
            severity = Severity.WARNING
            evidence["stall_growth_seconds_per_hour"] = slope * 3600
            message += (
                f" These stalls are getting longer ({human_seconds(float(extras[0]))} -> "
                f"{human_seconds(float(extras[-1]))}): a checkpoint or log that grows with the run "
                "(saving optimizer state history, an ever-growing summary or metrics list)."
            )
        finding = Finding("periodic_stall", severity, float(times[0]), message, evidence)
        return Evaluation(1.0 if severity is Severity.WARNING else 0.5, (finding,))
