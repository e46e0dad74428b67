"""The in-graph timing of a rank's collectives, on a stand-in collective (one process: a real
multi-worker job is in test_ranks_e2e.py)."""

from __future__ import annotations

import gc
import time
from typing import Any

import pytest

from driftwatch.hook.multiworker import GraphTimings

SLEEP_SECONDS = 0.02
"""What the stand-in collective takes, in seconds."""


@pytest.mark.tf
@pytest.mark.paired
def test_a_step_made_anew_every_iteration_lets_its_collectives_go_and_keeps_their_time() -> None:
    # Expected: five steps, each a new tf.function whose one "collective" sleeps 20 ms, each
    # called once and dropped: 5 x 20 ms or more timed, and no total kept for a step gone
    # (a loop that re-creates its step would otherwise add a variable per iteration).
    import tensorflow as tf

    timings = GraphTimings(tf)

    def collective(x: Any) -> Any:
        def slow(value: Any) -> Any:
            time.sleep(SLEEP_SECONDS)
            return value

        return tf.numpy_function(slow, [x], tf.float32)

    def make_step() -> Any:
        @tf.function  # type: ignore[untyped-decorator]
        def step(x: Any) -> Any:
            return timings.timed(lambda: collective(x), x, step) * 2.0

        return step

    for _ in range(5):
        step = make_step()
        assert float(step(tf.constant(1.0))) == 2.0
        assert timings.kept() >= 1
        del step
        gc.collect()
    assert timings.seconds() >= 5 * SLEEP_SECONDS
    assert timings.kept() == 0
    assert timings.seconds() >= 5 * SLEEP_SECONDS  # the time of those gone is kept
