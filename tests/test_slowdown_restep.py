"""A step on top of a slowdown already reported: stated as the new, abrupt slowdown it is.

The recordings here are of the real-Prometheus e2e test's job on a shared 2-core VM. In
one, the job's ~1.1-ms steps drifted to 1.4-1.7 ms for 15 s (other work on the host) while
the baseline rested on its first chunk, which is reported as a ``gradual_slowdown`` of
1.40x; the 11x step at step 20,000 comes 8 s later, inside that report, whose kind is
decided once: unless the step is stated as a slowdown of its own, no
``abrupt_slowdown`` is ever stated, and the test's ``DriftwatchAbruptSlowdown`` alert never
fires.
"""

from __future__ import annotations

import gzip
import json
import math
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from driftwatch.detect.slowdown.live import SlowdownDetector
from driftwatch.findings import Finding, Severity
from driftwatch.series import Sample

T0 = 1_700_000_000.0
RECORDINGS = Path(__file__).parent / "data" / "slowdown"
CONTENDED = RECORDINGS / "e2e_contended_hook_steps.json.gz"
BUSY_START = RECORDINGS / "e2e_busy_start_hook_steps.json.gz"


def reports(samples: list[Sample]) -> list[tuple[float, Finding]]:
    """Each warning or worse the detector states, evaluated every second as a monitor does,
    when its kind or its onset changes: (when, finding)."""
    detector = SlowdownDetector()
    stated: list[tuple[float, Finding]] = []
    next_tick = samples[0].t + 1
    for sample in samples:
        detector.observe(sample)
        if sample.t < next_tick:
            continue
        next_tick += 1
        for finding in detector.evaluate(sample.t).findings:
            last = stated[-1][1] if stated else None
            if finding.severity is not Severity.INFO and (
                last is None or (last.kind, last.since) != (finding.kind, finding.since)
            ):
                stated.append((sample.t, finding))
    return stated


def synthetic_steps(
    rng: np.random.Generator, level: Callable[[float], float], step_at: float, step: float
) -> list[Sample]:
    """Steps of ``level(t)`` seconds (lognormal noise, 15 %), ``step`` seconds slower from
    ``step_at`` on, for ``step_at`` + 25 s."""
    samples, t = [], 0.0
    while t < step_at + 25:
        value = level(t) * rng.lognormal(0, 0.15) + step * (t >= step_at)
        t += value
        samples.append(Sample("step_seconds", float(value), T0 + t))
    return samples


def contended_then_stepped(seed: int, step: float = 0.012) -> list[Sample]:
    """70 s of 1.1-ms steps that drift to 1.5x from 22 to 32 s and stay there until 40 s (a
    busy host), ease to 1.3x by 45 s, and from 45 s on are ``step`` seconds slower: the e2e
    job's shape."""
    shape = ([0, 22, 32, 40, 45], [1.0, 1.0, 1.5, 1.5, 1.3])
    return synthetic_steps(
        np.random.default_rng(seed), lambda t: 0.0011 * float(np.interp(t, *shape)), 45, step
    )


@pytest.mark.parametrize("seed", range(4))
def test_a_step_after_a_contended_drift_already_reported_is_an_abrupt_slowdown(
    seed: int,
) -> None:
    """Expected: the drift may be reported (it is 1.5x); the 11x step at 45 s is an
    ``abrupt_slowdown`` since 45 s (within a block), of 10-13x the baseline, stated within
    10 s of the step. Taken into the drift's report, whose kind is decided once, it would
    leave a ``gradual_slowdown`` since about 23 s and nothing abrupt."""
    stated = reports(contended_then_stepped(seed))
    abrupt = [(t, f) for t, f in stated if f.kind == "abrupt_slowdown"]
    assert abrupt, [(f.kind, f.since - T0) for _, f in stated]
    when, finding = abrupt[0]
    assert when - (T0 + 45) < 10
    assert abs(finding.since - (T0 + 45)) < 1.5
    assert 10 < float(finding.evidence["ratio"]) < 13


@pytest.mark.parametrize("seed", range(2))
def test_the_drift_alone_is_never_stated_as_a_step(seed: int) -> None:
    """The same start with no step after it: whatever the drift is stated as, no later
    step is invented from its own noise."""
    stated = reports(contended_then_stepped(seed, step=0.0))
    assert [f.kind for _, f in stated] in ([], ["gradual_slowdown"], ["abrupt_slowdown"])


def test_a_report_on_a_ramp_stays_gradual_as_the_ramp_climbs_on() -> None:
    """A ramp from 1x to 3x over 40,000 steps of 50 ms, reported early as gradual, climbs
    far past 1.5x what it first stated: still one ``gradual_slowdown``, dated from the ramp,
    not a step."""
    rng = np.random.default_rng(11)
    ramp = np.concatenate([np.ones(5000), np.linspace(1, 3, 40_000)])
    values = 0.05 * ramp * rng.lognormal(0, 0.15, len(ramp))
    samples, t = [], T0
    for value in values:
        t += value
        samples.append(Sample("step_seconds", float(value), t))
    stated = reports(samples)
    assert [f.kind for _, f in stated] == ["gradual_slowdown"]
    assert float(stated[0][1].since) - samples[5000].t < 0.25 * (t - samples[5000].t)


def recorded_steps(recording: Path) -> list[Sample]:
    """A recording: each record ends its seconds per step after the one before (plus the
    gaps at epoch ends)."""
    doc = json.loads(gzip.decompress(recording.read_bytes()))
    gaps = dict(doc["gaps"])
    samples, t = [], float(doc["start"])
    for index, micros in enumerate(doc["micros"]):
        if index:
            t += micros / 1e6 + gaps.get(index, 0.0)
        samples.append(Sample("step_seconds", micros / 1e6, t))
    return samples


def first_of_a_slow_stretch(samples: list[Sample]) -> float:
    """When the first of 100 steps slower than 8 ms ended."""
    values = np.array([s.value for s in samples])
    return next(s.t for i, s in enumerate(samples) if np.all(values[i : i + 100] > 0.008))


def first_abrupt(samples: list[Sample]) -> tuple[float, Finding]:
    """When the detector first states an ``abrupt_slowdown`` over ``samples``, and it."""
    stated = reports(samples)
    abrupt = [(t, f) for t, f in stated if f.kind == "abrupt_slowdown"]
    assert abrupt, [(f.kind, f.since - samples[0].t) for _, f in stated]
    return abrupt[0]


def stated_from_the_change(
    recording: Path, count: int, within: float, ratios: tuple[float, float]
) -> Finding:
    """The recording's first ``abrupt_slowdown``, checked: stated within ``within`` seconds
    of the change to slow steps, dated within 2 s of it, its ratio inside ``ratios``."""
    samples = recorded_steps(recording)
    assert len(samples) == count
    slow_from = first_of_a_slow_stretch(samples)
    when, finding = first_abrupt(samples)
    assert when - slow_from < within
    assert abs(finding.since - slow_from) < 2
    assert ratios[0] < float(finding.evidence["ratio"]) < ratios[1]
    return finding


def test_the_recorded_e2e_job_whose_alert_was_missed_states_its_abrupt_slowdown() -> None:
    """Expected, on the recording of the missed alert: steps 1.1 ms to step 20,000 (about
    45 s after the first, ~1.5 ms for its last 10 s), then 13 ms: an ``abrupt_slowdown``
    of about 11x the 1.14-ms baseline, since within 2 s of step 20,000, stated within 10 s
    of it. Taken into the drift's report: only a ``gradual_slowdown`` since 21 s after the
    first step."""
    finding = stated_from_the_change(CONTENDED, 21_446, within=10, ratios=(10, 13))
    assert math.isclose(float(finding.evidence["baseline_step_seconds"]), 0.00114, rel_tol=0.1)


def busy_start_then_stepped(seed: int) -> list[Sample]:
    """50 s of 2-ms steps on a host so busy that their level swings by a factor of about
    1.8 (log sd 0.6) every 2 s, and from 25 s on 12 ms slower: the e2e job's shape at load
    average 12."""
    rng = np.random.default_rng(seed)
    swings = np.exp(0.6 * rng.standard_normal(13))
    return synthetic_steps(
        rng, lambda t: 0.002 * (float(swings[int(t / 2)]) if t < 25 else 1.0), 25, 0.012
    )


@pytest.mark.parametrize("seed", range(8))
def test_a_step_while_a_busy_start_fills_the_first_chunk_is_stated_from_the_step(
    seed: int,
) -> None:
    """Expected: a 7x step at 25 s, while the first chunk still fills with the busy start's
    blocks, is an ``abrupt_slowdown`` since 25 s (within 2.5 s) of 4x or more, stated
    within 12 s of it (a statement from the step at a smaller ratio may come first: seed 4
    is told at 3.0x 4 s after the step, while its blocks still mixed, then at 6.2x). Before
    the fix, 3 of these 8 seeds dated it from a swing of the start (18.6-21.9 s; two of
    them at 1.8x), whose report the step then stayed inside."""
    stated = reports(busy_start_then_stepped(seed))
    stepped = [
        (t, f)
        for t, f in stated
        if f.kind == "abrupt_slowdown"
        and abs(f.since - (T0 + 25)) < 2.5
        and float(f.evidence["ratio"]) >= 4
    ]
    assert stepped, [(f.kind, f.since - T0, f.evidence["ratio"]) for _, f in stated]
    when, _ = stepped[0]
    assert when - (T0 + 25) < 12


def test_the_recorded_busy_start_states_its_slowdown_live() -> None:
    """Expected, on the recording at load average 12: steps of 1.6-4.7 ms (medians of 5 s)
    for the 25 s after the first, then 13-14 ms: an ``abrupt_slowdown`` of 4-7x, since within
    2 s of the change, stated within 12 s of it. Were the slow blocks to join the baseline,
    its noise would rise from 0.63 to 1.5 and nothing would be stated until the run's end."""
    stated_from_the_change(BUSY_START, 5402, within=12, ratios=(4, 7))
