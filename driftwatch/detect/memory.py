"""Memory drift: slope, significance and time to the limit, per signal, at several scales.

Each signal (host RSS, TensorFlow's allocator, GPU process memory) is averaged into
consecutive windows at several widths (1.5 s to 10 min) and the newest ``points`` means of
each are tested: Theil-Sen slope and Mann-Kendall trend (corrected for lag-1
autocorrelation), within the segment after the last level jump, so a one-off allocation is
a "memory step", not a leak. Short scales see fast growth within seconds (rapid growth on
their newest few windows), long ones a slow leak over hours. Start-up (imports, model
building, tracing) is never judged: it ends on the signal's own shape (``StartUp``), at the
first training step, or after ``STARTUP_MAX_SECONDS``, so no step signal is needed. Warm-up
is excluded, and a trend counts as a leak only once it has held for ``min_span`` seconds (a
GC or caching cycle rises for minutes, then falls), except growth that would exhaust the
limit within ``fast_horizon`` seconds: that is reported whenever it is seen. At a run's end
(``conclude``), growth no live window could judge yet is stated over the whole run.
"""

from __future__ import annotations

import math
import statistics
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field, replace

import numpy as np

from driftwatch.detect import Detector, Evaluation
from driftwatch.detect.stats import level_jumps, mann_kendall, theil_sen
from driftwatch.findings import Finding, Severity
from driftwatch.series import Labels, Sample
from driftwatch.units import clock, human_bytes, human_seconds

MIB = 1 << 20
SCALES_SECONDS = (1.5, 2.0, 20.0, 120.0, 600.0)


class WindowMeans:
    """Consecutive fixed-width windows of one series: the newest ``points`` means and floors.

    A window's floor is its lowest reading. Memory that is garbage-collected, or a probe
    that lands mid-step and sees activations on top, lifts the mean of some windows but not
    their floors, while memory that is kept (a leak) lifts every floor: trends and jumps are
    judged on floors, levels and limits on means. A floor says this only of windows that hold
    several readings: ``readings`` counts them.
    """

    __slots__ = (
        "_count",
        "_floor",
        "_start",
        "_sum",
        "floors",
        "means",
        "readings",
        "version",
        "width",
    )

    def __init__(self, width: float, points: int) -> None:
        self.width = width
        self.means: deque[tuple[float, float]] = deque(maxlen=points)  # (window start, mean)
        self.floors: deque[float] = deque(maxlen=points)  # the same windows' lowest readings
        self.readings: deque[int] = deque(maxlen=points)  # and how many readings they hold
        self.version = 0  # counts closed windows: analyses of ``means`` can be cached on it
        self._start = math.nan
        self._sum = 0.0
        self._floor = math.inf
        self._count = 0

    def add(self, t: float, value: float) -> None:
        if not math.isfinite(value):
            return
        start = math.floor(t / self.width) * self.width
        if start > self._start or math.isnan(self._start):
            if self._count:
                self.means.append((self._start, self._sum / self._count))
                self.floors.append(self._floor)
                self.readings.append(self._count)
                self.version += 1
            self._start, self._sum, self._floor, self._count = start, 0.0, math.inf, 0
        self._sum += value
        self._floor = min(self._floor, value)
        self._count += 1

    @property
    def open_is_full(self) -> bool:
        """Whether the window still filling holds as many readings as the last closed one:
        its floor is as good as final (the next reading closes it)."""
        return bool(self.readings) and self._count >= self.readings[-1]

    def windows(self, *, with_open: bool = False) -> list[tuple[float, float, float, int]]:
        """(start, mean, floor, readings) of the kept windows, oldest first; ``with_open``:
        the window still filling too (a run that ended will close it no more)."""
        closed = [
            (t, mean, floor, count)
            for (t, mean), floor, count in zip(self.means, self.floors, self.readings, strict=True)
        ]
        if with_open and self._count:
            closed.append((self._start, self._sum / self._count, self._floor, self._count))
        return closed


@dataclass(frozen=True, slots=True)
class Trend:
    """A significant rise of one signal at one scale."""

    width: float
    slope: float  # bytes per second
    p: float
    level: float  # the newest mean
    since: float  # start of the tested segment
    points: int
    decay: float
    """Seconds in which the growth rate falls by a factor e: ``inf`` unless the newer half of
    the window rises clearly slower than the older (a warm-up levelling off)."""

    def time_to(self, limit: float) -> float:
        """Seconds until the level reaches ``limit`` if the growth goes on as it does now."""
        headroom = limit - self.level
        if not headroom > 0:
            return math.inf  # already past it, or no limit known: nothing to project
        if math.isinf(self.decay):
            return headroom / self.slope
        reachable = self.slope * self.decay  # what an exponentially slowing rise still adds
        if reachable <= headroom:
            return math.inf
        return -self.decay * math.log1p(-headroom / reachable)


Jump = tuple[float, float]
"""(when, by how many bytes)."""


@dataclass
class Analysis:
    """Trends and jumps of one signal, from one scale or merged over all of them."""

    settled: list[Trend] = field(default_factory=list)  # past warm-up
    fast: list[Trend] = field(default_factory=list)  # since training started
    rapid: list[Trend] = field(default_factory=list)  # newest few narrow windows, even
    jumps: list[Jump] = field(default_factory=list)
    # Widths whose segment since training started (and since their last jump) holds
    # enough windows to test: a wider scale that could test fast growth and does not
    # find it vetoes a narrower one's.
    fast_tested: set[float] = field(default_factory=set)

    def merge(self, other: Analysis) -> None:
        self.settled += other.settled
        self.fast += other.fast
        self.rapid += other.rapid
        self.jumps += other.jumps
        self.fast_tested |= other.fast_tested


class StartUp:
    """When a signal's start-up climb ended, from its shape alone (no step signal needed).

    Fed the floors of the narrowest windows as they close. The climb from the first reading
    lasts until two windows in a row, alike, rise slowly for the level (``STARTUP_SETTLED``)
    or faster than the climb did (``STARTUP_FASTER``): a new pace, not a lull or a lump of a
    lumpy climb. Growth from the first of them on is judged (docs/detectors.md).
    """

    __slots__ = ("_changing", "_previous", "_rates", "ended_at")

    def __init__(self) -> None:
        self.ended_at = math.nan
        self._previous: tuple[float, float] | None = None  # (window start, floor)
        self._rates: list[float] = []
        # a window that may begin a new pace: ("faster" or "slower", its start, its rate)
        self._changing: tuple[str, float, float] | None = None

    def window_closed(self, start: float, floor: float) -> None:
        if not math.isnan(self.ended_at):
            return
        previous, self._previous = self._previous, (start, floor)
        if previous is None or not start > previous[0]:
            return
        rate = (floor - previous[1]) / (start - previous[0])
        pace = median = math.nan
        if len(self._rates) >= STARTUP_PACE_RISES:
            median = statistics.median(self._rates)
        later = self._rates[STARTUP_PACE_RISES:]
        if len(later) >= 2:
            # Faster than the climb's median pace and than its fastest window once the first
            # ones are past (they may hold the interpreter's and the libraries' jump).
            pace = STARTUP_FASTER * max(median, *later)
        # A new pace shows in two windows in a row (faster ones alike): one alone is a lump
        # or a lull, and joins the climb's pace once the next window says so.
        change = None
        if rate > pace:  # False while the pace is NaN
            change = "faster"
        elif rate <= STARTUP_SETTLED * abs(floor) and rate <= max(median, 0.0) / STARTUP_SLOWER:
            change = "slower"  # False while the pace is NaN: a climb's first lumps are small
        pending = self._changing
        if (
            pending is not None
            and change == pending[0]
            and (change == "slower" or _alike(rate, pending[2]))
        ):
            self.ended_at = pending[1]
            return
        if pending is not None:
            self._rates.append(pending[2])
        if change is None:
            self._rates.append(rate)
            self._changing = None
        else:
            self._changing = (change, previous[0], rate)


def _alike(rate: float, other: float) -> bool:
    """Neither rises more than ``STARTUP_KNEE`` times the other."""
    return max(rate, other) <= STARTUP_KNEE * min(rate, other)


@dataclass
class _Signal:
    """State of one signal and label set."""

    scales: list[WindowMeans]
    first_t: float = math.nan
    startup: StartUp = field(default_factory=StartUp)
    analysed: dict[float, tuple[tuple[int, float, float, bool], Analysis]] = field(
        default_factory=dict
    )


@dataclass(frozen=True, slots=True)
class MemoryThresholds:
    """What counts as drift; the defaults are tuned on ``bench/detection``."""

    points: int = 24  # newest window means tested per scale
    min_points: int = 8
    alpha: float = 0.001  # Mann-Kendall level, for urgent growth and for a leak
    settled_min_width: float = 600.0
    warmup_seconds: float = 3600.0
    warmup_epochs: int = 2
    min_growth: float = 0.005  # a leak grows at least this share of the level over its window
    min_growth_bytes: float = 16 * MIB  # and at least this much
    fast_horizon: float = 3600.0  # urgent: the limit is reached sooner than this
    min_span: float = 1200.0  # a leak holds at least this long
    scales: tuple[float, ...] = SCALES_SECONDS


STARTUP_MAX_SECONDS = 30.0
"""Longest a signal's climb from its first reading counts as start-up, in seconds."""
STARTUP_PACE_RISES = 3
"""Window rises that set a start-up climb's pace before a new pace can end it."""
STARTUP_FASTER = 2.0
"""A window rising this many times the climb's median pace and its fastest since its first
rises is faster than start-up."""
STARTUP_KNEE = 2.0
"""Two windows are alike when neither rises more than this many times the other."""
STARTUP_SETTLED = 0.025
"""A window rising by less than this share of its level per second has settled."""
STARTUP_SLOWER = 3.0
"""...and by less than the climb's median pace divided by this (not a lull of a slow climb)."""
RAPID_MAX_WIDTH = 2.0
"""Widest scale, in seconds, judged for rapid growth on its newest few windows."""
RAPID_POINTS = 4
"""Newest window floors a rapid-growth test takes."""
RAPID_EVEN = 3.0
"""Rapid growth: no rise of those floors exceeds this many times the smallest."""
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
CONCLUDE_UNSETTLED_BYTES = 512 * MIB
"""...and bytes it adds at least (TensorFlow's libraries bring 370 MB in the first second)."""
MIN_READINGS = 3
"""Readings a scale's windows hold (median) for the scale to be analysed: the floor of a
window with one or two readings is just those readings, and a GC cycle's rising half, seen
at the monitor's 10-s tick through 2-s or 20-s windows, would pass for a leak rushing to the
limit (with 2, 3 of 10 healthy GC-heavy runs got a critical finding in their first minutes)."""
TF_SHARE_OF_LEAK = 0.25
"""TensorFlow's allocator rising at this share of RSS's rate or more makes the leak one of
tensors kept alive: a tensor costs RSS and allocator bytes alike, Python state only RSS."""
TF_RISE_P = 0.1
"""Significance asked of the allocator's rise once it keeps pace with RSS (above), from a
plain Mann-Kendall test: the RSS trend is already established, and the question is only
whether the allocator follows it. Its probes may start seconds after RSS rises (4 rising
windows give p = 0.09; p < 0.01 would ask for 6), and a rise whose rate changes (steps
getting faster) leaves autocorrelated residuals around one line, which the lag-1 correction
would read as noise: 16 strictly rising windows got p = 0.16 with it."""
SLOWING = 0.8
"""A window's newer half rising slower than this share of its older half's rate is a
rise that levels off (a warm-up), not noise around a steady one."""
SLOWING_MIN_HALF_SPAN = 60.0
"""Levelling off is judged over at least a minute on each side: within seconds, the tail
of a start-up ramp followed by a leak looks the same."""


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


class MemoryDriftDetector:
    """Drift of one memory signal, reported as ``kind`` with projected time to the limit."""

    def __init__(
        self,
        signal: str,
        kind: str,
        what: str,
        limit_series: str | None,
        thresholds: MemoryThresholds = MemoryThresholds(),
    ) -> None:
        self.name = kind
        self.what = what
        self.signal = signal
        wanted = {signal, "epoch_seconds", "train_step"}
        if limit_series is not None:
            wanted.add(limit_series)
        self.series = frozenset(wanted)
        self.thresholds = thresholds
        self._signals: dict[Labels, _Signal] = {}
        self._limits: dict[Labels, float] = {}
        self._epochs = 0
        self._epochs_done_at = math.nan  # when ``warmup_epochs`` epochs had ended
        self._first_step_at = math.inf  # when the first training step was seen

    # -- input -------------------------------------------------------------------------

    def observe(self, sample: Sample) -> None:
        if sample.series == "train_step":
            self._first_step_at = min(self._first_step_at, sample.t)
        elif sample.series == "epoch_seconds":
            self._epochs += 1
            if self._epochs == self.thresholds.warmup_epochs:
                self._epochs_done_at = sample.t
        elif sample.series == self.signal:
            state = self._signals.get(sample.labels)
            if state is None:
                widths = [WindowMeans(w, self.thresholds.points) for w in self.thresholds.scales]
                state = self._signals[sample.labels] = _Signal(widths, first_t=sample.t)
            narrowest = state.scales[0]
            closed = narrowest.version
            for scale in state.scales:
                scale.add(sample.t, sample.value)
            if narrowest.version != closed:
                state.startup.window_closed(narrowest.means[-1][0], narrowest.floors[-1])
        elif math.isfinite(sample.value) and sample.value > 0:
            self._limits[sample.labels] = sample.value

    def limit_for(self, labels: Labels) -> float:
        """The limit of a signal: same labels, else the only (unlabelled) limit known."""
        return self._limits.get(labels, self._limits.get((), math.nan))

    # -- analysis ----------------------------------------------------------------------

    def training_start(self, state: _Signal) -> float:
        """When start-up ended: by the signal's own shape, at the first training step, or
        after ``STARTUP_MAX_SECONDS``, whichever comes first (no step signal needed: many
        jobs give none). Growth before it is never judged live, not even urgent growth."""
        ended = min(self._first_step_at, state.first_t + STARTUP_MAX_SECONDS)
        by_shape = state.startup.ended_at
        return min(by_shape, ended) if math.isfinite(by_shape) else ended

    def warmup_end(self, state: _Signal) -> float:
        """Warm-up lasts ``warmup_seconds`` and ``warmup_epochs`` epochs, whichever is longer."""
        by_time = state.first_t + self.thresholds.warmup_seconds
        return (
            max(by_time, self._epochs_done_at) if math.isfinite(self._epochs_done_at) else by_time
        )

    def trends(self, state: _Signal) -> Analysis:
        """Trends past warm-up, fast trends since training started and level jumps, over
        all scales."""
        merged = Analysis()
        warm_until = self.warmup_end(state)
        started = self.training_start(state)
        for scale in state.scales:
            full = scale.width <= RAPID_MAX_WIDTH and scale.open_is_full
            key = (scale.version, warm_until, started, full)
            cached = state.analysed.get(scale.width)
            if cached is None or cached[0] != key:
                analysis = self._analyse(scale, warm_until, started, full)
                cached = state.analysed[scale.width] = (key, analysis)
            merged.merge(cached[1])
        return merged

    def _analyse(
        self, scale: WindowMeans, warm_until: float, started: float, full: bool
    ) -> Analysis:
        """One scale's trends and jumps; cached until a window closes or a phase ends.
        ``full``: rapid growth counts the window still filling, which holds its readings."""
        analysis = Analysis()
        if len(scale.means) < RAPID_POINTS or statistics.median(scale.readings) < MIN_READINGS:
            return analysis
        times = np.array([t for t, _ in scale.means])
        floors = np.array(scale.floors)
        level = scale.means[-1][1]
        if scale.width <= RAPID_MAX_WIDTH:
            rising_times, rising_floors = times, floors
            if full:
                start, _, floor, _ = scale.windows(with_open=True)[-1]
                rising_times, rising_floors = np.append(times, start), np.append(floors, floor)
            recent = np.flatnonzero(rising_times >= started)[-RAPID_POINTS:]
            rapid = self._even_rise(scale.width, rising_times[recent], rising_floors[recent], level)
            if rapid is not None and len(recent) == RAPID_POINTS:
                # It has risen since the first of the unbroken run of higher floors.
                first = int(recent[0])
                while (
                    first > 0
                    and rising_times[first - 1] >= started
                    and rising_floors[first - 1] < rising_floors[first]
                ):
                    first -= 1
                analysis.rapid.append(replace(rapid, since=float(rising_times[first])))
        if len(scale.means) < self.thresholds.min_points:
            return analysis
        smallest_jump = max(self.thresholds.min_growth_bytes * 4, 0.005 * level)
        splits = level_jumps(floors, min_jump=smallest_jump, k=4.0)
        for i in splits:
            analysis.jumps.append((float(times[i]), float(floors[i] - floors[i - 1])))
        # Floors are lowest readings: the window a rise fell into keeps the old floor, so the
        # first floor past a jump is already the new level's (a fall's window has the new
        # floor itself). The segment starts there.
        start = splits[-1] if splits else 0
        # Narrow scales are urgent only as rapid growth: a rise must still be even now.
        buckets = [(times >= warm_until, analysis.settled)]
        if scale.width > RAPID_MAX_WIDTH:
            buckets.append((times >= started, analysis.fast))
        for subset, bucket in buckets:
            idx = np.arange(start, len(floors))
            if subset is not None:
                idx = idx[subset[start:]]
            if len(idx) < self.thresholds.min_points:
                continue
            if bucket is analysis.fast:
                analysis.fast_tested.add(scale.width)
            slope, _ = theil_sen(times[idx], floors[idx])
            if not slope > 0:
                continue
            # The small-sample autocorrelation estimate is too unstable below ~16 points.
            test = mann_kendall(floors[idx], lag1_correction=len(idx) >= 16)
            if test.p < self.thresholds.alpha:
                half = len(idx) // 2
                older_slope, _ = theil_sen(times[idx[:half]], floors[idx[:half]])
                newer_slope, _ = theil_sen(times[idx[half:]], floors[idx[half:]])
                since = float(times[idx[0]])
                half_span = (times[idx[-1]] - times[idx[0]]) / 2
                decay = _decay(older_slope, newer_slope, half_span)
                bucket.append(Trend(scale.width, slope, test.p, level, since, len(idx), decay))
        return analysis

    def _even_rise(
        self, width: float, times: np.ndarray, floors: np.ndarray, level: float
    ) -> Trend | None:
        """A rise of contiguous windows' floors that is material, even (every window higher,
        none by a jump) and keeps its pace (the newer windows rise at least ``SLOWING`` of
        the older ones' rate): the shape of a leak, not of a level that settles."""
        if len(floors) < 3 or np.any(np.diff(times) > 2 * width):
            return None
        rises = np.diff(floors)
        if (
            not np.all(rises > 0)
            or floors[-1] - floors[0] < self.thresholds.min_growth_bytes
            or rises.max() > RAPID_EVEN * rises.min()
        ):
            return None
        older, _ = theil_sen(times[:3], floors[:3])
        newer, _ = theil_sen(times[-3:], floors[-3:])
        if newer < SLOWING * older:
            return None
        slope, _ = theil_sen(times, floors)
        p = mann_kendall(floors).p
        return Trend(width, slope, p, level, float(times[0]), len(floors), math.inf)

    def evaluate(self, now: float) -> Evaluation:
        findings: list[Finding] = []
        score = 0.0
        for labels, state in self._signals.items():
            analysis = self.trends(state)
            limit = self.limit_for(labels)
            finding, signal_score = self._judge(labels, analysis, limit, now, state)
            score = max(score, signal_score)
            if finding is not None:
                findings.append(finding)
            findings.extend(self._jump_findings(labels, analysis.jumps))
        return Evaluation(score, tuple(findings))

    def _judge(
        self,
        labels: Labels,
        analysis: Analysis,
        limit: float,
        now: float,
        state: _Signal,
    ) -> tuple[Finding | None, float]:
        # Urgent: growth that reaches the limit within the horizon, projected with the
        # slowing seen, and rising at every wider scale that could test it too (a GC
        # cycle's rising half fills a narrow window but not a wide one).
        # Rapid growth, judged on a few narrow windows in any phase after start-up, needs
        # no wider scale's word: its evenness and pace are the evidence.
        horizon = self.thresholds.fast_horizon
        rising = {t.width for t in analysis.fast}
        urgent = [
            t
            for t in analysis.fast
            if t.time_to(limit) < horizon
            and all(w in rising for w in analysis.fast_tested if w > t.width)
        ]
        urgent += [t for t in analysis.rapid if t.time_to(limit) < horizon]
        # A leak: a material trend in wide windows (10-minute means), held for
        # ``min_span``; narrower windows see the rising half of GC or caching cycles.
        worth = [
            t
            for t in analysis.settled
            if t.width >= self.thresholds.settled_min_width
            and self._materiality(t) >= 1
            and t.points * t.width >= self.thresholds.min_span
        ]
        candidates = urgent or worth
        if not candidates:
            return None, max((self._materiality(t) for t in analysis.settled), default=0.0)
        # The widest scale that sees it: the most evidence, the steadiest slope.
        trend = max(candidates, key=lambda t: t.width)
        remaining = trend.time_to(limit)
        # Critical when the limit comes before the run likely ends: it has run this long,
        # so assume it goes on as long again.
        expected_end = max(horizon, now - state.first_t)
        severity = Severity.CRITICAL if remaining < expected_end else Severity.WARNING
        finding = self._finding(labels, trend, limit, severity)
        return finding, 1.0 + (1.0 if severity is Severity.CRITICAL else 0.0)

    def _finding(
        self, labels: Labels, trend: Trend, limit: float, severity: Severity, *, ended: bool = False
    ) -> Finding:
        where = "".join(f" {v}" for _, v in labels)
        per_hour = trend.slope * 3600
        remaining = trend.time_to(limit)
        if ended:
            message = (
                f"{self.what}{where} grew steadily by {human_bytes(per_hour)}/h from about "
                f"{clock(trend.since)} until the run ended (to {human_bytes(trend.level)}, "
                f"{trend.points} windows of {trend.width:g} s, Mann-Kendall p={trend.p:.1g})"
            )
            if math.isfinite(remaining):
                message += (
                    f"; had it gone on, it would have reached its limit of {human_bytes(limit)} "
                    f"in {human_seconds(remaining)}"
                )
        else:
            message = (
                f"{self.what}{where} is growing by {human_bytes(per_hour)}/h since about "
                f"{clock(trend.since)} (now {human_bytes(trend.level)}, "
                f"Mann-Kendall p={trend.p:.1g})"
            )
            if math.isfinite(remaining):
                message += (
                    f"; at this rate it reaches its limit of {human_bytes(limit)} in "
                    f"{human_seconds(remaining)}"
                )
        advice, extra_evidence = self.explain(trend)
        message += ". " + advice
        evidence: dict[str, float | str] = {
            "slope_bytes_per_hour": per_hour,
            "level_bytes": trend.level,
            "p_value": trend.p,
            "window_seconds": trend.width,
            "seconds_to_limit": remaining,
        }
        if math.isfinite(limit):
            evidence["limit_bytes"] = limit
        if ended:
            evidence["judged_at_end"] = "whole run"
        evidence.update(extra_evidence)
        return Finding(self.name, severity, trend.since, message, evidence)

    # -- the end of a run --------------------------------------------------------------

    def conclude(self, now: float) -> Evaluation:
        """The live verdict, and for a signal without one, growth over the whole run since
        start-up that no live window could judge yet (too few windows, the window still
        open): stated when it is steady (no single jump, no levelling off) and material."""
        findings: list[Finding] = []
        score = 0.0
        for labels, state in self._signals.items():
            analysis = self.trends(state)
            limit = self.limit_for(labels)
            finding, signal_score = self._judge(labels, analysis, limit, now, state)
            if finding is None:
                trend = self._whole_run(state, now)
                if trend is not None:
                    finding = self._finding(labels, trend, limit, Severity.WARNING, ended=True)
                    signal_score = 1.0
            score = max(score, signal_score)
            if finding is not None:
                findings.append(finding)
            findings.extend(self._jump_findings(labels, analysis.jumps))
        return Evaluation(score, tuple(findings))

    def _whole_run(self, state: _Signal, now: float) -> Trend | None:
        """Steady, material growth since start-up over every window kept, the open one too,
        at the narrowest scale whose windows reach back to it (else the one with the most
        windows since). A run that ended within its start-up climb is judged on the newer
        half of its windows, for growth that adds ``CONCLUDE_UNSETTLED_SHARE`` there (a
        start-up's climb slows after its first jump; a leak does not)."""
        started = self.training_start(state)
        min_share = CONCLUDE_MIN_SHARE
        if started > now:  # the climb never settled
            started = state.first_t
            min_share = CONCLUDE_UNSETTLED_SHARE
        best: list[tuple[float, float, float, int]] = []
        width = math.nan
        for scale in state.scales:
            windows = scale.windows(with_open=True)
            since = [w for w in windows if w[0] >= started]
            # The first and the open window may hold part of theirs: judge the others.
            inner = windows[1:-1] or windows
            if not windows or statistics.median(w[3] for w in inner) < MIN_READINGS:
                continue
            if len(since) >= CONCLUDE_MIN_POINTS and windows[0][0] <= started:
                best, width = since, scale.width
                break
            if len(since) > len(best):
                best, width = since, scale.width
        # The growth ends where it stopped: a job that stopped training lingers a while.
        if len(best) > 2:
            typical = float(np.median(np.diff([w[2] for w in best])))
            while len(best) > 1 and best[-1][2] - best[-2][2] <= CONCLUDE_PACE * typical:
                best = best[:-1]
        if min_share == CONCLUDE_UNSETTLED_SHARE:  # within start-up: its newer half only
            best = best[-max(CONCLUDE_MIN_POINTS, (len(best) + 1) // 2) :]
        if len(best) < CONCLUDE_MIN_POINTS:
            return None
        times = np.array([w[0] for w in best])
        floors = np.array([w[2] for w in best])
        rises = np.diff(floors)
        grown = floors[-1] - floors[0]
        # A single jump is never growth: it holds most of the rise (of two rises, 3x the other).
        lumpy = (
            rises.max() > RAPID_EVEN * rises.min()
            if len(rises) < 3
            else rises.max() > CONCLUDE_JUMP_SHARE * grown
        )
        least = 4 * self.thresholds.min_growth_bytes
        if min_share == CONCLUDE_UNSETTLED_SHARE:
            least = CONCLUDE_UNSETTLED_BYTES  # more than the interpreter and its libraries
        if grown < max(least, min_share * floors[0]) or lumpy:
            return None
        test = mann_kendall(floors)
        if len(floors) < CONCLUDE_MK_POINTS and not np.all(rises > 0):
            return None
        if len(floors) >= CONCLUDE_MK_POINTS and not test.p < CONCLUDE_ALPHA:
            return None
        half = len(floors) // 2
        older, _ = theil_sen(times[: half + 1], floors[: half + 1])
        newer, _ = theil_sen(times[half:], floors[half:])
        if newer < CONCLUDE_PACE * older:
            return None  # levelling off: a start-up's tail, a cache filling
        slope, _ = theil_sen(times, floors)
        return Trend(width, slope, test.p, best[-1][1], float(times[0]), len(floors), math.inf)

    def _materiality(self, trend: Trend) -> float:
        """Growth over the tested window relative to the smallest worth reporting."""
        grown = trend.slope * trend.points * trend.width
        return grown / max(
            self.thresholds.min_growth_bytes, self.thresholds.min_growth * trend.level
        )

    def _jump_findings(self, labels: Labels, jumps: list[Jump]) -> list[Finding]:
        findings = []
        for t, size in jumps:
            if size <= 0:
                continue
            where = "".join(f" {v}" for _, v in labels)
            findings.append(
                Finding(
                    "memory_step",
                    Severity.INFO,
                    t,
                    f"{self.what}{where} jumped by {human_bytes(size)} at {clock(t)} and then "
                    "stayed flat: a one-off allocation (a bigger batch, a cache, a checkpoint "
                    "buffer), not a leak.",
                    {"jump_bytes": size, "signal": self.signal},
                )
            )
            break  # the newest jump is enough
        return findings

    def explain(self, trend: Trend) -> tuple[str, dict[str, float | str]]:
        """What to try, and evidence of the cause; subclasses that can tell more, do."""
        return (
            "Take two heap snapshots some minutes apart (tracemalloc, memray) and compare, "
            "or run it under driftwatch run to let the hook tell tensors from Python state."
        ), {}


def _covering(scales: Iterable[WindowMeans], since: float) -> list[tuple[float, float]]:
    """(start, floor) since ``since``, the window still filling included (a leak found
    within seconds has few windows behind it), from the narrowest scale that reaches back
    that far with at least 4 windows (probes may be sparser than the windows), else the one
    with the most windows since then."""
    best: list[tuple[float, float]] = []
    for means in sorted(scales, key=lambda m: m.width):
        windows = means.windows(with_open=True)
        points = [(t, floor) for t, _, floor, _ in windows if t >= since]
        if len(points) >= 4 and windows[0][0] <= since:
            return points
        if len(points) > len(best):
            best = points
    return best


class HostMemoryDetector(MemoryDriftDetector):
    """Host RSS drift, with the likely leak class from how TF memory and tracing behave.

    TF allocator memory is kept at the same scales as RSS, so the class is judged over the
    window that found the trend, whether that is seconds or hours. Retracing shows as the
    hook's tracing count or, without the hook (custom loops), TF's retracing warnings.
    """

    def __init__(self, thresholds: MemoryThresholds = MemoryThresholds()) -> None:
        super().__init__(
            "rss_bytes", "host_memory_drift", "host memory (RSS)", "memory_limit_bytes", thresholds
        )
        self.series = self.series | {
            "tf_allocator_current_bytes",
            "tracing_count",
            "retracing_warnings_total",
        }
        self._tf: dict[Labels, dict[float, WindowMeans]] = {}
        self._traces: dict[str, deque[tuple[float, float]]] = {
            "tracing_count": deque(maxlen=4096),
            "retracing_warnings_total": deque(maxlen=1),
        }

    def observe(self, sample: Sample) -> None:
        if sample.series == "tf_allocator_current_bytes":
            scales = self._tf.get(sample.labels)
            if scales is None:
                scales = self._tf[sample.labels] = {
                    w: WindowMeans(w, self.thresholds.points) for w in self.thresholds.scales
                }
            for means in scales.values():
                means.add(sample.t, sample.value)
        elif sample.series in self._traces:
            self._traces[sample.series].append((sample.t, sample.value))
        else:
            super().observe(sample)

    def _retraced(self, since: float) -> bool:
        """Whether the train function was traced again since ``since``, or TF ever warned
        of frequent retracing: it warns at most twice per function, early on, however
        long the retracing goes on (``FREQUENT_TRACING_WARNING_MAX_WARNING_PER_DETECTOR``)."""
        counts = self._traces["tracing_count"]
        traces = [c for t, c in counts if t >= since]
        if len(traces) >= 2 and traces[-1] - traces[0] >= 2:
            return True
        warnings = self._traces["retracing_warnings_total"]
        return bool(warnings) and warnings[-1][1] > 0

    def leak_class(self, trend: Trend) -> tuple[str, str, float]:
        """(class, advice, TF allocator slope in bytes/s or NaN) from TF allocator memory
        and tracing over ``trend``'s window."""
        tf_rising = False
        tf_known = False
        tf_slope = math.nan  # the steepest device's
        for scales in self._tf.values():
            points = _covering(scales.values(), trend.since)
            if len(points) >= 4:  # at most ``points`` means: cheap
                tf_known = True
                times = np.array([t for t, _ in points])
                values = np.array([m for _, m in points])
                slope, _ = theil_sen(times, values)
                tf_slope = max(slope, tf_slope) if math.isfinite(tf_slope) else slope
                keeps_pace = slope >= TF_SHARE_OF_LEAK * trend.slope
                tf_rising = tf_rising or (keeps_pace and mann_kendall(values).p < TF_RISE_P)
        if tf_rising:
            return (
                "tensors_kept_alive",
                (
                    "TensorFlow's own allocator grows with it: tensors are being kept alive, "
                    "e.g. outputs or losses appended to a Python list, or a tf.Variable/metric "
                    "that accumulates, or whole models kept alive (models built in a loop: "
                    "keras.backend.clear_session() between them). Keep Python floats "
                    "(loss.numpy()) instead of tensors."
                ),
                tf_slope,
            )
        if self._retraced(trend.since):
            return (
                "retracing",
                (
                    "TensorFlow allocator memory is flat while the train function keeps being "
                    "retraced: each trace keeps a new graph alive. Pass tensors, not Python "
                    "numbers, to tf.function (tf.constant(lr)), or give it an input_signature; "
                    "use reduce_retracing=True for varying shapes."
                ),
                tf_slope,
            )
        if tf_known:
            return (
                "framework_state",
                (
                    "TensorFlow allocator memory and tracing are flat: Python or framework "
                    "state grows, e.g. models or layers built in a loop without "
                    "keras.backend.clear_session(), histories or caches that keep growing, or "
                    "allocator fragmentation (try TCMALLOC or jemalloc)."
                ),
                tf_slope,
            )
        if self._tf:
            advice = (
                "TensorFlow's allocator has not been probed over this window yet: the likely "
                "class follows once it has."
            )
        elif self._traces["tracing_count"]:  # the hook runs: the allocator keeps no statistics
            advice = (
                "TensorFlow's allocator keeps no statistics here (its CPU allocator does not "
                "by default; driftwatch run --cpu-allocator-stats turns them on), so tensors "
                "cannot be told from Python state: compare two tracemalloc snapshots."
            )
        else:
            advice = (
                "Without the in-process hook driftwatch cannot tell tensors from Python state: "
                "run the job under driftwatch run, or compare two tracemalloc snapshots."
            )
        return "unknown", advice, tf_slope

    def explain(self, trend: Trend) -> tuple[str, dict[str, float | str]]:
        leak_class, advice, tf_slope = self.leak_class(trend)
        evidence: dict[str, float | str] = {"leak_class": leak_class}
        if math.isfinite(tf_slope):
            evidence["tf_allocator_slope_bytes_per_hour"] = tf_slope * 3600
        return advice, evidence


class AllocatorMemoryDetector(MemoryDriftDetector):
    """TensorFlow allocator memory, judged against its device's limit: a GPU's total memory
    (NVML's ``gpu`` index matched to TensorFlow's ``GPU:<index>``), else the process's
    memory limit (a CPU device allocates host memory)."""

    def __init__(self, thresholds: MemoryThresholds = MemoryThresholds()) -> None:
        super().__init__(
            "tf_allocator_current_bytes",
            "tf_memory_drift",
            "TensorFlow allocator memory",
            "memory_limit_bytes",
            thresholds,
        )
        self.series = self.series | {"gpu_memory_total_bytes"}
        self._gpu_totals: dict[str, float] = {}

    def observe(self, sample: Sample) -> None:
        if sample.series != "gpu_memory_total_bytes":
            super().observe(sample)
        elif math.isfinite(sample.value) and sample.value > 0:
            self._gpu_totals[dict(sample.labels).get("gpu", "")] = sample.value

    def limit_for(self, labels: Labels) -> float:
        kind, _, index = dict(labels).get("device", "").rpartition(":")
        if kind.upper().endswith("GPU"):
            return self._gpu_totals.get(index, math.nan)
        return super().limit_for(())


def memory_detectors() -> list[Detector]:
    """Host RSS, TensorFlow allocator and GPU process memory drift detectors."""
    return [
        HostMemoryDetector(),
        AllocatorMemoryDetector(),
        MemoryDriftDetector(
            "gpu_process_memory_bytes",
            "gpu_memory_drift",
            "GPU memory of the process",
            "gpu_memory_total_bytes",
        ),
    ]
