"""Slowdowns of training steps, gradual or abrupt, against the run's own baseline.

Raw per-step times are heavy-tailed and autocorrelated, with checkpoint and validation
spikes: detectors on them drown in false alarms. So steps are first reduced to block
levels (100 steps, or fewer when steps are slow: their median, or for steps of a few
milliseconds the mean of all but the slowest tenth), and only those are tested. A short
run is also judged at its end over all its blocks (``driftwatch.detect.slowdown.end``).
A finding's message says how much slower and since when; its causes, the signals that moved
with it or else the usual ones, are the cause ranker's (``driftwatch.detect.causes``).
Reasoning: docs/slowdowns.md.
"""

from __future__ import annotations

import itertools
import math
from collections import deque
from dataclasses import replace

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

from driftwatch.detect import Evaluation
from driftwatch.detect.slowdown.blocks import StepBlocks
from driftwatch.detect.slowdown.end import (
    WHOLE_RUN_BLOCKS,
    WHOLE_RUN_MIN_BLOCKS,
    WHOLE_RUN_SKIP_BLOCKS,
    evaluation_ratio,
    whole_run_rise,
    whole_run_step,
)
from driftwatch.detect.stats import (
    MEDIAN_EFFICIENCY,
    Cusum,
    RunningBlocks,
    ess_variance_factor,
    robust_scale,
    theil_sen,
)
from driftwatch.findings import Finding, Severity
from driftwatch.series import Sample
from driftwatch.units import clock, human_seconds

WORTH_REPORTING = 1.10
"""The smallest sustained slowdown worth a warning: 10 %."""
LEAST_REPORTED = 1.075
"""Least ratio of the current level to the baseline reported, before the baseline's error."""
BASELINE_Z = 3.0
"""Standard errors of the baseline's median added to the bar (up to ``ERROR_BAR``)."""
ERROR_BAR = 1.5
"""Highest ratio to the baseline that the baseline's error may lift the bar to."""
FIRST_CHUNK_BAR = 1.4
"""Least ratio reported while the baseline rests on its first chunk alone."""
WANDER_Z = 4.5
"""Standard deviations of the level's healthy wander the current level must exceed."""
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
BASELINE_CHUNKS = 48
"""Chunk medians the baseline keeps: with 30 blocks a chunk, a day of 1-s steps."""
RESTEP_BAR = 1.5
"""Ratio of the recent level to the level a report stated that is judged as a new step."""
END_BLOCK_STEPS = 10
"""Steps in a sub-block of a short run's verdict at its end (merged like the live ones)."""
END_MAX_BLOCKS = 2 * WHOLE_RUN_BLOCKS
"""Most blocks a short run's end keeps: past it, they are merged in pairs, and made longer."""


class SlowdownDetector:
    """One-sided CUSUM of log block-level step time against the run's own baseline.

    A block's level is its median step; in a run whose first block's median is under
    ``SHORT_STEP_SECONDS``, the mean of its steps without the slowest
    ``SLOWEST_STEPS_LEFT_OUT`` (a busy host's scheduler makes such steps wait between
    time slices, on a few steps only). Blocks of fast steps are merged until one spans
    ``MIN_BLOCK_SECONDS`` (one that would span it alone is never merged), and the run's end
    closes its last one; the first ``warmup_blocks`` are skipped. The baseline is the
    median of chunk medians (the newest ``BASELINE_CHUNKS``): the first chunk follows the
    start while the sum is not past ``h``; later blocks join only once the sum has cleared
    them (:meth:`_clear_for_baseline`), so a slowdown does not raise its own baseline. Each
    block adds ``log(block / baseline) - k``, capped at ``h / 2``; the last zero of the sum
    estimates the onset (of a large step: :meth:`_step_onset`). A slowdown is reported
    while the sum is past ``h`` and the current level (the Theil-Sen line through the
    blocks since the onset, at the newest) passes :meth:`_bar`; it is gradual when the
    level took more than ``RECENT_BLOCKS`` blocks to climb from a quarter to three quarters
    of the ratio, abrupt when it jumped; a report whose level then steps up again by
    ``RESTEP_BAR`` is stated as that new, abrupt step (:meth:`_restep`). Reasoning:
    docs/slowdowns.md.
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
        self._blocks = StepBlocks(
            RunningBlocks(block, max_seconds=block_seconds, min_size=min_block), self._close_block
        )
        # A short run's end judges finer blocks, until the run has more than
        # WHOLE_RUN_BLOCKS live ones.
        end_steps = RunningBlocks(END_BLOCK_STEPS, block_seconds, min(min_block, END_BLOCK_STEPS))
        self._end_blocks: StepBlocks | None = StepBlocks(end_steps, self._add_run_level)
        self._warmup_left = warmup_blocks
        self._run_levels: list[tuple[float, float]] = []  # (t, log level) of the end's blocks
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
        self._since_step = LEVEL_BLOCKS  # blocks since a reported slowdown stepped up again
        self._stated = 1.0  # the ratio at which the report last decided its kind
        self._active = False  # hysteresis: on above h, off below h / 3
        self._gradual = False  # the kind, decided when the report starts (or steps again)
        self._since = math.nan  # and since when

    def observe(self, sample: Sample) -> None:
        if self._end_blocks is not None:  # first: the end leaves out the first block's steps
            self._end_blocks.add(sample.value, sample.t)
        self._blocks.add(sample.value, sample.t)

    def _add_run_level(self, level: float, t: float) -> None:
        """Keep a block of the end's for a short run's verdict (not those within its first
        ``WHOLE_RUN_SKIP_BLOCKS`` blocks), at most ``END_MAX_BLOCKS``."""
        if self._run_blocks < WHOLE_RUN_SKIP_BLOCKS:
            return
        levels = self._run_levels
        levels.append((t, level))
        if len(levels) > END_MAX_BLOCKS and self._end_blocks is not None:
            # Neighbours in pairs (the later end, the mean level; an odd one out stays), and
            # the blocks to come twice as long: the same resolution all through the run.
            even = len(levels) // 2 * 2
            pairs = zip(levels[:even:2], levels[1:even:2], strict=True)
            levels[:] = [(b[0], (a[1] + b[1]) / 2) for a, b in pairs] + levels[even:]
            steps = self._end_blocks.steps  # just closed: nothing pending is lost
            self._end_blocks.steps = replace(steps, size=2 * steps.size)

    def _close_block(self, level: float, t: float) -> None:
        """Judge a block of log level ``level`` that ended at ``t``."""
        self._run_blocks += 1
        if self._run_blocks > WHOLE_RUN_BLOCKS and self._end_blocks is not None:
            self._end_blocks = None  # a long run: its end judges the live verdict alone
            self._run_levels.clear()
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
        self._since_step += 1
        if self._cusum.alarm and self._current_ratio() >= self._bar():
            if not self._active:
                self._start_report()
            elif self._recent_ratio() >= self._stated * RESTEP_BAR:
                self._restep()
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
        """Fill the chunk; the first one sets the baseline as it grows, and the noise (with
        the sum's ``k`` and ``h``) from its first ``min_baseline_blocks``, then again at each
        block that joins at a zero sum: a slowdown that the sum has not cleared yet must not
        raise the bar it is climbing to (a busy start's noisy blocks made ``h`` outgrow the
        sum of a 6x slowdown joining the first chunk)."""
        chunk = self._chunk
        first = not self._chunks
        chunk.append(level)
        if first and len(chunk) >= self._min_baseline:
            levels = np.array(chunk)
            if len(chunk) == self._min_baseline or self._cusum.value == 0.0:
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
        """Blocks that estimate the current level: those since the onset, or since the
        level last stepped up during a report."""
        since = min(self._since_onset, self._since_step)
        return min(max(since, RECENT_BLOCKS), LEVEL_BLOCKS, len(self._recent))

    def _climb(self, ratio: float, floor: float = 0.0) -> tuple[int, int]:
        """Where the level last started to climb from a quarter of the way from ``floor``
        to ``ratio`` (log units; index into the recent blocks, -1 if it never was that
        low), and in how many blocks it then reached three quarters: a step takes a few, a
        ramp many. The level is the running median of ``CLIMB_SMOOTHING`` blocks, so that
        noise dips during a slow ramp do not pass for its start."""
        values = np.array([x for _, x in self._recent])
        padded = np.pad(values, (CLIMB_SMOOTHING - 1, 0), mode="edge")
        smooth = np.median(sliding_window_view(padded, CLIMB_SMOOTHING), axis=1)
        low = np.flatnonzero(smooth <= floor + (ratio - floor) / 4)
        start = int(low[-1]) if len(low) else -1
        high = np.flatnonzero(smooth[start + 1 :] >= floor + 3 * (ratio - floor) / 4)
        blocks = int(high[0]) + 1 if len(high) else len(smooth) - start
        return start, blocks

    def _start_report(self) -> None:
        """Decide, once per report, whether the slowdown is gradual, and since when: a
        report that changed its kind as noise moves the climb would read as two problems."""
        ratio = self._current_ratio()
        start, climb_blocks = self._climb(math.log(ratio))
        climb_start = self._recent[max(start, 0)][0]
        onset = self._cusum.onset_t
        self._gradual = climb_blocks > RECENT_BLOCKS
        if onset is None or self._gradual:
            self._since = climb_start if onset is None else min(climb_start, onset)
        else:
            self._since = self._step_onset(math.log(ratio), onset)
        self._stated = ratio
        self._since_step = LEVEL_BLOCKS  # as if none: the level counts from the onset

    def _step_onset(self, level: float, onset: float) -> float:
        """When a step to ``level`` (log ratio) began: from the sum's last zero ``onset`` on,
        the end of the block after which the blocks' cumulative excess over half the step
        is least. The sum's allowance is half the least step worth reporting, so before a
        large step a block of noise may have left it above zero; measured against half
        the step itself, it does not (docs/slowdowns.md, "The onset of an abrupt step")."""
        recent = [(t, x) for t, x in self._recent if t >= onset]
        if not recent:
            return onset
        excess = np.cumsum([x - level / 2 for _, x in recent])
        return max(onset, recent[int(np.argmin(excess))][0])

    def _restep(self) -> None:
        """A reported slowdown whose recent level is ``RESTEP_BAR`` times the level it
        stated: if the level jumped there (within ``RECENT_BLOCKS`` blocks, as
        :meth:`_climb` tells from the stated level), a new step that the report now states,
        as abrupt, dated from where the blocks crossed halfway (the least of their
        cumulative excess over it); a climb is still the same slowdown, its kind kept,
        stated from the new level on. A contended host's slow drift must not hide a step that
        comes after it. Reasoning: docs/slowdowns.md, "A step on top of a slowdown"."""
        ratio, floor = math.log(self._recent_ratio()), math.log(self._stated)
        start, climb_blocks = self._climb(ratio, floor)
        values = np.array([x for _, x in self._recent])
        if start + climb_blocks >= len(values) and climb_blocks <= RECENT_BLOCKS:
            return  # the smoothed level has not reached three quarters yet: wait for it
        self._stated = math.exp(ratio)
        if climb_blocks > RECENT_BLOCKS:
            return
        first = max(start - CLIMB_SMOOTHING, 0)
        excess = np.cumsum(values[first:] - (floor + ratio) / 2)
        step = first + int(np.argmin(excess)) + 1
        self._gradual = False
        self._since = self._recent[min(step, len(values)) - 1][0]  # the end of the last before
        self._since_step = len(values) - step

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
                f"step), rising gradually since about {clock(since)}."
            )
            kind = "gradual_slowdown"
        else:
            message = (
                f"steps became {ratio:.2f}x slower around {clock(since)} ({before} -> {after} "
                "per step) and stayed there."
            )
            kind = "abrupt_slowdown"
        return Evaluation(score, (Finding(kind, severity, since, message, evidence),))

    def conclude(self, now: float) -> Evaluation:
        """The live verdict; for a short run, a slowdown judged over all of it: a run of
        seconds has no baseline, and one whose start was slow (a busy host) has one too high.
        Judged on blocks of ``END_BLOCK_STEPS`` steps (merged to ``MIN_BLOCK_SECONDS``): its
        last ones stepping up from those just before them (:func:`whole_run_step`, which also
        replaces a live finding ``WORTH_REPORTING`` times smaller), or else all of them rising
        steadily (:func:`whole_run_rise`). First the run's last steps, if ``min_block`` or more, and
        the sub-blocks still merging close its last blocks."""
        if self._end_blocks is not None:
            self._end_blocks.flush()
        self._blocks.flush()
        live = self.evaluate(now)
        if self._run_blocks > WHOLE_RUN_BLOCKS or len(self._run_levels) < WHOLE_RUN_MIN_BLOCKS:
            return live
        step = whole_run_step(self._run_levels)
        if live.findings:  # a step measured from the blocks before it, if it differs
            bar = evaluation_ratio(live) * WORTH_REPORTING
            stepped = step.findings and evaluation_ratio(step) > bar
            return Evaluation(max(live.score, step.score), step.findings) if stepped else live
        rise = whole_run_rise(self._run_levels)
        score = max(live.score, step.score, rise.score)
        return Evaluation(score, step.findings or rise.findings)
