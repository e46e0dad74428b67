"""A short run's slowdown, judged at its end over all its blocks (the detector's finer end
blocks: ``driftwatch.detect.slowdown.live.END_BLOCK_STEPS``).

A run of seconds never completes the live detector's first chunk, and one that slows from
its start (or whose start was slowed by a busy host) has a baseline too high: its end
looks for a step up from the blocks just before it, else a steady rise through all of
them. Reasoning: docs/slowdowns-at-the-end.md, "Which runs, and which blocks".
"""

from __future__ import annotations

import math

import numpy as np

from driftwatch.detect import Evaluation
from driftwatch.detect.stats import mann_kendall, rank_sum_greater, theil_sen
from driftwatch.findings import JUDGED_AT_END, WHOLE_RUN, Finding, Severity
from driftwatch.units import clock, human_seconds

WHOLE_RUN_BLOCKS = 240
"""Blocks a run may have for its end to judge all of them (longer runs have a baseline)."""
WHOLE_RUN_SKIP_BLOCKS = 1
"""First blocks of a run that its end leaves out (the first steps trace the function)."""
WHOLE_RUN_MIN_BLOCKS = 8
"""Blocks a run needs for its end to judge a slowdown over all of it."""
WHOLE_RUN_BAR = 1.5
"""Ratio of the fitted last to first block time that the end of a short run reports."""
WHOLE_RUN_ALPHA = 0.001
"""Significance of a short run's steady rise (Mann-Kendall) or step (rank sum, all splits)."""
WHOLE_RUN_STEP_BAR = 1.5
"""Ratio of a short run's slower last blocks to the blocks before them reported as a step."""
WHOLE_RUN_STEP_BLOCKS = 8
"""Blocks that a step's slower last stretch, and the stretch before it, last at least."""
WHOLE_RUN_BEFORE_BLOCKS = 12
"""Most blocks just before a step that give the level it stepped up from."""
WHOLE_RUN_STEP_RISE = 0.25
"""Share of a step (log) by which the blocks after it may still rise, for it to be a step."""


def whole_run_step(levels: list[tuple[float, float]]) -> Evaluation:
    """Of a short run's blocks, ``levels`` as (t, log median): the split after which all
    of them are slower (one-sided rank sum against up to ``WHOLE_RUN_BEFORE_BLOCKS`` just
    before, ``WHOLE_RUN_ALPHA`` over all the splits tried), reported when their median is
    ``WHOLE_RUN_STEP_BAR`` times theirs, they are level (their Theil-Sen line rises by less
    than ``WHOLE_RUN_STEP_RISE`` of the step: else the run is slowing, not stepped) and
    their last half is still that slow."""
    times = np.array([t for t, _ in levels])
    logs = np.array([level for _, level in levels])
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
    since = float(times[split - 1])  # where the first slower block began
    first, last = math.exp(before), math.exp(before) * ratio
    message = (
        f"steps became {ratio:.2f}x slower around {clock(since)} ({human_seconds(first)} -> "
        f"{human_seconds(last)} per step) and stayed there to the end of the run, judged "
        "over the whole run (too short, or started too slowly, for a baseline of its own)."
    )
    return _judged("abrupt_slowdown", score, since, message, first, last)


def whole_run_rise(levels: list[tuple[float, float]]) -> Evaluation:
    """All of a short run's blocks, ``levels`` as (t, log median), rising steadily
    (Mann-Kendall at ``WHOLE_RUN_ALPHA``) to ``WHOLE_RUN_BAR`` times the first (their
    Theil-Sen line)."""
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
        f"p={test.p:.1g}), too short or slowing too early for a baseline of its own."
    )
    return _judged("gradual_slowdown", score, since, message, first, last)


def _judged(
    kind: str, score: float, since: float, message: str, first: float, last: float
) -> Evaluation:
    """A finding of the run's end: from ``first`` to ``last`` seconds a step since ``since``."""
    ratio = last / first
    evidence: dict[str, float | str] = {
        "ratio": ratio,
        "baseline_step_seconds": first,
        "current_step_seconds": last,
        "onset": since,
        JUDGED_AT_END: WHOLE_RUN,
    }
    severity = Severity.CRITICAL if ratio >= 2 else Severity.WARNING
    return Evaluation(score, (Finding(kind, severity, since, message, evidence),))


def evaluation_ratio(evaluation: Evaluation) -> float:
    """The ratio of the slowdown an evaluation with a finding reports."""
    return float(evaluation.findings[0].evidence["ratio"])
