"""Growth over a whole run since start-up, stated at the run's end when no live trend said it:
steady, material and spread out, or smaller but steady to the end. Reasoning:
docs/memory-start-and-end.md, "The end of a run" and "Steady growth to the end".
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import numpy as np

from driftwatch.detect.memory.trends import RAPID_EVEN, Level, MemoryThresholds, Trend, pace_kept
from driftwatch.detect.stats import FloatArray, mann_kendall, theil_sen

CONCLUDE_MIN_POINTS = 3
"""Window floors since start-up (the open one included) a run's end needs to state growth."""
CONCLUDE_MIN_SHARE = 0.1
"""Growth stated at a run's end adds at least this share of the level it started from."""
CONCLUDE_JUMP_SHARE = 0.5
"""Growth stated at a run's end has no window rising by more than this share of it."""
CONCLUDE_ALPHA = 0.01
"""Mann-Kendall level for growth stated at a run's end, from ``CONCLUDE_MK_POINTS`` windows."""
CONCLUDE_MK_POINTS = 6
"""Windows from which that test applies; fewer must each be higher than the last."""
CONCLUDE_PACE = 0.5
"""Growth stated at a run's end: its newer half rose at least this share of the older's rate."""
CONCLUDE_UNSETTLED_SHARE = 0.4
"""Growth stated at the end of a run that ended within its start-up: share its newer half adds."""
CONCLUDE_UNSETTLED_GROWTHS = 32.0
"""Times ``min_growth_amount`` (512 MiB for memory) that growth stated at the end of a run
within its start-up adds at least."""
CONCLUDE_STEADY_POINTS = 10
"""Windows since start-up from which smaller growth, steady to the end, is stated at the end."""
CONCLUDE_STEADY_SHARE = 0.01
"""Share of the level it started from that such steady growth adds at least."""
CONCLUDE_STEADY_GROWTHS = 0.5
"""Times ``min_growth_amount`` (8 MiB for memory) that such steady growth adds at least."""
CONCLUDE_STEADY_PACE = 0.625
"""Steady: its newer half rises at least this share of its older half's rate (a settling
start slows)."""

Window = tuple[float, float, float, int]
"""A window of one scale: (start, mean, floor, readings)."""


def whole_run_trend(
    best: list[Window],
    width: float,
    unsettled: bool,
    thresholds: MemoryThresholds,
    steps: Mapping[float, float] | None = None,
) -> Trend | None:
    """Steady, material growth over ``best``, the windows of one scale since start-up, the
    open one too, at a run's end (``ResourceDriftDetector.conclude``). ``steps``: the mean
    training step of the same scale's windows, by their start, where the run gives a step
    count: growth keeps its pace per second or per step (``_pace_kept``). ``unsettled``: the run
    ended within its start-up climb, and is judged on the newer half of its windows, for
    growth that adds ``CONCLUDE_UNSETTLED_SHARE`` there (a start-up's climb slows after its
    first jump; a leak does not). Growth too small for ``CONCLUDE_MIN_SHARE`` is stated when
    it is steady to the end (``_steady_to_end``)."""
    best = _growing_part(best, unsettled)
    if len(best) < CONCLUDE_MIN_POINTS:
        return None
    times = np.array([w[0] for w in best])
    floors = np.array([w[2] for w in best])
    progress = _steps_of(best, steps or {})
    level = Level(best[-1][1], best[-1][0] + width / 2)
    if _lumpy(floors):
        return None
    least, min_share = 4 * thresholds.min_growth_amount, CONCLUDE_MIN_SHARE
    if unsettled:  # more than the interpreter and its libraries
        least = CONCLUDE_UNSETTLED_GROWTHS * thresholds.min_growth_amount
        min_share = CONCLUDE_UNSETTLED_SHARE
    if floors[-1] - floors[0] < max(least, min_share * floors[0]):
        if unsettled:
            return None
        return _steady_to_end(times, progress, floors, level, width, thresholds)
    return _material_growth(times, progress, floors, level, width)


def _growing_part(best: list[Window], unsettled: bool) -> list[Window]:
    """The windows up to where the growth stopped (a job that stopped training lingers a
    while); within start-up (``unsettled``), their newer half only."""
    if len(best) > 2:
        typical = float(np.median(np.diff([w[2] for w in best])))
        while len(best) > 1 and best[-1][2] - best[-2][2] <= CONCLUDE_PACE * typical:
            best = best[:-1]
    if unsettled:
        best = best[-max(CONCLUDE_MIN_POINTS, (len(best) + 1) // 2) :]
    return best


def _steps_of(best: list[Window], steps: Mapping[float, float]) -> FloatArray | None:
    """The mean training step of each window of ``best``, where every one has a step count
    and each is past the last (a count that restarts, or none, gives ``None``)."""
    progress = np.array([steps.get(w[0], math.nan) for w in best])
    if not np.all(np.diff(progress) > 0):  # False with any NaN
        return None
    return progress


def _pace_kept(
    times: FloatArray, progress: FloatArray | None, floors: FloatArray, share: float
) -> bool:
    """Whether the newer half of ``floors`` rises at ``share`` or more of the older half's
    rate per second, or per training step: a leak of so much a step whose steps slowed
    (a neighbour, a slow callback) grows slower per second but not per step."""
    if pace_kept(times, floors, share):
        return True
    return progress is not None and pace_kept(progress, floors, share)


def _lumpy(floors: FloatArray) -> bool:
    """Whether a single jump holds most of the rise of ``floors`` (of two rises, one more
    than ``RAPID_EVEN`` times the other; of more, one over ``CONCLUDE_JUMP_SHARE`` of it
    all): a jump is never growth."""
    rises = np.diff(floors)
    if len(rises) < 3:
        return bool(rises.max() > RAPID_EVEN * rises.min())
    return bool(rises.max() > CONCLUDE_JUMP_SHARE * (floors[-1] - floors[0]))


def _material_growth(
    times: FloatArray,
    progress: FloatArray | None,
    floors: FloatArray,
    level: Level,
    width: float,
) -> Trend | None:
    """Growth large enough to state if it is steady (every floor higher than the last, or
    Mann-Kendall p under ``CONCLUDE_ALPHA`` from ``CONCLUDE_MK_POINTS`` windows) and keeps
    ``CONCLUDE_PACE`` of its rate in its newer half, per second or per step (not a
    start-up's tail, a cache filling)."""
    test = mann_kendall(floors)
    if len(floors) < CONCLUDE_MK_POINTS and not np.all(np.diff(floors) > 0):
        return None
    if len(floors) >= CONCLUDE_MK_POINTS and not test.p < CONCLUDE_ALPHA:
        return None
    if not _pace_kept(times, progress, floors, CONCLUDE_PACE):
        return None
    slope, _ = theil_sen(times, floors)
    return Trend(
        width, slope, test.p, level.value, level.at, float(times[0]), len(floors), math.inf
    )


def _steady_to_end(
    times: FloatArray,
    progress: FloatArray | None,
    floors: FloatArray,
    level: Level,
    width: float,
    thresholds: MemoryThresholds,
) -> Trend | None:
    """Growth since start-up too small for the whole run's share that is steady to the end:
    from ``CONCLUDE_STEADY_POINTS`` windows, significant at ``thresholds.alpha``, its newer
    half rising at ``CONCLUDE_STEADY_PACE`` of the older's rate or more, per second or per
    step (still growing at the end about as fast as after start-up: a settling start
    slows), adding ``CONCLUDE_STEADY_GROWTHS`` and ``CONCLUDE_STEADY_SHARE`` of the level it
    started from (docs/memory-start-and-end.md, "Steady growth to the end")."""
    count = len(floors)
    grown = floors[-1] - floors[0]
    if count < CONCLUDE_STEADY_POINTS or grown < max(
        CONCLUDE_STEADY_GROWTHS * thresholds.min_growth_amount, CONCLUDE_STEADY_SHARE * floors[0]
    ):
        return None
    test = mann_kendall(floors)
    if not test.p < thresholds.alpha:
        return None
    if not _pace_kept(times, progress, floors, CONCLUDE_STEADY_PACE):
        return None
    slope, _ = theil_sen(times, floors)
    return Trend(width, slope, test.p, level.value, level.at, float(times[0]), count, math.inf)
