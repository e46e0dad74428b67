"""driftwatch.detect.stats: hand-computed cases, robustness, simulations, scipy cross-checks."""

from __future__ import annotations

import math

import numpy as np
import numpy.typing as npt
import pytest

from driftwatch.detect.stats import (
    MAX_LAG1,
    Cusum,
    RunningBlocks,
    ess_variance_factor,
    lag1_autocorrelation,
    level_jumps,
    mann_kendall,
    rank_sum_greater,
    robust_scale,
    theil_sen,
    trimmed_mean,
)

FloatArray = npt.NDArray[np.float64]


def ar1(rng: np.random.Generator, m: int, n: int, phi: float, burn: int = 100) -> FloatArray:
    """``m`` stationary AR(1) series of length ``n``: x_t = phi x_{t-1} + e_t, e ~ N(0, 1)."""
    e = rng.standard_normal((m, n + burn))
    x = np.zeros_like(e)
    for t in range(1, n + burn):
        x[:, t] = phi * x[:, t - 1] + e[:, t]
    return x[:, burn:]


# --------------------------------------------------------------------------- theil_sen


def test_theil_sen_exact_on_a_line() -> None:
    t = np.linspace(0.0, 3600.0, 25)
    slope, intercept = theil_sen(t, 2.5e-3 * t + 7.0)
    assert slope == pytest.approx(2.5e-3, rel=1e-12)
    assert intercept == pytest.approx(7.0, rel=1e-12)


def test_theil_sen_hand_computed() -> None:
    # Points (0,0) (1,1) (2,2) (3,10). Pairwise slopes: 1, 1, 10/3, 1, 9/2, 8 ->
    # sorted 1 1 1 10/3 9/2 8, median (1 + 10/3) / 2 = 13/6.
    # y - 13/6 t = 0, -7/6, -14/6, 21/6 -> median (-7/6 + 0) / 2 = -7/12.
    assert theil_sen([0, 1, 2, 3], [0, 1, 2, 10]) == pytest.approx((13 / 6, -7 / 12))


def test_theil_sen_ties_in_t_are_skipped() -> None:
    # Points (0,0) (0,2) (1,1) (2,3); the pair with equal t is skipped. Slopes:
    # (0,0)-(1,1) 1, (0,0)-(2,3) 1.5, (0,2)-(1,1) -1, (0,2)-(2,3) 0.5, (1,1)-(2,3) 2
    # -> median 1. y - t = 0, 2, 0, 1 -> median 0.5.
    assert theil_sen([0, 0, 1, 2], [0, 2, 1, 3]) == (1.0, 0.5)


def test_theil_sen_robust_to_30_percent_gross_outliers() -> None:
    rng = np.random.default_rng(42)
    t = np.arange(40, dtype=np.float64)
    y = 3.0 * t + 5.0 + rng.normal(0.0, 0.5, t.size)
    bad = rng.choice(t.size, size=12, replace=False)  # 30% of the points
    y[bad] += rng.uniform(500.0, 5000.0, bad.size)
    slope, intercept = theil_sen(t, y)
    assert slope == pytest.approx(3.0, abs=0.2)
    assert intercept == pytest.approx(5.0, abs=3.0)
    # Least squares, by contrast, is dragged far away.
    ls_slope = float(np.polyfit(t, y, 1)[0])
    assert abs(ls_slope - 3.0) > 10 * abs(slope - 3.0)


def test_theil_sen_drops_non_finite_points() -> None:
    t = np.arange(10, dtype=np.float64)
    y = 2.0 * t + 1.0
    y[[2, 7]] = [np.nan, np.inf]
    t_nan = t.copy()
    t_nan[4] = np.nan
    assert theil_sen(t, y) == pytest.approx((2.0, 1.0))
    assert theil_sen(t_nan, y) == pytest.approx((2.0, 1.0))


@pytest.mark.parametrize(
    ("t", "y"),
    [
        ([], []),
        ([1.0], [2.0]),
        ([3.0, 3.0, 3.0], [1.0, 2.0, 3.0]),
        ([0.0, 1.0, 2.0], [np.nan, np.nan, 5.0]),
    ],
)
def test_theil_sen_undefined_without_two_distinct_t(t: list[float], y: list[float]) -> None:
    slope, intercept = theil_sen(t, y)
    assert math.isnan(slope)
    assert math.isnan(intercept)


def test_theil_sen_rejects_mismatched_lengths() -> None:
    with pytest.raises(ValueError, match="differ in length"):
        theil_sen([0, 1, 2], [0, 1])


# --------------------------------------------------------------------------- rank_sum_greater


def test_rank_sum_greater_matches_scipy_without_ties() -> None:
    stats = pytest.importorskip("scipy.stats")
    rng = np.random.default_rng(3)
    x, y = rng.normal(0, 1, 12), rng.normal(0.8, 1, 30)
    expected = stats.mannwhitneyu(y, x, alternative="greater", method="asymptotic").pvalue
    assert rank_sum_greater(x, y) == pytest.approx(expected, rel=1e-9)
    assert rank_sum_greater(y, x) == pytest.approx(1 - expected, abs=0.02)


def test_rank_sum_greater_of_separated_samples_and_empty_sides() -> None:
    # All 8 below all 30: U = 0 for x, so z = (240 - 120 - 0.5) / sqrt(8 * 30 * 39 / 12).
    p = rank_sum_greater(np.arange(8.0), np.arange(100.0, 130.0))
    assert p == pytest.approx(0.5 * math.erfc(119.5 / math.sqrt(780) / math.sqrt(2)))
    assert p < 1e-5
    assert rank_sum_greater([], [1.0]) == 1.0
    assert rank_sum_greater([1.0, math.nan], [math.inf]) == 1.0


# --------------------------------------------------------------------------- mann_kendall


def test_mann_kendall_hand_computed_with_ties() -> None:
    # y = 1 3 2 3 5. Signs of y[j] - y[i] for i < j:
    #   i=0 (1): +,+,+,+  -> +4
    #   i=1 (3): -,0,+    ->  0
    #   i=2 (2): +,+      -> +2
    #   i=3 (3): +        -> +1            S = 7, tau = 7 / 10
    # One tie group of size 2 (the 3s): var = (5*4*15 - 2*1*9) / 18 = 282 / 18 = 15.667.
    # z = (7 - 1) / sqrt(15.667) = 1.51587; p = erfc(z / sqrt 2) = 2 (1 - Phi(1.51587)) = 0.12955.
    mk = mann_kendall([1, 3, 2, 3, 5])
    assert mk.s == 7
    assert mk.n == 5
    assert mk.tau == pytest.approx(0.7)
    assert mk.var_s == pytest.approx(282 / 18)
    assert mk.z == pytest.approx(1.51587, abs=1e-5)
    assert mk.p == pytest.approx(0.12955, abs=1e-5)
    assert mk.variance_factor == 1.0


def test_mann_kendall_decreasing_is_symmetric() -> None:
    up = mann_kendall([1, 3, 2, 3, 5])
    down = mann_kendall([-1, -3, -2, -3, -5])
    assert (down.s, down.z, down.p, down.tau) == pytest.approx((-up.s, -up.z, up.p, -up.tau))


def test_mann_kendall_monotone_series() -> None:
    mk = mann_kendall(np.arange(20) ** 1.5)
    assert mk.s == 190  # every one of the 20*19/2 pairs increases
    assert mk.tau == 1.0
    assert mk.p < 1e-6


def test_mann_kendall_white_noise_is_not_significant() -> None:
    y = np.random.default_rng(0).standard_normal(40)
    assert mann_kendall(y).p > 0.3
    assert mann_kendall(y, lag1_correction=True).p > 0.3


def test_mann_kendall_white_noise_false_positive_rate_is_nominal() -> None:
    ys = np.random.default_rng(7).standard_normal((1000, 30))
    rate = np.mean([mann_kendall(y).p < 0.05 for y in ys])
    assert 0.02 < rate < 0.08


def test_mann_kendall_is_rank_based() -> None:
    y = np.random.default_rng(3).standard_normal(25) + 0.05 * np.arange(25)
    assert mann_kendall(np.exp(3 * y)) == mann_kendall(y)


def test_mann_kendall_ties_and_degenerate_inputs() -> None:
    const = mann_kendall([4.0] * 10)
    assert (const.s, const.z, const.p, const.var_s) == (0, 0.0, 1.0, 0.0)
    # Heavy ties shrink the variance: 0 0 0 1 1 1, all 9 cross pairs increase, S = 9;
    # var = (6*5*17 - 2 * 3*2*11) / 18 = (510 - 132) / 18 = 21.
    mk = mann_kendall([0, 0, 0, 1, 1, 1])
    assert mk.s == 9
    assert mk.var_s == pytest.approx(21.0)
    assert mk.p == pytest.approx(math.erfc((9 - 1) / math.sqrt(21.0) / math.sqrt(2.0)))
    for short in ([], [1.0], [1.0, 2.0], [np.nan, 1.0, np.nan, 2.0]):
        assert mann_kendall(short).p == 1.0
        assert mann_kendall(short, lag1_correction=True).p == 1.0


def test_mann_kendall_drops_nan() -> None:
    y = [1.0, np.nan, 3.0, 2.0, np.inf, 3.0, 5.0]
    assert mann_kendall(y) == mann_kendall([1, 3, 2, 3, 5])


def test_lag1_autocorrelation_hand_computed() -> None:
    # d = -1.5 -0.5 0.5 1.5: sum d_t d_t+1 = 0.75 - 0.25 + 0.75 = 1.25; sum d^2 = 5.
    assert lag1_autocorrelation([1, 2, 3, 4]) == pytest.approx(0.25)
    assert lag1_autocorrelation([1, -1, 1, -1]) == pytest.approx(-0.75)
    assert math.isnan(lag1_autocorrelation([2, 2, 2]))
    assert math.isnan(lag1_autocorrelation([1, 2]))


def test_ess_variance_factor() -> None:
    # Exact line: the residuals carry no autocorrelation information, no correction.
    factor, r1 = ess_variance_factor(3.0 * np.arange(20.0) + 1.0)
    assert factor == 1.0
    assert math.isnan(r1)
    # Hand-computed: y = 0 0 1 1 0 0 1 1 0 0 (n = 10) has Theil-Sen slope 0, mean 0.4,
    # d = -.4 -.4 .6 .6 -.4 -.4 .6 .6 -.4 -.4: sum d^2 = 6(.16) + 4(.36) = 2.4,
    # sum d_t d_t+1 = 3(.16) + 2(.36) - 4(.24) = 0.24 -> r = 0.1;
    # bias-corrected r1 = (10 * 0.1 + 2) / (10 - 6) = 0.75 -> n/n* = 1.75 / 0.25 = 7.
    y = np.array([0, 0, 1, 1, 0, 0, 1, 1, 0, 0], dtype=np.float64)
    assert theil_sen(np.arange(10.0), y)[0] == 0.0
    assert lag1_autocorrelation(y) == pytest.approx(0.1)
    factor, r1 = ess_variance_factor(y)
    assert r1 == pytest.approx(0.75)
    assert factor == pytest.approx(7.0)
    mk = mann_kendall(y, lag1_correction=True)
    assert mk.var_s == pytest.approx(7.0 * mann_kendall(y).var_s)
    # Alternating series: negative autocorrelation never shrinks the variance.
    assert ess_variance_factor(np.tile([1.0, -1.0], 12))[0] == 1.0
    # A slow wave (r close to 1): r1 is capped at MAX_LAG1.
    factor, r1 = ess_variance_factor(np.sin(np.arange(24) / 4))
    assert r1 == MAX_LAG1
    assert factor == pytest.approx((1 + MAX_LAG1) / (1 - MAX_LAG1))


def test_ess_factor_ignores_the_trend_itself() -> None:
    # A leak (steep trend) with white noise must not read as autocorrelation.
    rng = np.random.default_rng(11)
    y = 5.0 * np.arange(48) + rng.standard_normal(48)
    factor, _ = ess_variance_factor(y)
    assert factor < 2.0
    assert mann_kendall(y, lag1_correction=True).p < 1e-8


def test_lag1_correction_raises_p_on_autocorrelated_trendless_series() -> None:
    y = ar1(np.random.default_rng(2024), 1, 24, 0.8)[0]
    plain = mann_kendall(y)
    corrected = mann_kendall(y, lag1_correction=True)
    assert corrected.s == plain.s
    assert corrected.r1 > 0.5
    assert corrected.variance_factor > 3.0
    assert corrected.var_s == pytest.approx(plain.var_s * corrected.variance_factor)
    assert corrected.p > plain.p


def test_lag1_correction_restores_nominal_false_positive_rate() -> None:
    # 2000 trendless AR(1) series, phi = 0.8, n = 48, alpha = 0.01. Uncorrected about 35%
    # reject; corrected about 2% (seeds 0..2 gave 1.5-2.2%).
    ys = ar1(np.random.default_rng(0), 2000, 48, 0.8)
    plain = np.mean([mann_kendall(y).p < 0.01 for y in ys])
    corrected = np.mean([mann_kendall(y, lag1_correction=True).p < 0.01 for y in ys])
    assert plain > 0.2
    assert corrected < 0.03
    assert plain > 10 * corrected


def test_lag1_correction_on_short_series_cuts_most_false_positives() -> None:
    # n = 24 is harder: r1 from 24 points is noisy, so the rate stays a little above
    # nominal (seeds 0..2: 2.5-3.4% against about 30% uncorrected).
    ys = ar1(np.random.default_rng(0), 2000, 24, 0.8)
    plain = np.mean([mann_kendall(y).p < 0.01 for y in ys])
    corrected = np.mean([mann_kendall(y, lag1_correction=True).p < 0.01 for y in ys])
    assert plain > 0.2
    assert corrected < 0.05
    assert plain > 5 * corrected


def test_lag1_correction_on_white_noise_is_not_anticonservative() -> None:
    ys = np.random.default_rng(5).standard_normal((2000, 24))
    corrected = np.mean([mann_kendall(y, lag1_correction=True).p < 0.01 for y in ys])
    assert corrected < 0.015


# --------------------------------------------------------------------------- robust_scale


def test_robust_scale() -> None:
    # median 3; |x - 3| = 2 1 0 1 97 -> median 1.
    assert robust_scale([1, 2, 3, 4, 100]) == pytest.approx(1.4826)
    assert robust_scale([1, 2, np.nan, 3, 4, np.inf, 100]) == pytest.approx(1.4826)
    assert robust_scale([5.0] * 7) == 0.0
    assert math.isnan(robust_scale([np.nan]))
    assert math.isnan(robust_scale([]))
    big = np.random.default_rng(9).normal(0.0, 2.0, 100_000)
    assert robust_scale(big) == pytest.approx(2.0, rel=0.02)


# --------------------------------------------------------------------------- level_jumps

MB = 1e6


def test_level_jumps_finds_a_single_jump() -> None:
    # 10-minute means: slow 2 MB/point leak, 3 MB noise, +400 MB at point 30.
    rng = np.random.default_rng(1)
    i = np.arange(48)
    means = 2e9 + 2 * MB * i + rng.normal(0.0, 3 * MB, i.size) + 400 * MB * (i >= 30)
    jumps = level_jumps(means, min_jump=100 * MB)
    assert jumps == [30]
    # The caller fits the segment after the last jump.
    slope, _ = theil_sen(i[jumps[-1] :], means[jumps[-1] :])
    assert slope == pytest.approx(2 * MB, rel=0.5)


def test_level_jumps_finds_a_drop_too() -> None:
    means = np.r_[np.full(10, 500.0), np.full(10, 100.0)] + np.tile([0.0, 1.0], 10)
    assert level_jumps(means, min_jump=50.0) == [10]


@pytest.mark.parametrize("increment", [1 * MB, 50 * MB, 1000 * MB])
def test_level_jumps_ignores_a_steady_ramp(increment: float) -> None:
    i = np.arange(40)
    assert level_jumps(1e9 + increment * i, min_jump=100 * MB) == []
    noisy = 1e9 + increment * i + np.random.default_rng(4).normal(0.0, 2 * MB, i.size)
    assert level_jumps(noisy, min_jump=100 * MB) == []


def test_level_jumps_ignores_noise() -> None:
    rng = np.random.default_rng(8)
    assert level_jumps(rng.normal(1e9, 20 * MB, 64), min_jump=100 * MB) == []
    # Heavy tails without a min_jump floor: the MAD scale sets the bar.
    heavy = 1e9 + 5 * MB * rng.standard_t(df=5, size=64)
    assert level_jumps(heavy, min_jump=0.0) == []


def test_level_jumps_ignores_averaged_gc_sawtooth() -> None:
    # Raw RSS every 10 s: 250 MB sawtooth with a 70 s period on top of a slow leak; the
    # detector sees 10-minute means (60 raw samples, not a whole number of teeth).
    raw_t = np.arange(60 * 48) * 10.0
    raw = 3e9 + 0.01 * MB * raw_t + 250 * MB * ((raw_t % 70.0) / 70.0)
    means = raw.reshape(48, 60).mean(axis=1)
    assert level_jumps(means, min_jump=100 * MB) == []
    # Means over only 2-3 teeth wobble more, but still are not split on every tooth.
    short = raw[: 20 * 48].reshape(48, 20).mean(axis=1)
    assert level_jumps(short, min_jump=100 * MB) == []


def test_level_jumps_straddling_a_window_flags_the_later_point() -> None:
    # Jump mid-window: point 20 is half-way (+200), point 21 onward fully (+400).
    means = np.r_[np.zeros(20), [200.0], np.full(19, 400.0)] + np.tile([0.0, 1.0], 20)
    jumps = level_jumps(means, min_jump=100.0)
    assert jumps == [20, 21]
    assert np.all(means[jumps[-1] :] >= 400.0)


def test_level_jumps_skips_nan_and_short_input() -> None:
    means = np.r_[np.zeros(10), np.full(10, 400.0)] + np.tile([0.0, 1.0], 10)
    means[10] = np.nan
    assert level_jumps(means, min_jump=100.0) == [11]
    assert level_jumps([0.0, 0.0, 500.0], min_jump=100.0) == []
    assert level_jumps([], min_jump=1.0) == []
    with pytest.raises(ValueError, match="min_jump"):
        level_jumps([1.0, 2.0, 3.0, 4.0], min_jump=-1.0)


# --------------------------------------------------------------------------- Cusum


@pytest.mark.parametrize("seed", range(5))
def test_cusum_onset_of_a_step_change(seed: int) -> None:
    # log(step_time / baseline): noise 0.02, then a 10% slowdown from sample 100 on.
    rng = np.random.default_rng(seed)
    x = rng.normal(0.0, 0.02, 160)
    x[100:] += 0.1
    t = 1000.0 + 60.0 * np.arange(x.size)  # one block a minute
    c = Cusum(k=0.05, h=0.4)
    first_alarm: int | None = None
    onset: float | None = None
    for i, (xi, ti) in enumerate(zip(x, t, strict=True)):
        c.update(float(xi), float(ti))
        if c.alarm and first_alarm is None:
            first_alarm = i
            onset = c.onset_t
    assert first_alarm is not None
    assert 100 <= first_alarm <= 120
    # Last zero should be sample 99, the last one before the change.
    assert onset is not None
    assert abs(onset - t[99]) <= 2 * 60.0


def test_cusum_stays_quiet_on_noise_with_negative_drift() -> None:
    rng = np.random.default_rng(12)
    c = Cusum(k=0.05, h=0.4)
    peak = 0.0
    for i in range(5000):
        c.update(float(-1e-5 * i + rng.normal(0.0, 0.02)), float(i))
        peak = max(peak, c.value)
        assert not c.alarm
    assert peak < 0.2


def cusum_state(c: Cusum) -> tuple[float, float | None, bool]:
    return c.value, c.onset_t, c.alarm


def test_cusum_arithmetic_reset_and_nan() -> None:
    c = Cusum(k=1.0, h=5.0)
    assert cusum_state(c) == (0.0, None, False)
    c.update(0.5, 10.0)  # max(0, 0 + 0.5 - 1) = 0: last zero at t = 10
    assert cusum_state(c) == (0.0, 10.0, False)
    c.update(4.0, 11.0)  # 3
    c.update(math.nan, 12.0)  # ignored
    c.update(3.5, 13.0)  # 5.5 > h
    assert cusum_state(c) == (5.5, 10.0, True)
    c.update(-10.0, 14.0)  # back to 0: the onset moves on
    assert cusum_state(c) == (0.0, 14.0, False)
    c.reset()
    assert cusum_state(c) == (0.0, None, False)
    c.update(3.0, 20.0)  # positive at once: the change predates the first sample seen
    assert cusum_state(c) == (2.0, 20.0, False)


def test_cusum_validates_parameters() -> None:
    with pytest.raises(ValueError, match="k >= 0"):
        Cusum(k=-1.0, h=1.0)
    with pytest.raises(ValueError, match="h > 0"):
        Cusum(k=0.1, h=0.0)


# --------------------------------------------------------------------------- RunningBlocks


def test_blocks_medians_by_count() -> None:
    b = RunningBlocks(size=5)
    out = [b.add(v, float(i)) for i, v in enumerate([5.0, 1.0, 100.0, 2.0, 3.0, 9, 7, 8, 6, 10])]
    assert out[4] == (3.0, 4.0)
    assert out[9] == (8.0, 9.0)
    assert [o for o in out if o is not None] == [(3.0, 4.0), (8.0, 9.0)]
    even = RunningBlocks(size=4)
    results = [even.add(v, 0.0) for v in (1.0, 4.0, 2.0, 10.0)]
    assert results[-1] == (3.0, 0.0)


def test_blocks_close_early_on_time() -> None:
    b = RunningBlocks(size=100, max_seconds=10.0, min_size=3)
    assert b.add(1.0, 0.0) is None
    assert b.add(3.0, 4.0) is None
    assert b.add(2.0, 8.0) is None
    assert b.add(10.0, 12.0) == (2.5, 12.0)
    assert b.pending == 0
    # Too few values when the time is up: wait for min_size.
    assert b.add(1.0, 100.0) is None
    assert b.add(2.0, 200.0) is None
    assert b.add(3.0, 201.0) == (2.0, 201.0)


def test_blocks_ignore_non_finite_values() -> None:
    b = RunningBlocks(size=3)
    assert b.add(math.nan, 0.0) is None
    assert b.add(1.0, 1.0) is None
    assert b.add(math.inf, 2.0) is None
    assert b.add(-math.inf, 2.5) is None
    assert b.add(2.0, 3.0) is None
    assert b.pending == 2
    assert b.add(30.0, 4.0) == (2.0, 4.0)


def test_blocks_flush_reset_and_fixed_memory() -> None:
    b = RunningBlocks(size=8, min_size=2)
    assert b.flush() is None
    b.add(1.0, 1.0)
    assert b.flush() is None  # below min_size
    b.add(5.0, 2.0)
    assert b.flush() == (3.0, 2.0)
    b.add(1.0, 3.0)
    b.reset()
    assert b.pending == 0
    rng = np.random.default_rng(0)
    medians, most_pending = [], 0
    for i, v in enumerate(rng.standard_normal(10_000)):
        medians.append(b.add(float(v), float(i)))
        most_pending = max(most_pending, b.pending)
    assert sum(m is not None for m in medians) == 10_000 // 8
    assert most_pending == 7  # never more than one block's values held


def test_blocks_validate_parameters() -> None:
    with pytest.raises(ValueError, match="min_size"):
        RunningBlocks(size=0)
    with pytest.raises(ValueError, match="min_size"):
        RunningBlocks(size=4, min_size=5)
    with pytest.raises(ValueError, match="max_seconds"):
        RunningBlocks(size=4, max_seconds=0.0)
    with pytest.raises(ValueError, match="trim"):
        RunningBlocks(size=4, trim=1.0)


def test_trimmed_blocks_leave_out_their_slowest_share_and_average_the_rest() -> None:
    # Ten values, the slowest tenth (one) left out: a spike does not count, and waits that
    # land on several values do (a median of these would say 1.0 either way).
    b = RunningBlocks(size=10, trim=0.1)
    values = [1.0] * 6 + [4.0, 4.0, 4.0, 100.0]
    out = [b.add(v, float(i)) for i, v in enumerate(values)]
    assert out[-1] == (2.0, 9.0)  # (6 + 12) / 9
    assert trimmed_mean([3.0, 1.0, 2.0], 0.1) == 2.0  # fewer than ten: none left out
    assert trimmed_mean([5.0], 0.5) == 5.0
    assert trimmed_mean([1.0, 9.0], 0.5) == 1.0


# --------------------------------------------------------------------------- scipy cross-checks


def test_cross_check_with_scipy() -> None:
    stats = pytest.importorskip("scipy.stats")
    rng = np.random.default_rng(123)
    for _ in range(20):
        n = int(rng.integers(5, 60))
        t = np.round(rng.uniform(0, 20, n))  # ties in t
        y = np.round(0.3 * t + rng.standard_t(3, n), 1)  # ties in y
        assert theil_sen(t, y)[0] == pytest.approx(stats.theilslopes(y, t)[0], rel=1e-12)
        assert robust_scale(y) == pytest.approx(
            stats.median_abs_deviation(y, scale="normal"), rel=1e-4
        )
        # scipy's asymptotic Kendall test against time (no ties in x) has the same S and
        # tie-corrected variance, without the continuity correction.
        mk = mann_kendall(y)
        ref = stats.kendalltau(np.arange(n), y, method="asymptotic")
        _, counts = np.unique(y, return_counts=True)
        n0 = n * (n - 1) / 2
        n2 = float(np.sum(counts * (counts - 1) / 2))
        assert mk.s == pytest.approx(ref.statistic * math.sqrt(n0 * (n0 - n2)), abs=1e-6)
        p_no_cc = math.erfc(abs(mk.s) / math.sqrt(mk.var_s) / math.sqrt(2.0))
        assert p_no_cc == pytest.approx(ref.pvalue, rel=1e-9)
