"""Time between train steps (callbacks, input pipeline, host work) that takes a large or
growing share of each step. Reasoning: docs/slow-callbacks.md, "The algorithm".
"""

from __future__ import annotations

import math

from driftwatch.detect import Evaluation
from driftwatch.detect.stats import RunningBlocks
from driftwatch.findings import KINDS, Finding
from driftwatch.series import Sample
from driftwatch.units import human_seconds

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
        self._steps = RunningBlocks(200, max_seconds=30.0, min_size=5)
        self._gaps = RunningBlocks(200, max_seconds=30.0, min_size=5)
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
        kind = "slow_callbacks"
        finding = Finding(kind, KINDS[kind].severity, since, message, evidence)
        return Evaluation(score, (finding,))
