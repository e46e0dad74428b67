"""Steps reduced to block levels: the slowdown detector's first stage, live and at a run's
end. Reasoning: docs/slowdowns.md, "Blocks".
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable
from dataclasses import replace

from driftwatch.detect.stats import RunningBlocks

SHORT_STEP_SECONDS = 0.02
"""Median step of a run's first block below which its blocks' level is not their median."""
SLOWEST_STEPS_LEFT_OUT = 0.1
"""Share of a block's slowest steps left out of a short-step run's level (the others' mean)."""
MIN_BLOCK_SECONDS = 1.0
"""Least wall time a block spans, in seconds (blocks of fast steps are merged)."""
MAX_SUB_BLOCKS = 256
"""Bounds the sub-blocks merged into one block (a clock that jumps back never closes one)."""


class StepBlocks:
    """Steps reduced to block levels (docs/slowdowns.md, "Blocks"): sub-blocks of
    ``steps.size`` steps (fewer when slow), their median (in a run whose first sub-block's
    is under ``SHORT_STEP_SECONDS``, the mean without the slowest
    ``SLOWEST_STEPS_LEFT_OUT``), merged until a block spans about ``MIN_BLOCK_SECONDS``; a
    sub-block that would span it alone is never merged. Each block's log level and end go
    to ``close``."""

    __slots__ = ("_close", "_first", "_last_block_t", "_last_sub_block_t", "_merging", "steps")

    def __init__(self, steps: RunningBlocks, close: Callable[[float, float], None]) -> None:
        self.steps = steps
        self._close = close
        self._first = True  # the first sub-block decides how the others' level is taken
        self._merging: list[float] = []  # log levels of the sub-blocks of the open block
        self._last_block_t = -math.inf
        self._last_sub_block_t = -math.inf

    def add(self, value: float, t: float) -> None:
        """One step of ``value`` seconds that ended at ``t``."""
        block = self.steps.add(value, t)
        if block is not None:
            self.sub_block(*block)

    def sub_block(self, value: float, t: float) -> None:
        """Merge a sub-block of level ``value`` (seconds) that ended at ``t`` into the open
        block, and close it at the whole number of sub-blocks nearest to
        ``MIN_BLOCK_SECONDS``; a sub-block that would close a block alone closes the open one
        first, and then its own."""
        if not value > 0:
            self._last_sub_block_t = t  # its time is not the next sub-block's
            return
        if self._first:
            self._first = False
            if value < SHORT_STEP_SECONDS:
                self.steps = replace(self.steps, trim=SLOWEST_STEPS_LEFT_OUT)
        # A block of its own: the first slow sub-block after a step up must not be lost in
        # the median of the fast ones merged before it (docs/slowdowns.md, "Blocks").
        own = t - self._last_sub_block_t
        if self._merging and own + own / 2 >= MIN_BLOCK_SECONDS:
            self._close_merged()
        self._last_sub_block_t = t
        self._merging.append(math.log(value))
        # Close at the whole number of sub-blocks nearest to MIN_BLOCK_SECONDS: 100 steps of
        # 10 ms span a second give or take, and must not be merged in pairs half the time.
        span, merged = t - self._last_block_t, len(self._merging)
        if span + span / (2 * merged) < MIN_BLOCK_SECONDS and merged < MAX_SUB_BLOCKS:
            return
        self._close_merged()

    def flush(self) -> None:
        """Close the last steps, if ``steps.min_size`` or more, and the block still merging."""
        last = self.steps.flush()
        if last is not None:
            self.sub_block(*last)
        if self._merging:
            self._close_merged()

    def _close_merged(self) -> None:
        """Close the open block: the median of its sub-blocks, ended with the newest."""
        level = statistics.median(self._merging)
        self._merging.clear()
        self._last_block_t = self._last_sub_block_t
        self._close(level, self._last_sub_block_t)
