"""Steps shorter than the scheduler's time slice, on a host that got busy: the slowdown is in
their mean, not in their median.

The recording is of the CPU-hog e2e job (tests/test_causes_e2e.py, 1.1-ms steps, 3 busy
processes beside it on 2 cores), in which block medians state no slowdown at all. A
preempted job waits between steps in a few places: its throughput halves while most steps
still take 1.1 ms, so block medians hardly move. In a run of steps under 20 ms, block levels
are therefore the mean of all but the slowest tenth of the steps (docs/slowdowns.md, "Steps
shorter than a time slice").
"""

from __future__ import annotations

import gzip
import json

import numpy as np
import pytest

from driftwatch.detect.slowdown.live import SlowdownDetector
from driftwatch.series import Sample
from tests.test_slowdown_restep import RECORDINGS, T0, recorded_steps, reports

CPU_HOG = RECORDINGS / "e2e_cpu_hog_hook_steps.json.gz"
SLOWDOWNS = frozenset({"abrupt_slowdown", "gradual_slowdown"})


def test_the_recorded_job_beside_a_cpu_hog_states_its_slowdown_within_seconds() -> None:
    """Expected, on the recording: 1.1-ms steps (half the wall time between epochs) for 27 s,
    then 3 busy processes for 30 s: about half a core for the job, its mean step 1.2 -> 2.5
    ms, its median mostly 1.1-1.3 ms. An ``abrupt_slowdown`` of 1.5x or more, since within
    3 s of the hog's start, stated within 10 s of it. On block medians it is first stated
    16.7 s after the hog's start, or never."""
    doc = json.loads(gzip.decompress(CPU_HOG.read_bytes()))
    hog = float(doc["hog_start"])
    stated = [(t, f) for t, f in reports(recorded_steps(CPU_HOG)) if f.kind in SLOWDOWNS]
    assert stated, "no slowdown stated"
    when, finding = stated[0]
    assert finding.kind == "abrupt_slowdown"
    assert when - hog < 10
    assert abs(finding.since - hog) < 3
    assert float(finding.evidence["ratio"]) >= 1.5


def preempted_steps(rng: np.random.Generator, seconds: float, share: float) -> list[Sample]:
    """1-ms steps (lognormal noise, 10 %) for ``seconds``; from the middle on the job gets
    ``share`` of a core in 3-ms slices: after each slice it waits ``3 * (1 / share - 1)`` ms,
    which lands on the step that slice ends in."""
    samples, t, ran = [], T0, 0.0
    while t < T0 + seconds:
        value = 0.001 * rng.lognormal(0, 0.1)
        if t >= T0 + seconds / 2:
            ran += value
            if ran >= 0.003:
                ran -= 0.003
                value += 0.003 * (1 / share - 1)
        t += value
        samples.append(Sample("step_seconds", value, t))
    return samples


@pytest.mark.parametrize("seed", range(4))
def test_a_job_preempted_between_short_steps_is_a_slowdown_of_its_throughput(seed: int) -> None:
    """Expected: 60 s of 1-ms steps, from 30 s on half a core in 3-ms slices (a 3-ms wait on
    every third step or so: the median step stays 1 ms, the mean doubles): an
    ``abrupt_slowdown`` since within 2 s of 30 s, of 1.5-2.2x, stated within 6 s.
    Block medians alone state none (1.0x)."""
    stated = reports(preempted_steps(np.random.default_rng(seed), 60, share=0.5))
    assert [f.kind for _, f in stated][:1] == ["abrupt_slowdown"], stated
    when, finding = stated[0]
    assert when - (T0 + 30) < 6
    assert abs(finding.since - (T0 + 30)) < 2
    assert 1.5 <= float(finding.evidence["ratio"]) <= 2.2


def test_short_steps_never_preempted_are_quiet() -> None:
    """Expected: the same 1-ms steps, never preempted, for 60 s: nothing stated."""
    detector = SlowdownDetector()
    for sample in preempted_steps(np.random.default_rng(9), 60, share=1.0):
        detector.observe(sample)
    assert not detector.conclude(T0 + 60).findings
