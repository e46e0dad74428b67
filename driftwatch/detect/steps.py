"""Step-time detectors: slowdowns (gradual or abrupt), periodic stalls, slow callbacks.

Raw per-step times are heavy-tailed and autocorrelated, with checkpoint and validation
spikes: detectors on them drown in false alarms. So steps are first reduced to block
medians (100 steps, or fewer when steps are slow), and only those are tested.
"""

from __future__ import annotations

import bisect
import itertools
import math
import statistics
from collections import deque

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

from driftwatch.detect import Evaluation
from driftwatch.detect.stats import (
    MEDIAN_EFFICIENCY,
    Cusum,
    FloatArray,
    RunningMedianBlocks,
    ess_variance_factor,
    mann_kendall,
    rank_sum_greater,
    robust_scale,
    theil_sen,
)
from driftwatch.findings import Finding, Severity
from driftwatch.series import Sample
from driftwatch.units import clock, human_seconds

WORTH_REPORTING = 1.10
"""The smallest sustained slowdown worth a warning: 10 %."""
LEAST_REPORTED = 1.075
"""The CUSUM may sum up a long, smaller excess (a slow healthy wander of a few percent): it
reports only once the current level is this much slower than the baseline, plus the
baseline's own uncertainty (``BASELINE_Z`` standard errors, up to ``ERROR_BAR``)."""
BASELINE_Z = 3.0
"""Standard errors of the baseline added to the bar: a baseline drawn from a noisy or
autocorrelated first half hour is uncertain by a few percent, and a bar that ignores this
is crossed by healthy runs whose baseline happened to be low; capped by ``ERROR_BAR``."""
ERROR_BAR = 1.5
"""The highest the baseline's error may lift the bar. A disturbed start (a host busy, then
idle) gives a short run autocorrelated blocks whose error alone set a bar of 3.1x, under
which CI missed a 2.2x slowdown; a cap at the slowest block of the baseline (1.1-1.2x for
sub-millisecond steps) let a healthy 40-s run's drift of 1.13-1.27x be reported half the
time. Half again as slow, held until the sum is past ``h``, is worth a warning whatever the
baseline's uncertainty."""
FIRST_CHUNK_BAR = 1.4
"""The least a slowdown must reach while the baseline rests on its first chunk alone: the
run has shown nothing of its own wander yet, and on a shared host a healthy 40-s run of
sub-millisecond steps drifted by 1.13-1.32x (CI here), while injected slowdowns of short
runs are 2x or more (the 3x within seconds of issue 4)."""
WANDER_Z = 4.5
"""Standard deviations of the level's healthy variation the current level must also exceed.
A run whose level wanders by 2 % (hours-long mean reversion) sits 8 % above its day-long
baseline for an hour now and then. Over 540 days of the bench's ``healthy_wander`` on
other seeds (judged at every block) a bar at ``LEAST_REPORTED`` alone gave 0.14 false
findings a day, this one 0.033 (4 deviations: about 0.06); what is left are excursions well
beyond what the run had shown before, which no bar under the 10 % worth reporting can tell
from a slowdown. More than 4.5 starts to miss +10 %-over-4-hours ramps and to delay the
+10 % step at 20 Hz."""
MIN_WANDER_CHUNKS = 4
"""Chunks that must have joined the baseline before their dips estimate the wander."""
RECENT_BLOCKS = 5
"""Blocks whose median is the recent ratio (ends a report; smooths the onset search)."""
CLIMB_SMOOTHING = 2 * RECENT_BLOCKS - 1
"""Blocks in the running median that tells a climb's start and end."""
LEVEL_BLOCKS = 30
"""Most blocks since the onset that estimate the current level."""
STILL_SLOW = 1 + (LEAST_REPORTED - 1) / 2
"""A reported slowdown ends once the recent blocks fall back below this ratio."""
MIN_BLOCK_SECONDS = 1.0
"""A block spans about this much wall time at least: with sub-millisecond steps, 100 steps
last less than a burst of scheduler contention, which would then look like a slowdown."""
MAX_SUB_BLOCKS = 256
"""Bounds the sub-blocks merged into one block (a clock that jumps back never closes one)."""
WHOLE_RUN_BLOCKS = 240
"""Blocks a run may have for its end to judge all of them (longer runs have a baseline)."""
WHOLE_RUN_SKIP_BLOCKS = 1
"""First blocks of a run that its end leaves out (the first steps trace the function)."""
WHOLE_RUN_MIN_BLOCKS = 8
"""Blocks a run needs for its end to judge a slowdown over all of it."""
WHOLE_RUN_BAR = 2.0
"""Ratio of the fitted last to first block time that the end of a short run reports."""
WHOLE_RUN_ALPHA = 0.001
"""Level at which the blocks of a short run rise steadily (Mann-Kendall) or step up (rank sum,
over all the splits tried)."""
WHOLE_RUN_STEP_BAR = 1.5
"""Ratio of a short run's slower last blocks to the blocks just before them that its end
reports as a step."""
WHOLE_RUN_STEP_BLOCKS = 8
"""Blocks that a step's slower last stretch, and the stretch before it, last at least."""
WHOLE_RUN_BEFORE_BLOCKS = 12
"""Most blocks just before a step that give the level it stepped up from."""
WHOLE_RUN_STEP_RISE = 0.25
"""Share of a step (log) by which the blocks after it may still rise, for it to be a step."""
BASELINE_CHUNKS = 48
"""Chunk medians the baseline keeps: with 30 blocks a chunk, a day of 1-s steps."""


class SlowdownDetector:
    """One-sided CUSUM of log block-median step time against the run's own baseline.

    When steps are fast, consecutive block medians are merged (their median) until a block
    spans ``MIN_BLOCK_SECONDS``. The first ``warmup_blocks`` blocks (tracing, caches filling)
    are skipped. The baseline is the median of chunk medians: chunks of ``baseline_blocks``
    blocks (testing starts once ``min_baseline_blocks`` of the first are in, so short runs
    are watched too), the newest ``BASELINE_CHUNKS``. The first chunk takes the blocks that
    come while the sum is not past ``h`` (a start that settles slowly is followed); later
    ones take a block only once the sum has cleared it (:meth:`_clear_for_baseline`). So
    the baseline gets more precise as the run goes on (a slow wander averages out instead
    of staying frozen in the first half hour) and a slowdown does not join it.

    Each block adds ``log(block / baseline) - k``, capped at ``h / 2`` so that no single odd
    block (a checkpoint and a slow first step of an epoch closed into one) can alarm alone.
    ``k`` is half the log of the slowdown worth reporting, or the first chunk's own noise if
    larger; ``h`` grows with that noise too. The last time the sum was zero estimates the
    onset. A slowdown is reported while the sum is past ``h`` and the current level (the
    Theil-Sen line through the blocks since the onset, at the newest one: a ramp's median
    lags) passes the bar (:meth:`_bar`): ``LEAST_REPORTED`` times the baseline plus its
    uncertainty (up to ``ERROR_BAR``; ``FIRST_CHUNK_BAR`` at least while the baseline has
    only its first chunk), and ``WANDER_Z`` standard deviations of the level's
    healthy variation. That variation is estimated from how far chunk medians fell below
    the baseline as they joined it (a slowdown only makes chunks slower, so a ramp that
    partly joins the baseline does not inflate it), plus the current level's own error. It
    is gradual when the level took longer than ``RECENT_BLOCKS`` blocks to climb from a
    quarter to three quarters of the current ratio, abrupt when it jumped.
    """

    name = "slowdown"
    series = frozenset({"step_seconds"})

    def __init__(
        self,
        block: int = 100,
        block_seconds: float = 60.0,
        min_block: int = 20,
        warmup_blocks: int = 5,
        min_baseline_blocks: int = 10,
        baseline_blocks: int = 30,
        threshold: float = 0.2,
    ) -> None:
        self._blocks = RunningMedianBlocks(block, max_seconds=block_seconds, min_size=min_block)
        self._sub_blocks: list[float] = []  # log medians of the sub-blocks of the open block
        self._last_block_t = -math.inf
        self._warmup_left = warmup_blocks
        self._run_levels: list[tuple[float, float]] = []  # (t, log level), short runs
        self._run_blocks = 0  # blocks closed, all of them
        self._chunk: list[float] = []  # log levels of the chunk being filled
        self._held: deque[float] = deque()  # log levels waiting for the sum to clear them
        self._chunks: deque[float] = deque(maxlen=BASELINE_CHUNKS)  # medians of the newest chunks
        # their squared log distance below the baseline as they joined it (0 if above)
        self._dips: deque[float] = deque(maxlen=BASELINE_CHUNKS)
        self._min_baseline = min_baseline_blocks
        self._chunk_size = baseline_blocks
        self._threshold = threshold
        self.baseline = math.nan
        self._noise = 0.0  # robust scale of the first chunk's blocks
        self._variance_factor = 1.0  # their autocorrelation's n / n*
        self._cusum = Cusum(k=math.log(WORTH_REPORTING) / 2, h=threshold)
        self._recent: deque[tuple[float, float]] = deque(maxlen=512)  # (t, log ratio)
        self._since_onset = 0  # blocks since the sum last left zero
        self._active = False  # hysteresis: on above h, off below h / 3
        self._gradual = False  # the kind, decided when the report starts
        self._since = math.nan  # and since when

    def observe(self, sample: Sample) -> None:
        block = self._blocks.add(sample.value, sample.t)
        if block is None or not block[0] > 0:
            return
        t = block[1]
        self._sub_blocks.append(math.log(block[0]))
        # Close at the whole number of sub-blocks nearest to MIN_BLOCK_SECONDS: 100 steps of
        # 10 ms span a second give or take, and must not be merged in pairs half the time.
        span, merged = t - self._last_block_t, len(self._sub_blocks)
        if span + span / (2 * merged) < MIN_BLOCK_SECONDS and merged < MAX_SUB_BLOCKS:
            return
        level = statistics.median(self._sub_blocks)
        self._sub_blocks.clear()
        self._last_block_t = t
        self._run_blocks += 1
        if WHOLE_RUN_SKIP_BLOCKS < self._run_blocks <= WHOLE_RUN_BLOCKS:
            self._run_levels.append((t, level))
        if self._warmup_left > 0:
            self._warmup_left -= 1
            return
        if math.isnan(self.baseline):
            self._add_to_baseline(level)
            return
        ratio = level - math.log(self.baseline)
        self._cusum.update(min(ratio, self._cusum.h / 2), t)
        self._recent.append((t, ratio))
        self._since_onset = 0 if self._cusum.value == 0.0 else self._since_onset + 1
        if self._cusum.alarm and self._current_ratio() >= self._bar():
            if not self._active:
                self._start_report()
            self._active = True
        elif self._cusum.value < self._cusum.h / 3 or self._recent_ratio() < STILL_SLOW:
            self._active = False
        self._clear_for_baseline(level)

    def _clear_for_baseline(self, level: float) -> None:
        """Past the first chunk, let a block join the baseline once the sum has cleared it: at
        once at a zero sum; held while the sum is up, and joining when it is back at zero;
        dropped, with those held, while a slowdown is reported (they are its onset: a
        slowdown must not raise its own baseline). A sum that stays up with no report lets
        its oldest held block join after a chunk's worth, so a lasting small excess is
        followed."""
        if not self._chunks:  # the first chunk follows the start, unless already past h
            if not self._cusum.alarm:
                self._add_to_baseline(level)
            return
        held = self._held
        if self._active:
            held.clear()
            return
        held.append(level)
        if self._cusum.value == 0.0:
            while held:
                self._add_to_baseline(held.popleft())
        elif len(held) > self._chunk_size:
            self._add_to_baseline(held.popleft())

    def _add_to_baseline(self, level: float) -> None:
        """Fill the chunk; the first one sets the baseline and the noise as it grows."""
        chunk = self._chunk
        first = not self._chunks
        chunk.append(level)
        if first and len(chunk) >= self._min_baseline:
            levels = np.array(chunk)
            self._noise = robust_scale(levels)
            self._variance_factor = ess_variance_factor(levels)[0]
            self._cusum.k = max(math.log(WORTH_REPORTING) / 2, self._noise)
            self._cusum.h = max(self._threshold, 6 * self._noise)
            self.baseline = math.exp(float(np.median(levels)))
        if len(chunk) < self._chunk_size:
            return
        median = float(np.median(chunk))
        if self._chunks:
            self._dips.append(min(0.0, median - math.log(self.baseline)) ** 2)
        self._chunks.append(median)
        self.baseline = math.exp(float(np.median(self._chunks)))
        chunk.clear()

    def _bar(self) -> float:
        """The ratio the current level must reach: ``LEAST_REPORTED`` plus ``BASELINE_Z``
        standard errors of the baseline's median (up to ``ERROR_BAR``; ``FIRST_CHUNK_BAR``
        at least before the first chunk is complete), and at least ``WANDER_Z`` standard
        deviations of what a healthy level does: its wander (twice the mean squared dip of
        the chunks below the baseline, the lower half of a symmetric spread; it holds their
        measurement noise too) plus the current level's own error."""
        noise = self._noise * math.sqrt(self._variance_factor)
        blocks = max(len(self._chunks), 1) * self._chunk_size
        error = BASELINE_Z * MEDIAN_EFFICIENCY * noise / math.sqrt(blocks)
        bar = math.log(LEAST_REPORTED) + min(error, math.log(ERROR_BAR / LEAST_REPORTED))
        if not self._chunks:
            return math.exp(max(bar, math.log(FIRST_CHUNK_BAR)))
        if len(self._dips) < MIN_WANDER_CHUNKS:
            return math.exp(bar)
        wander = 2 * sum(self._dips) / len(self._dips)
        n = self._level_count()
        # A median's error, or a least-squares line's at its last point (Theil-Sen is
        # nearly as efficient): sigma^2 / n * (1 + 3 (n - 1) / (n + 1)).
        spread = MEDIAN_EFFICIENCY**2 if n < 10 else (4 * n - 2) / (n + 1)
        level = noise**2 * spread / n
        return math.exp(max(bar, WANDER_Z * math.sqrt(wander + level)))

    def _recent_ratio(self) -> float:
        """Median ratio of the newest ``RECENT_BLOCKS`` blocks."""
        recent = [x for _, x in itertools.islice(reversed(self._recent), RECENT_BLOCKS)]
        return math.exp(float(np.median(recent)))

    def _current_ratio(self) -> float:
        """The level now, from the blocks since the onset (``RECENT_BLOCKS`` to
        ``LEVEL_BLOCKS``): their median, or with ten or more, their Theil-Sen line's value at
        the newest block."""
        count = self._level_count()
        levels = np.array([x for _, x in itertools.islice(reversed(self._recent), count)])
        if len(levels) < 10:
            return math.exp(float(np.median(levels)))
        index = np.arange(len(levels), 0, -1, dtype=np.float64)  # newest first
        slope, intercept = theil_sen(index, levels)
        return math.exp(intercept + slope * len(levels))

    def _level_count(self) -> int:
        """Blocks that estimate the current level."""
        return min(max(self._since_onset, RECENT_BLOCKS), LEVEL_BLOCKS, len(self._recent))

    def _climb(self, ratio: float) -> tuple[float, int]:
        """When the level last started to climb from a quarter of ``ratio`` (log units),
        and in how many blocks it then reached three quarters: a step takes a few, a ramp
        many. The level is the running median of ``CLIMB_SMOOTHING`` blocks, so that noise
        dips during a slow ramp do not pass for its start."""
        times = np.array([t for t, _ in self._recent])
        values = np.array([x for _, x in self._recent])
        padded = np.pad(values, (CLIMB_SMOOTHING - 1, 0), mode="edge")
        smooth = np.median(sliding_window_view(padded, CLIMB_SMOOTHING), axis=1)
        low = np.flatnonzero(smooth <= ratio / 4)
        start = int(low[-1]) if len(low) else -1
        high = np.flatnonzero(smooth[start + 1 :] >= 3 * ratio / 4)
        blocks = int(high[0]) + 1 if len(high) else len(smooth) - start
        return float(times[max(start, 0)]), blocks

    def _start_report(self) -> None:
        """Decide, once per report, whether the slowdown is gradual, and since when: a
        report that changed its kind as noise moves the climb would read as two problems."""
        climb_start, climb_blocks = self._climb(math.log(self._current_ratio()))
        onset = self._cusum.onset_t
        self._gradual = climb_blocks > RECENT_BLOCKS
        if onset is None or self._gradual:
            self._since = climb_start if onset is None else min(climb_start, onset)
        else:
            self._since = onset

    def evaluate(self, now: float) -> Evaluation:
        score = self._cusum.value / self._cusum.h
        if not self._active:
            return Evaluation(score)
        ratio = self._current_ratio()
        since = self._since
        current = self.baseline * ratio
        evidence: dict[str, float | str] = {
            "ratio": ratio,
            "baseline_step_seconds": self.baseline,
            "current_step_seconds": current,
            "onset": since,
        }
        severity = Severity.CRITICAL if ratio >= 2 else Severity.WARNING
        before, after = human_seconds(self.baseline), human_seconds(current)
        if self._gradual:
            message = (
                f"steps are getting slower: {ratio:.2f}x the baseline ({before} -> {after} per "
                f"step), rising gradually since about {clock(since)}. Likely causes: an input "
                "pipeline or cache that degrades, growing Python-side state per step (lists, "
                "metrics, summaries), retracing, memory pressure or thermal throttling. "
                "Compare a py-spy or TF Profiler trace from now with one from the start."
            )
            kind = "gradual_slowdown"
        else:
            message = (
                f"steps became {ratio:.2f}x slower around {clock(since)} ({before} -> {after} "
                "per step) and stayed there. Look at what changed then: "
                "a new data shard or augmentation, a learning-rate or mixed-precision switch, "
                "another job on the same device or host, a throttled disk or network."
            )
            kind = "abrupt_slowdown"
        return Evaluation(score, (Finding(kind, severity, since, message, evidence),))

    def conclude(self, now: float) -> Evaluation:
        """The live verdict; for a short run, a slowdown judged over all of it: a run of
        seconds has no baseline, and one whose start was slow (a busy host) has one too high.
        Its last blocks stepping up from those just before them (:meth:`_whole_run_step`,
        which also replaces a live finding of a smaller ratio), or else all its blocks rising
        steadily (:meth:`_whole_run_rise`)."""
        live = self.evaluate(now)
        if self._run_blocks > WHOLE_RUN_BLOCKS or len(self._run_levels) < WHOLE_RUN_MIN_BLOCKS:
            return live
        step = self._whole_run_step()
        if live.findings:  # a step measured from the blocks before it is the better estimate
            stepped = step.findings and _ratio(step) > _ratio(live)
            return Evaluation(max(live.score, step.score), step.findings) if stepped else live
        rise = self._whole_run_rise()
        score = max(live.score, step.score, rise.score)
        return Evaluation(score, step.findings or rise.findings)

    def _whole_run_step(self) -> Evaluation:
        """The split of the run's blocks after which all of them are slower (one-sided rank
        sum against up to ``WHOLE_RUN_BEFORE_BLOCKS`` just before, ``WHOLE_RUN_ALPHA`` over
        all the splits tried), reported when their median is ``WHOLE_RUN_STEP_BAR`` times
        theirs, they are level (their Theil-Sen line rises by less than
        ``WHOLE_RUN_STEP_RISE`` of the step: else the run is slowing, not stepped) and their
        last half is still that slow."""
        times = np.array([t for t, _ in self._run_levels])
        logs = np.array([level for _, level in self._run_levels])
        least = WHOLE_RUN_STEP_BLOCKS
        splits = range(least, len(logs) - least + 1)
        if not splits:
            return Evaluation(0.0)
        p, split = min(
            (rank_sum_greater(logs[max(0, s - WHOLE_RUN_BEFORE_BLOCKS) : s], logs[s:]), s)
            for s in splits
        )
        p = min(1.0, p * len(splits))
        before = float(np.median(logs[max(0, split - WHOLE_RUN_BEFORE_BLOCKS) : split]))
        after = logs[split:]
        ratio = math.exp(float(np.median(after)) - before)
        slope, _ = theil_sen(times[split:], after)
        still_rising = slope * (times[-1] - times[split])
        stayed = float(np.median(after[len(after) // 2 :])) - before
        score = ratio / WHOLE_RUN_STEP_BAR if p < WHOLE_RUN_ALPHA else 0.0
        if (
            p >= WHOLE_RUN_ALPHA
            or ratio < WHOLE_RUN_STEP_BAR
            or still_rising > WHOLE_RUN_STEP_RISE * math.log(ratio)
            or stayed < math.log(WHOLE_RUN_STEP_BAR)
        ):
            return Evaluation(min(score, 0.99))
        since = float(times[split])
        first, last = math.exp(before), math.exp(before) * ratio
        message = (
            f"steps became {ratio:.2f}x slower around {clock(since)} ({human_seconds(first)} -> "
            f"{human_seconds(last)} per step) and stayed there to the end of the run, judged "
            "over the whole run (too short, or started too slowly, for a baseline of its own). "
            "Look at what changed then: a new data shard or augmentation, a learning-rate or "
            "mixed-precision switch, another job on the same device or host, a throttled disk "
            "or network."
        )
        evidence: dict[str, float | str] = {
            "ratio": ratio,
            "baseline_step_seconds": first,
            "current_step_seconds": last,
            "onset": since,
            "judged_at_end": "whole run",
        }
        severity = Severity.CRITICAL if ratio >= 2 else Severity.WARNING
        finding = Finding("abrupt_slowdown", severity, since, message, evidence)
        return Evaluation(score, (finding,))

    def _whole_run_rise(self) -> Evaluation:
        """All the run's blocks rising steadily (Mann-Kendall at ``WHOLE_RUN_ALPHA``) to
        ``WHOLE_RUN_BAR`` times the first (their Theil-Sen line)."""
        levels = self._run_levels
        times = np.array([t for t, _ in levels])
        logs = np.array([level for _, level in levels])
        slope, intercept = theil_sen(times, logs)
        first = math.exp(intercept + slope * times[0])
        last = math.exp(intercept + slope * times[-1])
        ratio = last / first
        test = mann_kendall(logs)
        score = ratio / WHOLE_RUN_BAR if test.p < WHOLE_RUN_ALPHA else 0.0
        if ratio < WHOLE_RUN_BAR or test.p >= WHOLE_RUN_ALPHA:
            return Evaluation(min(score, 0.99))
        since = float(times[0])
        message = (
            f"steps got slower all through the run: {ratio:.2f}x from its first blocks to its "
            f"last ({human_seconds(first)} -> {human_seconds(last)} per step, Mann-Kendall "
            f"p={test.p:.1g}), too short or slowing too early for a baseline of its own. Likely "
            "causes: growing Python-side state per step (lists, metrics, summaries), an input "
            "pipeline or cache that degrades, retracing or memory pressure. Compare a py-spy "
            "or TF Profiler trace from late in the run with one from its start."
        )
        evidence: dict[str, float | str] = {
            "ratio": ratio,
            "baseline_step_seconds": first,
            "current_step_seconds": last,
            "onset": since,
            "judged_at_end": "whole run",
        }
        severity = Severity.CRITICAL if ratio >= 2 else Severity.WARNING
        finding = Finding("gradual_slowdown", severity, since, message, evidence)
        return Evaluation(score, (finding,))


def _ratio(evaluation: Evaluation) -> float:
    return float(evaluation.findings[0].evidence["ratio"])


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
    (the hook) or every step since the previous logged record (event files). The steps in
    it are the interval's wall time over that mean, when the interval is exactly theirs;
    when it is not (the hook left out validation or the start of a ``fit`` before it), the
    sample follows a pause the source already set apart and is not a stall. A sample is a
    stall when it stands out (``NOISE_Z`` standard deviations of the recent samples' lower
    tail above their lower quartile) and its interval lasted more than its steps at the
    typical step time (the median of the recent samples that do not stand out) by over
    ``STALL_FACTOR - 1`` typical steps: that excess is the stall's duration, wherever in
    the interval it fell. Stalls recur when most of their intervals, in samples, are within
    a tenth of the period or one sample (the resolution of the logging); the period in
    steps is that in samples times the steps per sample, as a sample checked at each
    refresh holds. Times that do not chain at all (a samples file on a coarse clock) are
    taken as one step per sample. See docs/detectors.md.
    """

    name = "periodic_stall"
    series = frozenset({"step_seconds"})

    def __init__(self, factor: float = STALL_FACTOR, min_stalls: int = 4, window: int = 64) -> None:
        self.factor = factor
        self.min_stalls = min_stalls
        self._recent: deque[float] = deque(maxlen=REFERENCE_SAMPLES)
        self._since_refresh = 0
        self._refreshed_t = -math.inf
        self._band = math.nan  # seconds per step: higher than this, a sample stands out
        self._typical = math.nan  # and the median of the recent samples below that
        self._last_t = math.nan
        self._samples = 0  # samples seen
        self._steps_per_sample = 1  # the last chained sample's, at a refresh
        self._chained_share = 1.0  # moving share of chained samples at the refreshes
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
        self._recent.append(value)
        self._since_refresh += 1
        if self._since_refresh >= REFERENCE_REFRESH or t - self._refreshed_t >= REFERENCE_SECONDS:
            self._refresh(value, interval, t)
        if value > self._band:
            self._stands_out(value, interval, t)

    def _stands_out(self, value: float, interval: float, t: float) -> None:
        """A sample above the band is a stall if its interval lasted more than its steps at
        the typical step time by over ``factor - 1`` typical steps, and it chains."""
        steps = self._steps_of(value, interval)
        usual = self._steps_per_sample
        if steps is None or steps > MAX_STEPS_JUMP * usual:
            if self._chained_share >= 0.5:
                return  # it follows time that no step accounts for
            steps = usual  # the times do not chain at all (a samples file on a coarse clock)
        excess = steps * (value - self._typical)
        if excess > (self.factor - 1) * self._typical:
            self._stalls.append((self._samples, t, excess))
            self._stalls_seen += 1

    @staticmethod
    def _steps_of(value: float, interval: float) -> int | None:
        """The steps of the interval a sample closes, if its time is exactly theirs (it
        chains to the previous sample); else None."""
        if not 0 < interval < math.inf:
            return None
        steps = round(interval / value) or 1
        if abs(interval - steps * value) > CHAIN_TOLERANCE * value + CLOCK_RESOLUTION:
            return None
        return steps

    def _refresh(self, value: float, interval: float, t: float) -> None:
        """From this sample, whether samples chain and how many steps they hold; from the
        recent samples (10 or more), the band and the typical step time."""
        steps = self._steps_of(value, interval)
        self._chained_share += ((steps is not None) - self._chained_share) / CHAIN_CHECKS
        if steps is not None:
            self._steps_per_sample = steps
        if len(self._recent) < 10:
            return
        ordered = sorted(self._recent)  # a hundred floats: sorted() beats numpy's quantiles
        low, quartile = ordered[len(ordered) // 20], ordered[len(ordered) // 4]
        self._band = quartile + NOISE_Z * (quartile - low) / LOWER_TAIL_SPREAD
        below = bisect.bisect_right(ordered, self._band)  # more than a quarter of them
        self._typical = (ordered[(below - 1) // 2] + ordered[below // 2]) / 2
        self._since_refresh = 0
        self._refreshed_t = t

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
        steps = period * self._steps_per_sample
        evidence: dict[str, float | str] = {
            "period_steps": steps,
            "period_seconds": every,
            "stall_seconds": stall,
            "share_of_wall_time": share,
            "steps_per_sample": float(self._steps_per_sample),
        }
        message = (
            f"about every {every:.1f} s ({steps:.0f} steps) training pauses for "
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


MIN_GAP_SECONDS = 0.001
"""Time outside the train step per step below which it is never reported (seconds)."""


class SlowCallbackDetector:
    """Time between train steps (other callbacks, input pipeline, host work) that takes a
    large or growing share of each step, and at least ``MIN_GAP_SECONDS``: a custom loop's
    own Python (fetching the next batch, calling the step) costs a few tenths of a
    millisecond, a large share of sub-millisecond steps. Needs the hook."""

    name = "slow_callbacks"
    series = frozenset({"step_seconds", "step_gap_seconds"})

    def __init__(self, share_threshold: float = 0.3, growth_threshold: float = 0.15) -> None:
        self.share_threshold = share_threshold
        self.growth_threshold = growth_threshold
        self._steps = RunningMedianBlocks(200, max_seconds=30.0, min_size=5)
        self._gaps = RunningMedianBlocks(200, max_seconds=30.0, min_size=5)
        self._step = math.nan
        self._gap = math.nan
        self._baseline_share = math.nan
        self._blocks_seen = 0
        self._since = math.nan

    def observe(self, sample: Sample) -> None:
        if sample.series == "step_seconds":
            block = self._steps.add(sample.value, sample.t)
            if block is None:
                return
            self._step = block[0]
            self._blocks_seen += 1
        else:
            block = self._gaps.add(sample.value, sample.t)
            if block is None:
                return
            self._gap = block[0]
            if self._blocks_seen == 3:  # after warm-up: the share to compare against
                self._baseline_share = self.share
        # The share changes only when a block closes.
        if math.isnan(self._since) and self.share >= self.share_threshold:
            self._since = sample.t

    @property
    def share(self) -> float:
        return self._gap / self._step if self._step > 0 else math.nan

    def evaluate(self, now: float) -> Evaluation:
        share = self.share
        if not math.isfinite(share):
            return Evaluation(0.0)
        grown = share - self._baseline_share if math.isfinite(self._baseline_share) else 0.0
        score = max(share / self.share_threshold, grown / self.growth_threshold)
        score *= min(1.0, self._gap / MIN_GAP_SECONDS)
        if score < 1:
            self._since = math.nan
            return Evaluation(score)
        since = self._since if math.isfinite(self._since) else now
        message = (
            f"{share:.0%} of each step ({human_seconds(self._gap)} of "
            f"{human_seconds(self._step)}) is spent outside the train step: in other "
            "callbacks, the input pipeline or host work"
        )
        if grown >= self.growth_threshold:
            message += f", up from {self._baseline_share:.0%} at the start"
        message += (
            ". Find the slow callback (per-batch logging, summaries, metrics computed in "
            "Python), prefetch the input pipeline (tf.data .prefetch(tf.data.AUTOTUNE)), or "
            "log less often."
        )
        evidence = {"share": share, "gap_seconds": self._gap, "step_seconds": self._step}
        finding = Finding("slow_callbacks", Severity.WARNING, since, message, evidence)
        return Evaluation(score, (finding,))
