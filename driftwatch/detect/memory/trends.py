"""Trends and level jumps of one memory signal at one window width, and what counts as drift.

Trends are judged on window floors (Theil-Sen slope, Mann-Kendall significance) within the
segment after the last level jump; rapid growth on the newest few narrow windows (growth over
a whole run, at its end: ``whole_run``). Reasoning: docs/memory.md,
"Trends and jumps".
"""

from __future__ import annotations

import itertools
import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import NamedTuple

import numpy as np

from driftwatch.detect.stats import FloatArray, level_jumps, mann_kendall, theil_sen
from driftwatch.detect.windows import WindowMeans
from driftwatch.units import MIB

SCALES_SECONDS = (1.5, 2.0, 20.0, 120.0, 600.0)
"""Window widths, in seconds, at which each memory signal is judged."""


class Level(NamedTuple):
    """A signal's newest level and the moment it stands for."""

    value: float  # a window's mean, or a reading
    at: float  # a window's middle, or the reading's time (seconds, the samples' clock)


@dataclass(frozen=True, slots=True)
class Trend:
    """A significant rise of one signal at one scale."""

    width: float
    slope: float  # bytes per second
    p: float
    level: float  # the newest mean
    at: float  # the moment ``level`` stands for
    since: float  # start of the tested segment
    points: int
    decay: float
    """Seconds in which the growth rate falls by a factor e: ``inf`` unless the newer half of
    the window rises clearly slower than the older (a warm-up levelling off)."""

    def time_to(self, limit: float, now: float) -> float:
        """Seconds from ``now`` until the level reaches ``limit`` if the growth goes on as it
        does: projected from ``level``, less the time since the moment it stands for (half a
        window and more: a 2-s window's mean is a second old when it closes)."""
        headroom = limit - self.level
        if not headroom > 0:
            return math.inf  # already past it, or no limit known: nothing to project
        if math.isinf(self.decay):
            from_level = headroom / self.slope
        else:
            reachable = self.slope * self.decay  # what an exponentially slowing rise adds
            if reachable <= headroom:
                return math.inf
            from_level = -self.decay * math.log1p(-headroom / reachable)
        return max(0.0, from_level - max(0.0, now - self.at))


Jump = tuple[float, float]
"""(when, by how many bytes)."""


@dataclass
class TrendAnalysis:
    """Trends and jumps of one signal, from one scale or merged over all of them."""

    settled: list[Trend] = field(default_factory=list)  # past warm-up
    fast: list[Trend] = field(default_factory=list)  # since training started
    rapid: list[Trend] = field(default_factory=list)  # newest few narrow windows, even
    jumps: list[Jump] = field(default_factory=list)
    # Widths whose segment since training started (and since their last jump) holds
    # enough windows to test: a wider scale that could test fast growth and does not
    # find it vetoes a narrower one's.
    fast_tested: set[float] = field(default_factory=set)

    def merge(self, other: TrendAnalysis) -> None:
        self.settled += other.settled
        self.fast += other.fast
        self.rapid += other.rapid
        self.jumps += other.jumps
        self.fast_tested |= other.fast_tested


@dataclass(frozen=True, slots=True)
class MemoryThresholds:
    """What counts as drift of a resource; the defaults, memory's, are tuned on
    ``bench/detection``. Amounts are in the resource's unit (bytes for memory)."""

    points: int = 24  # newest window means tested per scale
    min_points: int = 8
    alpha: float = 0.001  # Mann-Kendall level, for urgent growth and for a leak
    settled_min_width: float = 600.0
    warmup_seconds: float = 3600.0
    warmup_epochs: int = 2
    min_growth: float = 0.005  # a leak grows at least this share of the level over its window
    min_growth_amount: float = 16 * MIB  # and at least this much (the resource's unit: bytes)
    jump_growths: float = 4.0  # a level jump: more than this many ``min_growth_amount``
    fast_horizon: float = 3600.0  # urgent: the limit is reached sooner than this
    min_span: float = 1200.0  # a leak holds at least this long
    scales: tuple[float, ...] = SCALES_SECONDS


DEFAULT_THRESHOLDS = MemoryThresholds()
"""The thresholds the detectors run with."""
RAPID_MAX_WIDTH = 2.0
"""Widest scale, in seconds, judged for rapid growth on its newest few windows."""
RAPID_POINTS = 4
"""Newest window floors a rapid-growth test takes."""
RAPID_EVEN = 3.0
"""Rapid growth: no rise of those floors, per second, exceeds this many times the smallest."""
MIN_READINGS = 3
"""Median readings a scale's windows must hold for the scale to be analysed."""
READINGS_KEPT = 16
"""Newest readings of each signal kept for the tests of growth right after start-up."""
STEEP_READINGS = 7
"""Newest readings a steep-growth test takes (3 s at the young target's 0.5-s interval)."""
STEEP_MAX_GAP = 1.0
"""Seconds between two readings beyond which they are too sparse for the steep test."""
STEEP_MIN_GROWTH = 4
"""Steep growth adds at least this many times ``min_growth_amount`` over its readings."""
SLOWING = 0.8
"""Share of its older half's rate below which a newer half's rise is levelling off."""
SLOWING_MIN_HALF_SPAN = 60.0
"""Seconds each half must span for levelling off to be judged."""


def _decay(older_slope: float, newer_slope: float, half_span: float) -> float:
    """Time constant of an exponentially slowing rise whose rate went from ``older_slope``
    to ``newer_slope`` over ``half_span`` seconds; ``inf`` when it is not clearly slowing."""
    if (
        half_span < SLOWING_MIN_HALF_SPAN
        or not older_slope > 0
        or newer_slope >= SLOWING * older_slope
    ):
        return math.inf
    if newer_slope <= 0:
        return 0.0
    return half_span / math.log(older_slope / newer_slope)


def pace_kept(times: FloatArray, values: FloatArray, share: float) -> bool:
    """Whether the newer half of ``values`` rises at ``share`` or more of the older half's
    rate (Theil-Sen slopes; the halves share their middle point)."""
    half = len(values) // 2
    older, _ = theil_sen(times[: half + 1], values[: half + 1])
    newer, _ = theil_sen(times[half:], values[half:])
    return not newer < share * older  # NaN slopes pass, as no slowing is shown


def analyse_scale(
    scale: WindowMeans,
    thresholds: MemoryThresholds,
    warm_until: float,
    started: float,
    full: bool,
) -> TrendAnalysis:
    """One scale's trends and jumps (the detector caches them until a window closes or a
    phase ends). ``full``: rapid growth counts the window still filling, which holds its
    readings."""
    analysis = TrendAnalysis()
    if len(scale.means) < RAPID_POINTS or statistics.median(scale.readings) < MIN_READINGS:
        return analysis
    times = np.array([t for t, _ in scale.means])
    floors = np.array(scale.floors)
    newest_start, newest_mean = scale.means[-1]
    level = Level(newest_mean, newest_start + scale.width / 2)
    rapid = _rapid_growth(scale, times, floors, level, thresholds, started, full)
    if rapid is not None:
        analysis.rapid.append(rapid)
    if len(scale.means) < thresholds.min_points:
        return analysis
    smallest_jump = max(thresholds.min_growth_amount * thresholds.jump_growths, 0.005 * level.value)
    flat = bool(floors.min() == floors.max())  # idle memory (not NaN): no jump, every slope 0
    splits = [] if flat else level_jumps(floors, min_jump=smallest_jump, k=4.0)
    for i in splits:
        analysis.jumps.append((float(times[i]), float(floors[i] - floors[i - 1])))
    # Floors are lowest readings: the window a rise fell into keeps the old floor, so the
    # first floor past a jump is already the new level's (a fall's window has the new
    # floor itself). The segment starts there.
    start = splits[-1] if splits else 0
    # Narrow scales are urgent only as rapid growth: a rise must still be even now.
    alpha = thresholds.alpha
    buckets = [(times >= warm_until, analysis.settled)]
    if scale.width > RAPID_MAX_WIDTH:
        buckets.append((times >= started, analysis.fast))
    for subset, bucket in buckets:
        idx = np.arange(start, len(floors))[subset[start:]]
        if len(idx) < thresholds.min_points:
            continue
        if bucket is analysis.fast:
            analysis.fast_tested.add(scale.width)
        trend = None if flat else _segment_trend(scale.width, times, floors, idx, level, alpha)
        if trend is not None:
            bucket.append(trend)
    return analysis


def _rapid_growth(
    scale: WindowMeans,
    times: np.ndarray,
    floors: np.ndarray,
    level: Level,
    thresholds: MemoryThresholds,
    started: float,
    full: bool,
) -> Trend | None:
    """An even rise of the newest ``RAPID_POINTS`` windows since ``started`` (``full``: the
    window still filling is one), dated from the first of the unbroken run of higher floors
    it belongs to; None if there is none, or the scale is wider than ``RAPID_MAX_WIDTH``."""
    if scale.width > RAPID_MAX_WIDTH:
        return None
    rising_times, rising_floors = times, floors
    if full:
        start, mean, floor, _ = scale.windows(with_open=True)[-1]
        rising_times, rising_floors = np.append(times, start), np.append(floors, floor)
        level = Level(mean, start + scale.width / 2)
    recent = np.flatnonzero(rising_times >= started)[-RAPID_POINTS:]
    rapid = _even_rise(scale.width, rising_times[recent], rising_floors[recent], level, thresholds)
    if rapid is None or len(recent) != RAPID_POINTS:
        return None
    first = int(recent[0])
    while (
        first > 0
        and rising_times[first - 1] >= started
        and rising_floors[first - 1] < rising_floors[first]
    ):
        first -= 1
    return replace(rapid, since=float(rising_times[first]))


def _segment_trend(
    width: float,
    times: np.ndarray,
    floors: np.ndarray,
    idx: np.ndarray,
    level: Level,
    alpha: float,
) -> Trend | None:
    """The rise of the windows ``idx`` (Theil-Sen slope, and how fast it levels off) if it
    is significant at ``alpha`` (Mann-Kendall); None if not, or if their slope is not above
    0 (then the test is skipped)."""
    slope = theil_sen(times[idx], floors[idx])[0]
    if not slope > 0:
        return None
    # The small-sample autocorrelation estimate is too unstable below ~16 points.
    test = mann_kendall(floors[idx], lag1_correction=len(idx) >= 16)
    if not test.p < alpha:
        return None
    half = len(idx) // 2
    older_slope, _ = theil_sen(times[idx[:half]], floors[idx[:half]])
    newer_slope, _ = theil_sen(times[idx[half:]], floors[idx[half:]])
    since = float(times[idx[0]])
    half_span = (times[idx[-1]] - times[idx[0]]) / 2
    decay = _decay(older_slope, newer_slope, half_span)
    return Trend(width, slope, test.p, level.value, level.at, since, len(idx), decay)


def _even_rise(
    width: float,
    times: np.ndarray,
    floors: np.ndarray,
    level: Level,
    thresholds: MemoryThresholds,
) -> Trend | None:
    """A rise of contiguous windows' floors that is material, even (every window higher,
    none by a jump: ``_even``) and keeps its pace (the newer windows rise at least
    ``SLOWING`` of the older ones' rate): the shape of a leak, not of a level that settles."""
    if len(floors) < 3 or np.any(np.diff(times) > 2 * width):
        return None
    if (
        not np.all(np.diff(floors) > 0)
        or floors[-1] - floors[0] < thresholds.min_growth_amount
        or not _even(times, floors)
    ):
        return None
    older, _ = theil_sen(times[:3], floors[:3])
    newer, _ = theil_sen(times[-3:], floors[-3:])
    if newer < SLOWING * older:
        return None
    slope, _ = theil_sen(times, floors)
    p = mann_kendall(floors).p
    return Trend(width, slope, p, level.value, level.at, float(times[0]), len(floors), math.inf)


def _even(times: np.ndarray, floors: np.ndarray) -> bool:
    """No window's rise, per second, more than ``RAPID_EVEN`` times another's. One floor
    between the first and the last may be a GC dip: below the line through its neighbours,
    the small rise into it and the large one out of it within ``RAPID_EVEN`` of each other,
    they count as one rise over both windows. A level jump, or the start of a rise after a
    flat stretch, is one large rise beside a small one whichever floor is left out."""
    rates = _rates(times, floors)
    if rates.max() <= RAPID_EVEN * rates.min():
        return True
    for i in range(1, len(floors) - 1):
        into, out = rates[i - 1], rates[i]
        if into < out <= RAPID_EVEN * into:  # below the line through its neighbours
            merged = _rates(np.delete(times, i), np.delete(floors, i))
            if merged.max() <= RAPID_EVEN * merged.min():
                return True
    return False


def _rates(times: np.ndarray, floors: np.ndarray) -> np.ndarray:
    """Each window's rise to the next, per second."""
    return np.diff(floors) / np.diff(times)


def steep_rise(times: np.ndarray, values: np.ndarray, thresholds: MemoryThresholds) -> Trend | None:
    """Growth read by read: every reading higher than the last, none by a jump, keeping its
    pace, and adding ``STEEP_MIN_GROWTH`` times ``min_growth_amount`` (more than a GC cycle
    or a cache swings) over ``STEEP_READINGS`` readings taken close together. Seen seconds
    before window floors could show it; a one-off jump within a second rises in a reading
    or two and then stops."""
    if len(values) < STEEP_READINGS or np.any(np.diff(times) > STEEP_MAX_GAP):
        return None
    rises = np.diff(values)
    if (
        not np.all(rises > 0)
        or values[-1] - values[0] < STEEP_MIN_GROWTH * thresholds.min_growth_amount
        or rises.max() > RAPID_EVEN * rises.min()
    ):
        return None
    if not pace_kept(times, values, SLOWING):
        return None
    slope, _ = theil_sen(times, values)
    p = mann_kendall(values).p
    newest = Level(float(values[-1]), float(times[-1]))
    return Trend(0.0, slope, p, newest.value, newest.at, float(times[0]), len(values), math.inf)


def fresh_rises(
    readings: Sequence[tuple[float, float]],
    started: float,
    thresholds: MemoryThresholds,
    *,
    ended: bool = False,
) -> list[Trend]:
    """Growth since start-up ended that the scales' windows cannot show yet: steep growth
    over the newest readings, and rapid growth over windows counted from start-up's end
    (the fixed windows' first after it may begin up to a window later, and the one it falls
    in holds the climb's last readings). ``ended``: the run ended, its last window will
    hold no more readings."""
    if not readings or readings[0][0] > started:
        found: list[Trend] = []
    else:
        found = _anchored_rise(readings, started, thresholds, ended)
    newest = list(readings)[-STEEP_READINGS:]
    if (
        len(newest) == STEEP_READINGS
        and newest[0][0] >= started
        # every reading higher than the last, as steep_rise asks first: no arrays otherwise
        and all(a[1] < b[1] for a, b in itertools.pairwise(newest))
    ):
        times, values = np.array(newest).T
        steep = steep_rise(times, values, thresholds)
        if steep is not None:
            found.append(steep)
    return found


def _anchored_rise(
    readings: Sequence[tuple[float, float]],
    started: float,
    thresholds: MemoryThresholds,
    ended: bool,
) -> list[Trend]:
    """Rapid growth over the newest ``RAPID_POINTS`` complete windows of the narrowest width
    counted from ``started``, each holding ``MIN_READINGS`` readings (the last one, at a
    run's end, whatever it holds)."""
    width = thresholds.scales[0]
    windows: dict[int, list[float]] = {}
    for t, value in readings:
        if t >= started:
            windows.setdefault(math.floor((t - started) / width + 1e-9), []).append(value)
    keys = sorted(windows)
    if not ended and keys and len(windows[keys[-1]]) < MIN_READINGS:
        keys = keys[:-1]  # still filling: the newest complete windows are judged
    newest = keys[-RAPID_POINTS:]
    complete = newest[:-1] if ended else newest
    if len(newest) < RAPID_POINTS or any(len(windows[k]) < MIN_READINGS for k in complete):
        return []
    starts = np.array([started + k * width for k in newest])
    floors = np.array([min(windows[k]) for k in newest])
    rise = _even_rise(width, starts, floors, Level(readings[-1][1], readings[-1][0]), thresholds)
    return [] if rise is None else [rise]
