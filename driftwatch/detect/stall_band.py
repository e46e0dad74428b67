"""When a step record is a stall: the band of the recent step times, the typical step, and
the excess over it. ``PeriodicStallDetector`` counts the stalls and ``GoodputAccount`` puts
their time in pauses, both from this one rule. Reasoning: docs/stalls.md, "Periodic
stalls".
"""

from __future__ import annotations

import bisect
import math
from collections import deque

STALL_FACTOR = 5.0
"""An interval is a stall when its steps took more than this many typical steps' time."""
NOISE_Z = 6.0
"""Standard deviations (of the recent samples' lower tail) a stall's sample stands out by."""
REFERENCE_SAMPLES = 128
"""Recent step-time samples that give the typical step time and their spread."""
REFERENCE_REFRESH = 32
"""Samples after which the typical step time is computed again (or ``REFERENCE_SECONDS``)."""
REFERENCE_SECONDS = 60.0
"""Seconds after which the typical step time is computed again, with 10 samples or more."""
REFERENCE_MIN_SAMPLES = 10
"""Samples needed before the band and the typical step time are first computed."""
LOWER_TAIL_SPREAD = 0.9711
"""The distance from a normal law's 5th to its 25th percentile, in standard deviations."""
CHAIN_TOLERANCE = 1e-3
"""Share of a step's time by which an interval may miss its steps' time and still chain."""
CLOCK_RESOLUTION = 2e-6
"""Seconds of rounding a unix time stored as a double may add to a time difference."""
MAX_STEPS_JUMP = 4
"""How many times the usual steps per sample one sample may hold and still chain."""
CHAIN_CHECKS = 4
"""Refreshes over which the share of chained samples is averaged (a moving average)."""


def chained_steps(value: float, interval: float) -> int | None:
    """The steps of the ``interval`` (seconds since the previous sample) that a sample of
    ``value`` seconds per step closes, if its time is exactly theirs (it chains to the
    previous sample); else None."""
    if not 0 < interval < math.inf:
        return None
    steps = round(interval / value) or 1
    if abs(interval - steps * value) > CHAIN_TOLERANCE * value + CLOCK_RESOLUTION:
        return None
    return steps


class StallBand:
    """The stall rule over a stream of step-time samples, each the mean step time of the
    interval it closes.

    Every ``REFERENCE_REFRESH`` samples or ``REFERENCE_SECONDS`` (once there are
    ``REFERENCE_MIN_SAMPLES``), from the newest ``REFERENCE_SAMPLES``: the band (their lower
    quartile plus ``NOISE_Z`` standard deviations of their lower tail) and the typical step
    (the median of those within the band); from the sample at that refresh, whether samples
    chain (a moving share over ``CHAIN_CHECKS`` refreshes) and the usual steps per sample.

    A sample of some steps is a stall when it is above the band and its steps lasted more
    than at the typical step time by over ``factor - 1`` typical steps (``excess``); that
    excess is the stall's duration. How many steps a sample holds is its consumer's call:
    ``steps_of`` gives those of a sample that chains, as the periodic-stall detector counts
    them.
    """

    __slots__ = (
        "_chained_share",
        "_recent",
        "_refreshed_t",
        "_since_refresh",
        "band",
        "factor",
        "steps_per_sample",
        "typical",
    )

    def __init__(self, factor: float = STALL_FACTOR) -> None:
        self.factor = factor
        self.band = math.nan
        """Seconds per step: a sample slower than this stands out; NaN until computed."""
        self.typical = math.nan
        """Seconds per step: the median of the recent samples within the band."""
        self.steps_per_sample = 1
        """The usual steps per sample: the last chained sample's at a refresh."""
        self._recent: deque[float] = deque(maxlen=REFERENCE_SAMPLES)
        self._since_refresh = 0
        self._refreshed_t = -math.inf
        self._chained_share = 1.0

    def add(self, value: float, t: float, interval: float) -> None:
        """Take a sample of ``value`` seconds per step (finite, above 0) at ``t``, closing an
        ``interval`` of seconds since the previous one (NaN: none)."""
        self._recent.append(value)
        self._since_refresh += 1
        if self._since_refresh >= REFERENCE_REFRESH or t - self._refreshed_t >= REFERENCE_SECONDS:
            self._refresh(value, interval, t)

    def excess(self, value: float, steps: int) -> float:
        """The stall seconds of a sample of ``steps`` steps at ``value`` seconds each: their
        time past the typical step's when the sample is above the band and that is over
        ``factor - 1`` typical steps; else 0."""
        if not value > self.band:
            return 0.0
        excess = steps * (value - self.typical)
        return excess if excess > (self.factor - 1) * self.typical else 0.0

    def steps_of(self, value: float, interval: float) -> int | None:
        """The steps of a sample if it chains with at most ``MAX_STEPS_JUMP`` times the
        usual steps; None if it follows time that no step accounts for (a pause its source
        set apart). Where samples mostly do not chain (a coarse clock): the usual steps."""
        steps = chained_steps(value, interval)
        if steps is None or steps > MAX_STEPS_JUMP * self.steps_per_sample:
            return None if self._chained_share >= 0.5 else self.steps_per_sample
        return steps

    def _refresh(self, value: float, interval: float, t: float) -> None:
        """From this sample, whether samples chain and how many steps they hold; from the
        recent samples (``REFERENCE_MIN_SAMPLES`` or more), the band and the typical step."""
        steps = chained_steps(value, interval)
        self._chained_share += ((steps is not None) - self._chained_share) / CHAIN_CHECKS
        if steps is not None:
            self.steps_per_sample = steps
        if len(self._recent) < REFERENCE_MIN_SAMPLES:
            return
        ordered = sorted(self._recent)  # a hundred floats: sorted() beats numpy's quantiles
        low, quartile = ordered[len(ordered) // 20], ordered[len(ordered) // 4]
        self.band = quartile + NOISE_Z * (quartile - low) / LOWER_TAIL_SPREAD
        below = bisect.bisect_right(ordered, self.band)  # more than a quarter of them
        self.typical = (ordered[(below - 1) // 2] + ordered[below // 2]) / 2
        self._since_refresh = 0
        self._refreshed_t = t
