"""Small robust statistics for drift detection: numpy only, pure and deterministic.

Training-run telemetry is heavy-tailed (checkpoint and GC spikes), autocorrelated (step
times wander) and short once downsampled (tens of block medians), so the detectors use
rank- and median-based tools: Theil-Sen slopes, the Mann-Kendall trend test with an
autocorrelation correction, MAD scales, CUSUM on log ratios, and streaming block medians.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field
from typing import NamedTuple

import numpy as np
import numpy.typing as npt

FloatArray = npt.NDArray[np.float64]

MAD_TO_SIGMA = 1.4826
"""MAD -> standard deviation for normal data (1 / Phi^-1(3/4))."""

MEDIAN_EFFICIENCY = 1.2533
"""Standard error of a median over that of a mean, for normal data (sqrt(pi / 2))."""

MAX_LAG1 = 0.95
"""Largest lag-1 autocorrelation the Mann-Kendall correction will use (caps n/n* at 39)."""


def _as_float(x: npt.ArrayLike) -> FloatArray:
    return np.asarray(x, dtype=np.float64).reshape(-1)


def theil_sen(t: npt.ArrayLike, y: npt.ArrayLike) -> tuple[float, float]:
    """Theil-Sen line through ``(t, y)``: ``(slope, intercept)``.

    The slope is the median of the pairwise slopes over all pairs with distinct ``t``; the
    intercept is ``median(y - slope * t)``. Up to ~29% of the points can be arbitrary
    outliers without moving the line much, which least squares cannot offer. Points whose
    ``t`` or ``y`` is not finite are dropped (so every pair touching them is). With fewer
    than two distinct ``t`` values the line is undefined: ``(nan, nan)``. O(n^2) memory and
    time, meant for the tens of points a detector window holds.
    """
    tt, yy = _as_float(t), _as_float(y)
    if tt.shape != yy.shape:
        raise ValueError(f"t and y differ in length: {tt.size} != {yy.size}")
    keep = np.isfinite(tt) & np.isfinite(yy)
    tt, yy = tt[keep], yy[keep]
    i, j = np.triu_indices(tt.size, k=1)
    dt = tt[j] - tt[i]
    distinct = dt != 0
    if not distinct.any():
        return math.nan, math.nan
    slope = float(np.median((yy[j] - yy[i])[distinct] / dt[distinct]))
    intercept = float(np.median(yy - slope * tt))
    return slope, intercept


class MannKendall(NamedTuple):
    """Result of :func:`mann_kendall`.

    ``s``: the Mann-Kendall statistic, #increasing pairs - #decreasing pairs.
    ``z``: continuity-corrected normal score, ``(s - sign(s)) / sqrt(var_s)``.
    ``p``: two-sided p-value of "no monotone trend" from the normal approximation.
    ``tau``: Kendall's tau-a, ``s / (n (n - 1) / 2)``, in [-1, 1].
    ``var_s``: variance of ``s`` used for ``z`` (tie-corrected, times ``variance_factor``).
    ``n``: number of finite values used.
    ``variance_factor``: ``n / n*`` applied for autocorrelation; 1.0 when uncorrected.
    ``r1``: the lag-1 autocorrelation behind ``variance_factor`` (nan when not computed).
    """

    s: int
    z: float
    p: float
    tau: float
    var_s: float
    n: int
    variance_factor: float = 1.0
    r1: float = math.nan


def lag1_autocorrelation(x: npt.ArrayLike) -> float:
    """Sample lag-1 autocorrelation ``sum(d[t] d[t+1]) / sum(d[t]^2)``, ``d = x - mean(x)``.

    Non-finite values are dropped first (neighbours across a gap are treated as adjacent).
    nan for fewer than 3 values or a constant series (undefined).
    """
    xx = _as_float(x)
    xx = xx[np.isfinite(xx)]
    if xx.size < 3:
        return math.nan
    d = xx - xx.mean()
    denom = float(np.dot(d, d))
    if denom == 0.0:
        return math.nan
    return float(np.dot(d[:-1], d[1:]) / denom)


def ess_variance_factor(y: npt.ArrayLike) -> tuple[float, float]:
    """Yue-Wang effective-sample-size factor ``n / n*`` for Mann-Kendall: ``(factor, r1)``.

    Exactly this (Yue & Wang 2004, "modified MK", AR(1) simple form):

    1. detrend with the Theil-Sen slope over the sample index: ``e = y - b * index``;
    2. ``r = lag1_autocorrelation(e)``;
    3. for n > 8, undo the small-sample bias of ``r``. For detrended AR(1) residuals
       ``E[r] ~= phi - (2 + 6 phi) / n`` (the mean-only analogue is Kendall's
       ``-(1 + 4 phi) / n``; the coefficients were checked by simulation for n = 16..64),
       so ``r1 = (n r + 2) / (n - 6)``. Without this step a 24-point AR(1) series with
       phi = 0.8 reads as r ~= 0.5 and the correction removes only part of the excess
       false positives;
    4. ``r1 = min(r1, MAX_LAG1)``; if ``r1 > 0``: ``n* = n (1 - r1) / (1 + r1)`` and the
       factor is ``n / n* = (1 + r1) / (1 - r1)``; otherwise 1.0 (negative autocorrelation
       is never used to make the test less conservative).

    ``y`` must already be free of NaN. Fewer than 3 values, or residuals with no variation
    beyond rounding error (an exact line), give ``(1.0, nan)``.
    """
    yy = _as_float(y)
    n = yy.size
    if n < 3:
        return 1.0, math.nan
    index = np.arange(n, dtype=np.float64)
    slope, _ = theil_sen(index, yy)
    residuals = yy - slope * index
    # Rounding error around an exact line is not autocorrelated noise: treat it as none.
    if np.ptp(residuals) <= 1e-9 * float(np.max(np.abs(yy))):
        return 1.0, math.nan
    r = lag1_autocorrelation(residuals)
    if math.isnan(r):
        return 1.0, math.nan
    r1 = (n * r + 2.0) / (n - 6.0) if n > 8 else r
    r1 = min(r1, MAX_LAG1)
    if r1 <= 0.0:
        return 1.0, r1
    return (1.0 + r1) / (1.0 - r1), r1


def mann_kendall(y: npt.ArrayLike, *, lag1_correction: bool = False) -> MannKendall:
    """Mann-Kendall test for a monotone trend in ``y`` (assumed equally spaced in time).

    Rank-based, so heavy tails and spikes barely matter. ``var(S)`` is tie-corrected,
    ``n (n-1) (2n+5) / 18 - sum_g t_g (t_g-1) (2 t_g+5) / 18`` over groups of ``t_g`` equal
    values; ``z`` has the usual continuity correction; ``p`` is two-sided from the normal
    approximation. Non-finite values are dropped; with fewer than 3 left, or no variance
    (all equal), the result is ``z = 0, p = 1``.

    Positive autocorrelation makes the plain test see trends in stationary noise (an AR(1)
    series with phi = 0.8 and n = 24 is "significant" at 1% about 30% of the time).
    ``lag1_correction=True`` multiplies ``var(S)`` by :func:`ess_variance_factor`.
    """
    yy = _as_float(y)
    yy = yy[np.isfinite(yy)]
    n = int(yy.size)
    if n < 3:
        s = int(np.sign(yy[1] - yy[0])) if n == 2 else 0
        return MannKendall(s=s, z=0.0, p=1.0, tau=float(s), var_s=0.0, n=n)
    i, j = np.triu_indices(n, k=1)
    s = int(np.sign(yy[j] - yy[i]).sum())
    _, counts = np.unique(yy, return_counts=True)
    ties = counts[counts > 1].astype(np.float64)
    var_s = (n * (n - 1) * (2 * n + 5) - float(np.sum(ties * (ties - 1) * (2 * ties + 5)))) / 18.0
    factor, r1 = ess_variance_factor(yy) if lag1_correction else (1.0, math.nan)
    var_s *= factor
    tau = s / (n * (n - 1) / 2.0)
    if var_s <= 0.0 or s == 0:
        return MannKendall(s, 0.0, 1.0, tau, var_s, n, factor, r1)
    z = (s - math.copysign(1.0, s)) / math.sqrt(var_s)
    p = math.erfc(abs(z) / math.sqrt(2.0))
    return MannKendall(s, z, min(p, 1.0), tau, var_s, n, factor, r1)


def rank_sum_greater(x: npt.ArrayLike, y: npt.ArrayLike) -> float:
    """One-sided p-value that values of ``y`` tend to exceed those of ``x`` (Mann-Whitney U).

    Ties share their average rank; ``p`` is from the normal approximation with a continuity
    correction (no tie correction of the variance: meant for continuous data). Non-finite
    values are dropped; 1.0 when either side is empty.
    """
    xx, yy = _as_float(x), _as_float(y)
    xx, yy = xx[np.isfinite(xx)], yy[np.isfinite(yy)]
    nx, ny = int(xx.size), int(yy.size)
    if nx == 0 or ny == 0:
        return 1.0
    both = np.concatenate([xx, yy])
    ranks = np.empty(both.size)
    ranks[np.argsort(both, kind="mergesort")] = np.arange(1.0, both.size + 1.0)
    _, inverse, counts = np.unique(both, return_inverse=True, return_counts=True)
    ranks = (np.bincount(inverse, weights=ranks) / counts)[inverse]
    u = float(ranks[nx:].sum()) - ny * (ny + 1) / 2.0
    z = (u - nx * ny / 2.0 - 0.5) / math.sqrt(nx * ny * (nx + ny + 1) / 12.0)
    return 0.5 * math.erfc(z / math.sqrt(2.0))


def robust_scale(x: npt.ArrayLike) -> float:
    """``1.4826 * median(|x - median(x)|)``: a standard deviation that ignores outliers.

    Non-finite values are ignored; 0.0 for constant input; nan when nothing finite is left.
    """
    xx = _as_float(x)
    xx = xx[np.isfinite(xx)]
    if xx.size == 0:
        return math.nan
    return MAD_TO_SIGMA * float(np.median(np.abs(xx - np.median(xx))))


def level_jumps(means: npt.ArrayLike, min_jump: float, *, k: float = 6.0) -> list[int]:
    """Indices ``i`` where ``means`` steps abruptly between point ``i - 1`` and point ``i``.

    A step is a consecutive difference that stands out from the typical difference:
    ``|d_i - median(d)| > max(min_jump, k * robust_scale(d))`` with ``d = diff(means)``.
    Measuring from the median difference means a steady ramp (every difference about
    equal, however steep) is never cut into pieces, and the MAD scale means noise, or a
    sawtooth that the means only partly average out, raises the bar instead of triggering.
    ``min_jump`` (same units as ``means``) is the smallest step worth reporting.

    Non-finite means are skipped (the difference then spans the gap, and the index reported
    is the later point's). At least 4 finite means are needed (so the median difference
    is not itself a jump); fewer give ``[]``. A jump that straddles two averaging windows
    is found from the sum of the two differences, and may flag two consecutive indices.
    Returned ascending: ``means[result[-1]:]`` is the segment after the last jump.
    """
    mm = _as_float(means)
    if min_jump < 0 or not math.isfinite(min_jump):
        raise ValueError(f"min_jump must be finite and >= 0, got {min_jump}")
    idx = np.flatnonzero(np.isfinite(mm))
    if idx.size < 4:
        return []
    d = np.diff(mm[idx])
    typical = np.median(d)
    scale = robust_scale(d)
    single = np.abs(d - typical) > max(min_jump, k * scale)
    # A jump inside an averaging window shows as two half-steps in a row: test their sum
    # too, flagging the point after the straddled one. For means scattered around a level
    # the sum ``m[i+1] - m[i-1]`` is as noisy as one difference (not sqrt(2) times more).
    pair = np.abs(d[:-1] + d[1:] - 2 * typical) > max(min_jump, k * scale)
    flagged = set(idx[1:][single].tolist()) | set(idx[2:][pair & ~single[:-1]].tolist())
    return sorted(int(i) for i in flagged)


@dataclass
class Cusum:
    """One-sided (upward) CUSUM for log ratios, e.g. ``log(step_time / baseline)``.

    ``S_n = max(0, S_{n-1} + x_n - k)``: ``k`` is the allowance (shifts smaller than about
    ``2k`` are ignored; noise and negative drift keep ``S`` pinned at 0) and ``h`` the alarm
    threshold on ``S``. ``onset_t`` is the ``t`` of the last update that left ``S`` at 0:
    the classic CUSUM change-point estimate (the change began right after it; with block
    medians labelled by block end time it is where the first changed block starts). If
    ``S`` was never 0, it is the first ``t`` seen. O(1) state and time per update.
    Non-finite ``x`` is ignored.
    """

    k: float
    h: float
    value: float = field(default=0.0, init=False)
    onset_t: float | None = field(default=None, init=False)

    def __post_init__(self) -> None:
        if not (self.k >= 0 and self.h > 0):
            raise ValueError(f"need k >= 0 and h > 0, got k={self.k}, h={self.h}")

    @property
    def alarm(self) -> bool:
        """True while ``S > h``."""
        return self.value > self.h

    def update(self, x: float, t: float) -> None:
        """Add one observation ``x`` taken at time ``t``."""
        if not math.isfinite(x):
            return
        self.value = max(0.0, self.value + x - self.k)
        if self.value == 0.0 or self.onset_t is None:
            self.onset_t = t

    def reset(self) -> None:
        """Forget everything (e.g. after a finding, re-baseline)."""
        self.value = 0.0
        self.onset_t = None


@dataclass
class RunningBlocks:
    """Turns a stream of per-step values into one value per block, in fixed memory.

    :meth:`add` returns ``(value, block_end_t)`` when the block holds ``size`` values, or
    earlier once ``max_seconds`` have passed since the block's first value and it holds at
    least ``min_size`` values (so slow training still yields blocks at a steady pace).
    ``block_end_t`` is the ``t`` of the block's last value. The block's value is its median,
    or with ``trim``, the mean of its values with that share of the largest left out
    (:func:`trimmed_mean`): both shrug off the odd checkpoint or GC spike that a mean would
    smear over the block. Non-finite values are ignored entirely (they neither count nor
    advance the clock).
    """

    size: int
    max_seconds: float = math.inf
    min_size: int = 1
    trim: float | None = None
    _values: list[float] = field(default_factory=list, init=False, repr=False)
    _start_t: float = field(default=0.0, init=False, repr=False)
    _last_t: float = field(default=0.0, init=False, repr=False)

    def __post_init__(self) -> None:
        if self.size < 1 or not 1 <= self.min_size <= self.size:
            raise ValueError(f"need 1 <= min_size <= size, got {self.min_size}, {self.size}")
        if not self.max_seconds > 0:
            raise ValueError(f"max_seconds must be > 0, got {self.max_seconds}")
        if self.trim is not None and not 0 <= self.trim < 1:
            raise ValueError(f"trim must be a share in [0, 1), got {self.trim}")

    @property
    def pending(self) -> int:
        """Values in the block being filled."""
        return len(self._values)

    def add(self, value: float, t: float) -> tuple[float, float] | None:
        """Add one value at time ``t``; the finished block's ``(median, end_t)`` or None."""
        if not math.isfinite(value):
            return None
        values = self._values
        if not values:
            self._start_t = t
        values.append(value)  # a list: appending is faster than storing into an array
        self._last_t = t
        count = len(values)
        if count >= self.size or (count >= self.min_size and t - self._start_t >= self.max_seconds):
            return self._close()
        return None

    def flush(self) -> tuple[float, float] | None:
        """Close the partial block early if it holds ``min_size`` values (e.g. at run end)."""
        if not self._values or len(self._values) < self.min_size:
            return None
        return self._close()

    def reset(self) -> None:
        """Drop the partial block."""
        self._values.clear()

    def _close(self) -> tuple[float, float]:
        if self.trim is None:
            # statistics.median: the same value as numpy's, a tenth of its cost on a short list.
            value = float(statistics.median(self._values))
        else:
            value = trimmed_mean(self._values, self.trim)
        self._values.clear()
        return value, self._last_t


def trimmed_mean(values: list[float], share: float) -> float:
    """The mean of ``values`` with the largest ``share`` of them (rounded down) left out."""
    kept = sorted(values)[: len(values) - int(len(values) * share)]
    return sum(kept) / len(kept)
