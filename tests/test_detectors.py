"""Each detector on clean, noisy and adversarial input, at their own (pure) clock."""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Iterable
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from driftwatch.detect import Detector, Engine, Evaluation
from driftwatch.detect.basic import StallDetector
from driftwatch.detect.catalog import default_detectors
from driftwatch.detect.growth import PerStepGrowthDetector, UnrotatedEventFileDetector
from driftwatch.detect.memory.drift import ResourceDriftDetector
from driftwatch.detect.memory.host import HostMemoryDetector
from driftwatch.detect.memory.resources import RESOURCES
from driftwatch.detect.memory.trends import MemoryThresholds
from driftwatch.detect.periodic_stalls import PeriodicStallDetector
from driftwatch.detect.slow_callbacks import SlowCallbackDetector
from driftwatch.detect.slowdown.live import SlowdownDetector
from driftwatch.findings import Finding, Severity
from driftwatch.series import Sample

MIB = 1 << 20
GIB = 1 << 30
T0 = 1_700_000_000.0
DEVICE = (("device", "CPU:0"),)


def feed(detector: Detector, samples: Iterable[Sample]) -> Evaluation:
    last = T0
    for sample in samples:
        detector.observe(sample)
        last = sample.t
    return detector.evaluate(last)


def alarms(evaluation: Evaluation) -> list[str]:
    return [f.kind for f in evaluation.findings if f.severity is not Severity.INFO]


def steps(values: Iterable[float], start: float = T0) -> list[Sample]:
    samples, t = [], start
    for value in values:
        t += value
        samples.append(Sample("step_seconds", value, t))
    return samples


def noisy_steps(count: int, base: float, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    values = base * rng.lognormal(0, 0.15, count)
    values[rng.random(count) < 0.002] *= 20  # rare big spikes
    return values


# -- every detector survives adversarial input and stays quiet on it -------------------

ADVERSARIAL = {
    "single sample": lambda series: [Sample(series, 1.0, T0)],
    "constant": lambda series: [Sample(series, 5.0, T0 + i) for i in range(5000)],
    "nan": lambda series: [Sample(series, math.nan, T0 + i) for i in range(500)],
    "inf": lambda series: [Sample(series, math.inf, T0 + i) for i in range(50)],
    "clock backwards": lambda series: [
        Sample(series, 1.0 + (i % 7), T0 + (i if i < 300 else 600 - i)) for i in range(600)
    ],
    "gap": lambda series: (
        [Sample(series, 2.0, T0 + i) for i in range(100)]
        + [Sample(series, 2.0, T0 + 86400 + i) for i in range(100)]
    ),
    "zero and negative": lambda series: [Sample(series, -(i % 3), T0 + i) for i in range(300)],
}


@pytest.mark.parametrize("case", sorted(ADVERSARIAL))
def test_every_detector_on_adversarial_input(case: str) -> None:
    for detector in default_detectors():
        for series in sorted(detector.series):
            for sample in ADVERSARIAL[case](series):
                detector.observe(sample)
        for now in (T0, T0 + 1e5, T0 - 1e5):
            evaluation = detector.evaluate(now)
            assert math.isfinite(evaluation.score), (detector.name, case)
        # Legitimate on such input: silence (stalled), NaN (nonfinite), and the same value
        # fed as step time and as time outside the step (slow_callbacks: 100 %), or 1 fed
        # as the share of each step waiting for input (input_bound: 100 %).
        legitimate = ("stalled", "nonfinite", "slow_callbacks", "input_bound")
        noisy = [k for k in alarms(evaluation) if k not in legitimate]
        assert noisy == [], (detector.name, case, evaluation.findings)


# -- step time ---------------------------------------------------------------------------


def test_slowdown_is_silent_on_noisy_stationary_steps() -> None:
    detector = SlowdownDetector()
    evaluation = feed(detector, steps(noisy_steps(200_000, 0.05)))
    assert alarms(evaluation) == []
    assert evaluation.score < 0.5


def test_slowdown_flags_a_step_change_with_its_onset() -> None:
    values = np.concatenate([noisy_steps(20_000, 0.05), noisy_steps(3000, 0.05 * 1.3, seed=1)])
    samples = steps(values)
    onset_t = samples[20_000].t
    evaluation = feed(SlowdownDetector(), samples)
    (finding,) = evaluation.findings
    assert finding.kind == "abrupt_slowdown"
    assert abs(finding.since - onset_t) < 100 * 0.065  # within about a block
    assert 1.2 < float(finding.evidence["ratio"]) < 1.4


@pytest.mark.parametrize(
    ("fast", "slow", "slow_steps"),
    [(0.0006, 0.025, 499), (0.002, 0.025, 499), (0.0006, 0.025, 380), (0.0006, 0.008, 420)],
)
def test_a_step_up_at_a_runs_end_is_told_wherever_in_a_block_it_starts(
    fast: float, slow: float, slow_steps: int
) -> None:
    # Expected: 22 s of steps of `fast` seconds (100-step sub-blocks merged into blocks of a
    # second: 17 or 5), then `slow_steps` of `slow` seconds to the run's end (the retracing
    # e2e job of tests/test_causes_e2e.py: 499 of 25 ms), in blocks of 100 steps (0.8 s or
    # more: never merged): 3 or 4 full blocks and the run's last steps, which close its last
    # block at its end; from a sum at zero, the sum reports a step from 4 blocks (each adds
    # at most h/2 - k). Reported wherever the first slow step falls, in its sub-block and in
    # the merged block (offsets over 1,700 steps), dated within a second of it (a merged
    # block's span). Both rules are needed: were a sub-block holding a few of the first slow
    # steps to keep the merged block open, the next, a whole block of slow steps, would be
    # lost in the median of the fast ones, and with the run's last steps left out too, 499
    # steps would be missed at 51 of 300 offsets (0.6-ms steps); with the end's block alone,
    # 380 steps would be missed at 23 of these 50 offsets, 420 of 8 ms at 18, and the onset
    # dated up to 2.7 s late.
    rng = np.random.default_rng(0)
    start = round(22 / fast)
    for offset in range(0, 1700, 34):
        values = np.concatenate(
            [
                fast * rng.lognormal(0, 0.05, start + offset),
                slow * rng.lognormal(0, 0.1, slow_steps),
            ]
        )
        samples = steps(values)
        detector = SlowdownDetector()
        for sample in samples:
            detector.observe(sample)
        findings = detector.conclude(samples[-1].t).findings
        assert [f.kind for f in findings] == ["abrupt_slowdown"], offset
        assert abs(findings[0].since - samples[start + offset].t) <= 1.0, offset


def test_slowdown_flags_a_ramp_as_gradual() -> None:
    ramp = 1 + np.linspace(0, 1.0, 30_000)
    values = np.concatenate([noisy_steps(5000, 0.05), noisy_steps(30_000, 0.05, seed=2) * ramp])
    samples = steps(values)
    (finding,) = feed(SlowdownDetector(), samples).findings
    assert finding.kind == "gradual_slowdown"
    # The climb began with the ramp, well before the CUSUM sum left zero for good.
    assert abs(finding.since - samples[5000].t) < 0.25 * (samples[-1].t - samples[5000].t)


def test_periodic_stalls_are_information_and_growing_ones_a_warning() -> None:
    values = noisy_steps(20_000, 0.05)
    values[::500] = 3.0  # a checkpoint every 500 steps
    evaluation = feed(PeriodicStallDetector(), steps(values))
    (finding,) = evaluation.findings
    assert finding.severity is Severity.INFO
    assert 24 < float(finding.evidence["period_seconds"]) < 30
    growing = noisy_steps(20_000, 0.05)
    growing[::500] = np.linspace(1.0, 10.0, len(growing[::500]))
    (finding,) = feed(PeriodicStallDetector(), steps(growing)).findings
    assert finding.severity is Severity.WARNING
    assert "getting longer" in finding.message


def test_slow_callbacks_by_share_and_by_growth() -> None:
    detector = SlowCallbackDetector()
    samples = []
    for i in range(5000):
        gap = 0.005 if i < 2000 else 0.005 + 0.04 * (i - 2000) / 3000
        samples += [
            Sample("step_seconds", 0.05 + gap, T0 + i),
            Sample("step_gap_seconds", gap, T0 + i),
        ]
    (finding,) = feed(detector, samples).findings
    assert finding.kind == "slow_callbacks"
    assert "up from" in finding.message
    quiet = SlowCallbackDetector()
    calm = [
        s
        for i in range(3000)
        for s in (Sample("step_seconds", 0.05, T0 + i), Sample("step_gap_seconds", 0.002, T0 + i))
    ]
    assert feed(quiet, calm).findings == ()


def test_a_custom_loops_own_python_between_tiny_steps_is_no_slow_callback() -> None:
    """Expected: a healthy custom loop of 0.74-ms steps spends 0.27 ms per step fetching the
    next batch and calling the step (measured in scenarios/healthy_loop.py): a third of each
    step, but nothing to fix. The same third of 10-ms steps is reported."""

    def findings(step: float, gap: float) -> tuple[Finding, ...]:
        samples = [
            s
            for i in range(20_000)
            for s in (
                Sample("step_seconds", step, T0 + i * step),
                Sample("step_gap_seconds", gap, T0 + i * step),
            )
        ]
        return feed(SlowCallbackDetector(), samples).findings

    assert findings(0.00074, 0.00027) == ()
    (finding,) = findings(0.010, 0.0037)
    assert finding.kind == "slow_callbacks"


def test_the_end_of_a_short_run_whose_steps_slowed_from_its_start_reports_it() -> None:
    """Expected: a 20-s run whose steps go from 1.3 ms to 3.4 ms at an even pace (host work
    growing with the history, as in scenarios/loop_plateau_check.py) never gets a baseline
    of its own to be slower than, live; its end states a gradual slowdown of about 2.6x. A
    20-s run that wanders by 1.3x (a loaded shared host) is stated at no end."""
    rng = np.random.default_rng(7)

    def run(step_at: Callable[[float], float]) -> SlowdownDetector:
        detector, t = SlowdownDetector(), T0
        while t < T0 + 20:
            step = step_at(t - T0) * float(rng.lognormal(0, 0.1))
            t += step
            detector.observe(Sample("step_seconds", step, t))
        return detector

    slowing = run(lambda s: 0.0013 + (0.0034 - 0.0013) * s / 20)
    assert slowing.evaluate(T0 + 20).findings == ()
    (finding,) = slowing.conclude(T0 + 20).findings
    assert finding.kind == "gradual_slowdown"
    assert 2.0 < float(finding.evidence["ratio"]) < 3.2
    assert finding.evidence["judged_at_end"] == "whole run"
    wandering = run(lambda s: 0.0013 * (1.3 if 8 < s < 14 else 1.0))
    assert wandering.conclude(T0 + 20).findings == ()


@pytest.mark.parametrize(("last", "stated"), [(0.060, True), (0.0375, False)])
def test_the_end_of_a_minute_whose_steps_rose_evenly_states_a_rise_of_half_again(
    last: float, stated: bool
) -> None:
    """Expected: a 60-s run of 30-ms steps that rise evenly to 60 ms (a Python generator
    whose every lookup scans all it kept, on a host where 60 s make only 1,300 steps, as
    scenarios/fit_generator_slows.py) is too short for a live baseline; its end states a
    ``gradual_slowdown`` of 1.7-2.0x (its line's first and last blocks: the first live
    block is left out). The same run rising evenly by 1.25x is stated at no end, on any
    of 8 seeds."""
    for seed in range(8):
        rng = np.random.default_rng(seed)
        detector, t = SlowdownDetector(), T0
        while t < T0 + 60:
            step = (0.030 + (last - 0.030) * (t - T0) / 60) * float(rng.lognormal(0, 0.15))
            t += step
            detector.observe(Sample("step_seconds", step, t))
        assert detector.evaluate(t).findings == ()
        findings = detector.conclude(t).findings
        if not stated:
            assert findings == ()
            continue
        (finding,) = findings
        assert finding.kind == "gradual_slowdown"
        assert 1.7 < float(finding.evidence["ratio"]) < 2.0


@pytest.mark.parametrize(
    ("step", "factor", "before", "after"),
    [(0.1, 3.0, 60, 60), (0.1, 2.0, 60, 60), (0.2, 3.0, 60, 120), (0.05, 3.0, 30, 60)],
)
def test_a_short_run_of_slow_steps_that_slows_is_told_at_its_end(
    step: float, factor: float, before: float, after: float
) -> None:
    """Expected: steps of ``step`` seconds (a small CNN on a CPU) for ``before`` seconds,
    then ``factor`` times slower for ``after`` seconds to the run's end: too few 100-step
    blocks for a baseline or for the whole-run step test (8 blocks a side), so nothing is
    said live, nor by that test at the end. Its end judges blocks of 10 steps: an
    ``abrupt_slowdown`` of ``factor`` (within 10 %), dated within one of those blocks of the
    step. The same run without the step is stated at no end."""
    rng = np.random.default_rng(3)

    def run(slower: float) -> tuple[SlowdownDetector, float]:
        detector, t = SlowdownDetector(), T0
        while t < T0 + before + after:
            value = step * (slower if t >= T0 + before else 1.0) * float(rng.lognormal(0, 0.1))
            t += value
            detector.observe(Sample("step_seconds", value, t))
        return detector, t

    slowed, end = run(factor)
    (finding,) = slowed.conclude(end).findings
    assert finding.kind == "abrupt_slowdown"
    assert finding.evidence["judged_at_end"] == "whole run"
    assert float(finding.evidence["ratio"]) == pytest.approx(factor, rel=0.1)
    assert abs(finding.since - (T0 + before)) <= 10 * step * factor
    steady, end = run(1.0)
    assert steady.conclude(end).findings == ()


# -- memory ------------------------------------------------------------------------------


def rss(
    hours: float,
    leak_per_hour: float = 0.0,
    onset_h: float = 0.0,
    every: float = 10.0,
    jump_at_h: float | None = None,
    seed: int = 0,
) -> list[Sample]:
    rng = np.random.default_rng(seed)
    samples = [Sample("memory_limit_bytes", 24.0 * GIB, T0)]
    for i in range(int(hours * 3600 / every)):
        t = T0 + i * every
        h = i * every / 3600
        value = 10 * GIB + 40 * MIB * ((i % 37) / 37) + rng.normal(0, 4 * MIB)
        value += max(0.0, h - onset_h) * leak_per_hour
        if jump_at_h is not None and h >= jump_at_h:
            value += 400 * MIB
        samples.append(Sample("rss_bytes", value, t))
    return samples


def test_memory_flat_with_sawtooth_is_quiet() -> None:
    assert feed(HostMemoryDetector(), rss(8)).findings == ()


def test_memory_leak_is_found_with_slope_and_time_to_limit() -> None:
    (finding,) = feed(HostMemoryDetector(), rss(5, 50 * MIB, onset_h=1.5)).findings
    assert finding.kind == "host_memory_drift"
    assert 35 * MIB < float(finding.evidence["slope_bytes_per_hour"]) < 65 * MIB
    assert float(finding.evidence["seconds_to_limit"]) > 24 * 3600
    assert finding.severity is Severity.WARNING


def test_memory_jump_is_a_step_not_a_leak() -> None:
    evaluation = feed(HostMemoryDetector(), rss(6, jump_at_h=3.0))
    assert alarms(evaluation) == []
    assert [f.kind for f in evaluation.findings] == ["memory_step"]


def test_fast_growth_is_critical_even_in_warm_up() -> None:
    samples = [Sample("memory_limit_bytes", 4.0 * GIB, T0), Sample("train_step", 1.0, T0)]
    samples += [Sample("rss_bytes", GIB + i * 0.5 * 30 * MIB, T0 + i * 0.5) for i in range(80)]
    (finding,) = feed(HostMemoryDetector(), samples).findings
    assert finding.severity is Severity.CRITICAL
    assert float(finding.evidence["seconds_to_limit"]) < 300


def test_a_leak_right_after_a_jump_is_judged_from_the_first_floor_past_it() -> None:
    """+300 MB at 4.2 s, then 30 GB/h: the 2-s window the jump fell into keeps the old
    floor, the next one holds the new level already, and the leak's 4 evenly rising windows
    count from there ([6, 8) to [12, 14) s, the last one full with its readings at 13.5 s;
    8 windows to [20, 22) s before rapid growth was judged on the newest few)."""
    samples = [Sample("memory_limit_bytes", 16.0 * GIB, T0), Sample("train_step", 1.0, T0)]
    for i in range(80):
        t = i * 0.5
        value = GIB + (300 * MIB + (t - 4.2) * 30 * GIB / 3600 if t >= 4.2 else 0.0)
        samples.append(Sample("rss_bytes", value, T0 + t))
    detector = HostMemoryDetector(MemoryThresholds(scales=(2.0, 20.0)))
    report = first_report(detector, samples, every=0.5)
    assert report is not None
    assert report[1].kind == "host_memory_drift"
    assert report[0] - T0 == 13.5


def test_start_up_is_never_judged_and_ends_without_a_step_signal() -> None:
    """A job importing TensorFlow and building its model climbs hundreds of MB in seconds
    (slower still on a busy host): not a leak, unless it goes on once training runs. Its
    first training step ends start-up; without one, a climb from the first reading counts
    as start-up for 30 s at most, and growth past that is judged."""
    limit = [Sample("memory_limit_bytes", 4.0 * GIB, T0)]

    def climb(start: float, base: float, per_second: float, seconds: float) -> list[Sample]:
        return [
            Sample("rss_bytes", base + i * 0.5 * per_second, start + i * 0.5)
            for i in range(int(seconds * 2))
        ]

    ramp = climb(T0, 10 * MIB, 20 * MIB, 30)
    top = ramp[-1].value
    first_step = [Sample("train_step", 1.0, T0 + 30)]
    flat = climb(T0 + 30, top, 0.0, 30)
    leak = climb(T0 + 30, top, 20 * MIB, 30)
    assert alarms(feed(HostMemoryDetector(), limit + ramp + first_step + flat)) == []
    assert alarms(feed(HostMemoryDetector(), limit + ramp + first_step + leak)) == [
        "host_memory_drift"
    ]
    # Without any step: a steady 10 MB/s climb from the first reading is start-up for 30 s,
    # and reported within seconds once it goes on past that.
    steady = climb(T0, 10 * MIB, 10 * MIB, 200)
    assert first_report(HostMemoryDetector(), limit + steady[:60], every=0.5) is None
    report = first_report(HostMemoryDetector(), limit + steady, every=0.5)
    assert report is not None
    assert 30 < report[0] - T0 <= 38


def test_leak_class_from_tf_memory_and_tracing() -> None:
    def leak_with(extra: str) -> str:
        return str(leak_finding(extra).evidence["leak_class"])

    def leak_finding(extra: str) -> Finding:
        detector = HostMemoryDetector()
        samples = rss(5, 200 * MIB, onset_h=1.5)
        for i, sample in enumerate(samples[1:]):
            h = (sample.t - T0) / 3600
            if extra == "tensors":
                samples.append(
                    Sample(
                        "tf_allocator_current_bytes",
                        1e8 + max(0, h - 1.5) * 1e8,
                        sample.t,
                        (("device", "CPU:0"),),
                    )
                )
            elif extra == "hook without allocator statistics" and i % 6 == 0:
                samples.append(Sample("tracing_count", 3.0, sample.t))
            elif extra in ("retracing", "flat") and i % 6 == 0:
                samples.append(
                    Sample("tf_allocator_current_bytes", 1e8, sample.t, (("device", "CPU:0"),))
                )
                count = 3 + (int(h * 100) if extra == "retracing" and h > 1.5 else 0)
                samples.append(Sample("tracing_count", float(count), sample.t))
        samples.sort(key=lambda s: s.t)
        (finding,) = feed(detector, samples).findings
        return finding

    assert leak_with("tensors") == "tensors_kept_alive"
    assert leak_with("retracing") == "retracing"
    assert leak_with("flat") == "framework_state"
    assert leak_with("none") == "unknown"
    assert "under driftwatch run" in leak_finding("none").message
    # Under driftwatch run on a CPU: the hook runs, TF's allocator keeps no statistics.
    hooked = leak_finding("hook without allocator statistics")
    assert hooked.evidence["leak_class"] == "unknown"
    assert "--cpu-allocator-stats" in hooked.message


def test_a_long_validation_is_no_stall_but_a_longer_silence_is() -> None:
    """After eight validations of 90-110 s, one of 200 s is still validation; 300 s of
    silence is a stall."""
    samples, t = [], T0
    for epoch in range(8):
        samples += [Sample("step_timestamp", t + i, t + i) for i in range(600)]
        t += 600 + 90 + 20 * epoch / 7  # validation: no step
        samples.append(Sample("validation_seconds", 90 + 20 * epoch / 7, t))
    samples.append(Sample("step_timestamp", t, t))

    def silent_for(seconds: float) -> list[str]:
        clock = Sample("train_step", 1.0, t + seconds)  # not the detector's: only moves time
        return alarms(feed(StallDetector(), [*samples, clock]))

    assert silent_for(199) == []
    assert silent_for(300) == ["stalled"]


def test_a_process_stopped_for_ten_seconds_is_stalled_however_seldom_it_logs_steps() -> None:
    """Steps logged every 30 s (a stall only after 300 s of silence); the process stopped 5 s
    after its last step: no stall 14 s later (stopped 9 s), a stall that says it is stopped
    16 s later; resumed, the silence alone is judged again."""
    samples = [Sample("step_timestamp", T0 + 30 * i, T0 + 30 * i) for i in range(20)]
    last = T0 + 30 * 19
    samples += [Sample("process_stopped", 0.0, last + 1), Sample("process_stopped", 1.0, last + 5)]

    def at(seconds: float, *more: Sample) -> Evaluation:
        clock = Sample("train_step", 1.0, last + seconds)  # not the detector's: only moves time
        return feed(StallDetector(), [*samples, *more, clock])

    assert at(14).findings == ()
    (finding,) = at(16).findings
    assert finding.kind == "stalled"
    assert finding.evidence["stopped_seconds"] == pytest.approx(11.0)
    assert "stopped for 11 s" in finding.message
    assert "kill -CONT" in finding.message
    assert at(60, Sample("process_stopped", 0.0, last + 20)).findings == ()


def test_gpu_memory_uses_the_gpus_total_as_limit() -> None:
    detector = ResourceDriftDetector(RESOURCES["gpu_memory"])
    gpu = (("gpu", "0"),)
    samples = [Sample("gpu_memory_total_bytes", 16.0 * GIB, T0, gpu), Sample("train_step", 1, T0)]
    samples += [
        Sample("gpu_process_memory_bytes", 8 * GIB + i * 20 * MIB, T0 + 2 * i, gpu)
        for i in range(100)
    ]
    (finding,) = feed(detector, samples).findings
    assert finding.evidence["limit_bytes"] == 16 * GIB
    assert finding.severity is Severity.CRITICAL


# -- growth ------------------------------------------------------------------------------


def test_event_bytes_per_step_rising_is_found_and_proportional_growth_is_not() -> None:
    def run(per_step: float, growth: float) -> Evaluation:
        detector = PerStepGrowthDetector("event_file_bytes", "event_file_growth", "event bytes", "")
        total = 0.0
        samples = []
        for i in range(3 * 360):
            total += 200 * (per_step + growth * i)
            samples += [
                Sample("train_step", 200.0 * i, T0 + 10 * i),
                Sample("event_file_bytes", total, T0 + 10 * i),
            ]
        return feed(detector, samples)

    assert run(1000, 0).findings == ()
    (finding,) = run(1000, 5).findings
    assert finding.kind == "event_file_growth"


def test_a_fast_growing_unrotated_event_file_and_a_rotated_one() -> None:
    rate = 150 * MIB / 3600
    growing = [Sample("event_file_largest_bytes", i * 10 * rate, T0 + 10 * i) for i in range(90)]
    (finding,) = feed(UnrotatedEventFileDetector(), growing).findings
    assert finding.kind == "event_file_unrotated"
    rotated = [
        Sample("event_file_largest_bytes", (i % 20) * 10 * rate, T0 + 10 * i) for i in range(90)
    ]
    assert feed(UnrotatedEventFileDetector(), rotated).findings == ()


def test_slowdown_ignores_a_long_small_excess_and_reports_once_it_matters() -> None:
    """A lasting +6 % (a slow healthy wander) is not worth a warning: chunks with no report
    join the baseline, which follows it; a further +12 % is still reported."""
    rng = np.random.default_rng(6)

    def calm(count: int, base: float) -> np.ndarray:
        return base * rng.lognormal(0, 0.05, count)

    base, wander = calm(5000, 0.05), calm(40_000, 0.05 * 1.06)
    detector = SlowdownDetector()
    assert alarms(feed(detector, steps(np.concatenate([base, wander])))) == []
    assert detector.baseline == pytest.approx(0.05 * 1.06, rel=0.02)
    slower = calm(3000, 0.05 * 1.06 * 1.12)
    evaluation = feed(SlowdownDetector(), steps(np.concatenate([base, wander, slower])))
    assert alarms(evaluation) == ["abrupt_slowdown"]


def test_slowdown_bar_rises_with_the_wander_the_baseline_has_seen() -> None:
    """A run whose level has been seen to wander by 2 % is not reported when it sits 9 %
    above its baseline (a bar at 7.5 % reports it); 16 % above still is, and so is 9 % in
    a run that never wandered."""
    rng = np.random.default_rng(7)
    count = 60_000  # 50 minutes of 50-ms steps: 20 chunks, 5 periods of the wander
    wander = np.exp(0.02 * np.sin(2 * np.pi * np.arange(count) / 12_000))

    def run(wandering: bool, excess: float) -> list[str]:
        level = np.concatenate([wander if wandering else np.ones(count), np.full(4000, excess)])
        return alarms(
            feed(SlowdownDetector(), steps(0.05 * level * rng.lognormal(0, 0.05, len(level))))
        )

    assert run(wandering=True, excess=1.09) == []
    assert run(wandering=True, excess=1.16) == ["abrupt_slowdown"]
    assert run(wandering=False, excess=1.09) == ["abrupt_slowdown"]


def first_report(
    detector: Detector, samples: list[Sample], every: float = 1.0
) -> tuple[float, Finding] | None:
    """When and what ``detector``, evaluated every ``every`` seconds as a monitor does,
    first reports as a warning or worse (None: never)."""
    next_tick = samples[0].t + every
    for sample in samples:
        detector.observe(sample)
        if sample.t >= next_tick:
            next_tick += every
            for finding in detector.evaluate(sample.t).findings:
                if finding.severity is not Severity.INFO:
                    return sample.t, finding
    return None


def first_alarm(detector: Detector, samples: list[Sample], every: float = 1.0) -> float:
    """When ``detector`` first raises a warning, as in ``first_report`` (NaN: never)."""
    report = first_report(detector, samples, every)
    return math.nan if report is None else report[0]


def test_slowdown_of_sub_millisecond_steps_needs_more_than_a_burst_of_contention() -> None:
    """At 0.75 ms a step, 100 steps last 75 ms: a burst of contention (another process on
    the core) would fill several blocks. Blocks span a second instead, so the burst does not
    alarm, while a sustained 1.5x still does, within seconds."""
    base = noisy_steps(60_000, 0.00075)  # 45 s
    burst = noisy_steps(1000, 0.00075 * 2.5, seed=3)  # about 1.9 s
    values = np.concatenate([base[:40_000], burst, base[40_000:]])
    assert math.isnan(first_alarm(SlowdownDetector(), steps(values)))
    samples = steps(np.concatenate([base, noisy_steps(8000, 0.00075 * 1.5, seed=4)]))
    assert first_alarm(SlowdownDetector(), samples) - samples[60_000].t < 6


@pytest.mark.parametrize("seed", range(3))
def test_slowdown_after_a_contended_start_is_reported_within_seconds(seed: int) -> None:
    """A short run whose first 30 s are disturbed (steps 1.1x, then 0.5x, then 0.8x their
    usual time as other work on the host comes and goes) makes an uncertain baseline, yet
    steps 1.6 ms slower from 40 s on (1.9x the level just before, 2.3x the baseline) are
    reported within seconds: the baseline's error from its autocorrelated blocks alone would
    set a bar above 2.2x, which misses such a slowdown in a real Keras logdir, so it lifts the
    bar to 1.5x at most."""
    rng = np.random.default_rng(seed)
    shape = ([0, 8, 12, 16, 30], [1.1, 1.1, 0.8, 0.5, 0.8])
    values, t = [], 0.0
    while t < 60:
        step = 0.0017 * np.interp(t, *shape) * rng.lognormal(0, 0.15) + 0.0016 * (t >= 40)
        values.append(step)
        t += step
    samples = steps(values)
    report = first_report(SlowdownDetector(), samples)
    assert report is not None
    when, finding = report
    assert when - (T0 + 40) < 8
    assert finding.kind == "abrupt_slowdown"
    assert abs(finding.since - (T0 + 40)) < 2
    assert 2.0 < float(finding.evidence["ratio"]) < 2.6


@pytest.mark.parametrize("seed", range(4))
def test_the_end_of_a_short_run_tells_a_slowdown_its_busy_start_hid(seed: int) -> None:
    """Expected: a 70-s run whose first 25 s are 1.8x slower (other work on the host), then
    8 s at its own 1.8 ms, then 2.1x slower to the end, has a baseline resting on the busy
    start: live, the slowdown is missed or told as about 1.2x. Its end states it as a step of
    about 2.1x at 33 s (the shape of a real Keras logdir's slowdown). The same start
    with no slowdown after it is stated at no end."""
    rng = np.random.default_rng(seed)

    def run(later: float) -> SlowdownDetector:
        detector, t = SlowdownDetector(), T0
        while t < T0 + 70:
            s = t - T0
            level = 0.0018 * (1.8 if s < 25 else 1.0) * (later if s >= 33 else 1.0)
            step = level * float(rng.lognormal(0, 0.15))
            t += step
            detector.observe(Sample("step_seconds", step, t))
        return detector

    (finding,) = run(2.1).conclude(T0 + 70).findings
    assert finding.kind == "abrupt_slowdown"
    assert 1.9 < float(finding.evidence["ratio"]) < 2.3
    assert abs(finding.since - (T0 + 33)) < 2
    assert finding.evidence["judged_at_end"] == "whole run"
    assert run(1.0).conclude(T0 + 70).findings == ()


def test_memory_trends_are_judged_on_floors_not_on_spikes() -> None:
    """Probes that land mid-step (+512 MiB a third of the time, more often lately) lift
    window means but not floors: no drift."""
    rng = np.random.default_rng(5)
    samples = []
    for i in range(8 * 360):
        share = 0.1 if i < 4 * 360 else 0.5
        spike = 512 * MIB if rng.random() < share else 0.0
        samples.append(Sample("tf_allocator_current_bytes", 6 * GIB + spike, T0 + 10 * i))
    detector = ResourceDriftDetector(replace(RESOURCES["tf_memory"], limit_series=None))
    assert alarms(feed(detector, samples)) == []


def test_warm_up_that_levels_off_is_not_urgent_but_a_steady_climb_is() -> None:
    """Both rise at 20 GiB/h at 10 minutes in, towards a 16 GiB limit 12 GiB away; only
    the one that keeps its pace would reach it within the hour."""
    limit = [Sample("memory_limit_bytes", 16.0 * GIB, T0)]
    tau = 1200.0
    levelling = [
        Sample("rss_bytes", 4 * GIB + 20 * GIB / 3600 * tau * -math.expm1(-i / tau), T0 + i)
        for i in range(0, 1500, 5)
    ]
    assert alarms(feed(HostMemoryDetector(), limit + levelling)) == []
    steady = [Sample("rss_bytes", 4 * GIB + 20 * GIB / 3600 * i, T0 + i) for i in range(0, 600, 5)]
    (finding,) = feed(HostMemoryDetector(), limit + steady).findings
    assert finding.severity is Severity.CRITICAL


def test_leak_class_in_a_short_run_and_from_retracing_warnings() -> None:
    """Seconds into a run, TF memory probed every second rising with RSS means tensors kept
    alive; without the hook's tracing count, TF's retracing warnings tell retracing, even
    though TF prints them only twice, long before the window that shows the leak."""

    def short_leak(extra: str, every: float = 1.0) -> tuple[str, str]:
        samples = [Sample("memory_limit_bytes", 8.0 * GIB, T0), Sample("train_step", 1.0, T0)]
        for i in range(160):
            t = T0 + i * 0.5
            samples.append(Sample("rss_bytes", GIB + i * 0.5 * 10 * MIB, t))
            if extra == "late tensors":
                if i >= 20 and i % 2 == 0:
                    tf = 100 * MIB + i * 0.5 * 8 * MIB
                    samples.append(Sample("tf_allocator_current_bytes", tf, t, DEVICE))
            elif extra == "faster tensors":  # twice the rate from 8 s on: steps got faster
                tf = 100 * MIB + (i + max(0, i - 16)) * 0.5 * 6 * MIB
                samples.append(Sample("tf_allocator_current_bytes", tf, t, DEVICE))
            elif i % 2 == 0:
                tf = 100 * MIB + (i * 0.5 * 8 * MIB if extra == "tensors" else 0.0)
                samples.append(Sample("tf_allocator_current_bytes", tf, t, DEVICE))
            if extra == "warnings" and i in (2, 6):
                samples.append(Sample("retracing_warnings_total", float(i // 4 + 1), t))
        report = first_report(HostMemoryDetector(), samples, every)
        assert report is not None
        (latest,) = feed(HostMemoryDetector(), samples).findings
        return str(report[1].evidence["leak_class"]), str(latest.evidence["leak_class"])

    # Reported 6 s after training started, from windows counted from then (here and flat),
    # when the allocator's 1.5-s windows since then are 3: classed once they are 4 (a
    # monitor tells the finding again with its class).
    assert short_leak("tensors") == ("unknown", "tensors_kept_alive")
    # The allocator's probes begin 10 s after RSS starts rising (the hook starts later):
    # the leak is reported before them, and classed once its few windows since the onset
    # rise at RSS's pace, which is evidence enough (a monitor then tells the new class).
    assert short_leak("late tensors") == ("unknown", "tensors_kept_alive")
    # A rise whose rate changes is still a rise: a test corrected for autocorrelation took
    # the bend for autocorrelated noise once 16 windows were in (evaluated every 3 s, it
    # classed kept tensors as framework_state).
    assert short_leak("faster tensors", every=3.0) == ("tensors_kept_alive",) * 2
    assert short_leak("warnings") == ("retracing", "retracing")
    assert short_leak("flat") == ("unknown", "framework_state")


def test_unrotated_event_file_in_seconds_and_not_from_one_burst() -> None:
    rate = 6 * GIB / 3600  # image summaries every step
    fast = [Sample("event_file_largest_bytes", i * rate, T0 + i) for i in range(40)]
    (finding,) = feed(UnrotatedEventFileDetector(), fast).findings
    assert finding.since < T0 + 10
    burst = [
        Sample("event_file_largest_bytes", 1000.0 * i + (8 * MIB if i >= 20 else 0.0), T0 + i)
        for i in range(40)
    ]
    assert feed(UnrotatedEventFileDetector(), burst).findings == ()


def test_unrotated_event_file_needs_minutes_at_the_bare_threshold() -> None:
    """100 MB/h of per-step scalars is reported after minutes of evidence, not 30 s."""
    rate = 120 * MIB / 3600
    growing = [Sample("event_file_largest_bytes", i * rate, T0 + i) for i in range(400)]
    assert feed(UnrotatedEventFileDetector(), growing[:40]).findings == ()
    (finding,) = feed(UnrotatedEventFileDetector(), growing).findings
    assert finding.kind == "event_file_unrotated"


# -- start-up, urgency and the end of a run ----------------------------------------------

STARTUPS = Path(__file__).parent / "data" / "startup"


def recorded(name: str, *, slower: float = 1.0, limit: float | None = None) -> list[Sample]:
    """A recorded start-up (``bench/detection/record_startup.py``), as read every 0.5 s; a
    host ``slower`` times as slow stretches it, still read every 0.5 s."""
    rows = [json.loads(line) for line in (STARTUPS / f"{name}.jsonl").read_text().splitlines()]
    start = rows[0]["t"]
    readings = [r for r in rows if r["series"] == "rss_bytes"]
    times = np.array([r["t"] - start for r in readings]) * slower
    values = np.array([r["value"] for r in readings])
    host = rows[0]["value"] if limit is None else limit
    samples = [Sample("memory_limit_bytes", host, T0)]
    samples += [
        Sample("rss_bytes", float(np.interp(t, times, values)), T0 + t)
        for t in np.arange(times[0], times[-1], 0.5)
    ]
    return samples


def whole_run(samples: list[Sample], every: float = 0.5) -> tuple[list[Finding], list[Finding]]:
    """What a monitor reports of ``samples`` with every default detector: live warnings or
    worse (evaluated every ``every`` seconds), and those of the evaluation after the end."""
    engine = Engine(default_detectors())
    live: list[Finding] = []
    next_tick = samples[0].t + every
    for sample in samples:
        engine.observe(sample)
        if sample.t >= next_tick:
            next_tick += every
            live += [f for f in engine.evaluate(sample.t) if f.severity is not Severity.INFO]
    final = engine.evaluate(samples[-1].t, final=True)
    return live, [f for f in final if f.severity is not Severity.INFO]


def growing(
    samples: list[Sample], onset: float, per_hour: float, until: float | None = None
) -> list[Sample]:
    """``samples`` with RSS growing by ``per_hour`` from ``onset`` seconds on."""
    end = math.inf if until is None else until
    return [
        Sample(s.series, s.value + per_hour / 3600 * max(0.0, min(s.t - T0, end) - onset), s.t)
        if s.series == "rss_bytes"
        else s
        for s in samples
    ]


@pytest.mark.parametrize(
    ("slower", "name"),
    [(1.0, "custom_loop"), (1.0, "cnn_fit_validation")]
    + [(2.0, name) for name in ("custom_loop", "train_keras", "cnn_fit_validation")],
)
def test_recorded_tensorflow_start_ups_raise_no_warning(name: str, slower: float) -> None:
    """Real start-ups read every 0.5 s (import, model build, first batches, then a creep),
    on this host and on one twice as slow, against the host's limit and an 8 GiB one: no
    warning live, none at the end."""
    for limit in (None, 8.0 * GIB):
        live, final = whole_run(recorded(name, slower=slower, limit=limit))
        assert (live, final) == ([], []), (limit, live, final)


def test_the_recorded_train_keras_growth_is_stated_at_its_end_only() -> None:
    """The example ``train_keras``'s TensorBoard callback keeps about 2 KB a step
    (tensorflow/tensorflow#34876; standalone, 597 -> 650 MB linearly over 140 s): no warning
    live (too slow to reach either limit within the hour), steady growth stated at the end."""
    for limit in (None, 8.0 * GIB):
        live, final = whole_run(recorded("train_keras", limit=limit))
        assert live == [], (limit, live)
        assert [(f.kind, f.severity) for f in final] == [("host_memory_drift", Severity.WARNING)], (
            limit,
            final,
        )


def per_step_leak(pace_changes_at: float, slower: float, kept_share: float) -> list[Sample]:
    """A 40-s job read every 0.5 s: a 590-MB start-up jump, then 430 steps/s from 6 s, each
    keeping 2 KB under a 0.3-MB GC sawtooth. From ``pace_changes_at`` s its steps take
    ``slower`` times as long and each keeps ``kept_share`` of that."""
    samples = [Sample("memory_limit_bytes", 24.0 * GIB, T0)]
    step, kept = 0.0, 0.0
    for i in range(1, 81):
        t = i * 0.5
        if t > 6.0:
            late = t > pace_changes_at
            steps = 0.5 * 430 / (slower if late else 1.0)
            step += steps
            kept += steps * 2048 * (kept_share if late else 1.0)
            samples.append(Sample("train_step", step, T0 + t))
        base = 10e6 + 590e6 * min(t / 5.0, 1.0)
        samples.append(Sample("rss_bytes", base + kept + 0.3e6 * (i % 6) / 5, T0 + t))
    return samples


def test_a_leak_per_step_is_stated_at_the_end_though_its_steps_slowed() -> None:
    """The ``train_keras`` example's TensorBoard callback keeps about 2 KB a step. Its steps
    taking 1.7x as long from the middle of the run (a neighbour, a slow callback) slow the
    growth per second to 0.59 of its rate, not per step: stated at the end. Growth that slows
    per step as well (a cache filling) is not."""
    live, final = whole_run(per_step_leak(23.0, slower=1.7, kept_share=1.0))
    assert live == []
    assert [(f.kind, f.severity) for f in final] == [("host_memory_drift", Severity.WARNING)]
    assert "until the run ended" in final[0].message
    assert whole_run(per_step_leak(23.0, slower=1.0, kept_share=0.55)) == ([], [])


def test_a_recorded_leak_with_no_step_signal_is_reported_within_seconds() -> None:
    """A custom loop passing its learning rate as a Python float (a new trace each step)
    climbs to 590 MB in 6 s, then grows 30 GB/h with no step signal at all: reported
    within 7.5 s of that (start-up ended on its own shape), and stated at the end."""
    samples = recorded("python_float_lr", limit=16.0 * GIB)
    detector = HostMemoryDetector()
    report = first_report(detector, samples, every=0.5)
    assert report is not None
    when, finding = report
    assert when - T0 <= 13.5
    assert 20 * GIB < float(finding.evidence["slope_bytes_per_hour"]) < 40 * GIB
    assert [f.kind for f in whole_run(samples)[1]] == ["host_memory_drift"]


@pytest.mark.parametrize("per_hour", [30 * GIB, 400 * GIB])
def test_a_leak_after_start_up_is_reported_within_seconds_without_a_step(
    per_hour: float,
) -> None:
    """A leak from the end of a recorded start-up (8 s), 30 GB/h or 400 GB/h: reported
    within 7 s of its start, with no step signal (start-up used to last until a step or
    120 s)."""
    samples = growing(recorded("custom_loop", limit=16.0 * GIB), 8.0, per_hour)
    report = first_report(HostMemoryDetector(), samples, every=0.5)
    assert report is not None
    assert report[0] - T0 - 8.0 <= 7.0
    assert report[1].severity is Severity.CRITICAL


GC_DIP_LEAK_MB = [
    397.8, 403.3, 417.7, 447.0, 461.1, 468.2, 473.6, 567.1, 581.0, 591.3, 598.2, 630.9,
    638.8, 646.0, 657.2, 661.6, 658.0, 664.9, 670.3, 678.2, 685.0, 690.2, 696.9, 703.2,
]  # fmt: skip
"""RSS in MB read every 0.5 s from 0.5 s: a start-up climb to 6 s, then 30 GiB/h and a
settling creep under an 8 MiB GC sawtooth (``bench/detection``'s ``nostep_leak_30gb_40s``,
seed 0)."""


def test_a_leak_whose_windows_hold_one_gc_dip_is_reported_from_four_windows() -> None:
    """30 GiB/h from the end of start-up (6 s): the 1.5-s windows' floors rise by 26, 8 and
    20 MB, the 8 a GC drop in the third window. One dip is not a level jump: reported once
    the fourth window has closed (11.5 s), not a window later."""
    samples = [Sample("memory_limit_bytes", 16.0 * GIB, T0), Sample("train_step", 1.0, T0 + 6.0)]
    samples += [
        Sample("rss_bytes", mb * 1e6, T0 + 0.5 * (i + 1)) for i, mb in enumerate(GC_DIP_LEAK_MB)
    ]
    samples.sort(key=lambda s: s.t)
    report = first_report(HostMemoryDetector(), samples, every=0.5)
    assert report is not None
    assert report[0] - T0 <= 11.5
    assert report[1].severity is Severity.CRITICAL
    assert 25 * GIB < float(report[1].evidence["slope_bytes_per_hour"]) < 45 * GIB


@pytest.mark.parametrize(
    ("floors", "rapid"),
    [
        ([600, 625, 632, 651], True),  # a GC dip in the third window
        ([600, 608, 628, 654], True),  # in the second
        ([730, 730.01, 741, 750], False),  # flat, then a rise begins
        ([565, 581, 591, 631], False),  # a lumpy climb's lull, then its lump
        ([600, 601, 1001, 1002], False),  # a level jump
        ([600, 620, 625, 645], False),  # a lull between two lumps
    ],
)
def test_one_gc_dip_among_the_windows_is_rapid_growth_a_flat_start_or_a_jump_is_not(
    floors: list[float], rapid: bool
) -> None:
    """Four 1.5-s windows, one reading each way of their floors (MB), after start-up (a
    step at 0): rapid growth when they rise evenly but for one dip, whose rise into it and
    out of it are within 3x of each other; not when one rise is most of it."""
    samples = [Sample("memory_limit_bytes", 16.0 * GIB, T0), Sample("train_step", 1.0, T0)]
    for k, floor in enumerate(floors):
        for j, above in enumerate((0.0, 1.0, 2.0)):  # the floor first, then above it
            samples.append(Sample("rss_bytes", (floor + above) * 1e6, T0 + 1.5 * k + 0.5 * j))
    last = floors[-1] + 3.0
    samples.append(Sample("rss_bytes", last * 1e6, T0 + 6.0))  # closes the fourth window
    detector = HostMemoryDetector()
    for sample in samples:
        detector.observe(sample)
    findings = [f for f in detector.evaluate(T0 + 6.0).findings if f.kind == "host_memory_drift"]
    assert bool(findings) is rapid, findings


def test_a_one_off_jump_after_start_up_is_not_a_leak_live_or_at_the_end() -> None:
    """A checkpoint buffer or a bigger batch: +400 MB within a second, 5 s after a recorded
    start-up settled, then flat: no warning live, none at the end."""
    samples = recorded("train_keras", limit=8.0 * GIB)
    jumped = [
        Sample(s.series, s.value + min(max(s.t - T0 - 13.0, 0.0), 1.0) * 400 * MIB, s.t)
        if s.series == "rss_bytes"
        else s
        for s in samples
    ]
    assert whole_run(jumped) == ([], [])


def test_the_end_of_a_run_states_steady_growth_no_live_window_could_judge() -> None:
    """A 20-s job whose RSS quadrupled steadily from its first reading (500 MB to 2 GB) never
    left what could be start-up live; at its end the growth is stated, with rate and
    projection."""
    samples = [Sample("memory_limit_bytes", 16.0 * GIB, T0)]
    samples += [Sample("rss_bytes", 500e6 + 75e6 * i * 0.5, T0 + i * 0.5) for i in range(41)]
    live, final = whole_run(samples)
    assert live == []
    (finding,) = final
    assert finding.kind == "host_memory_drift"
    assert finding.evidence["judged_at_end"] == "whole run"
    assert float(finding.evidence["slope_bytes_per_hour"]) == pytest.approx(270e9, rel=0.05)
    assert float(finding.evidence["seconds_to_limit"]) < 600
    assert "until the run ended" in finding.message


def test_the_end_of_a_run_never_states_a_single_jump_or_a_settling_climb() -> None:
    """A 15-s job: a recorded start-up that settled, then +400 MB at 10 s: nothing at the
    end; nor for a start-up cut short while still climbing (a 6-s job)."""
    samples = recorded("custom_loop", limit=8.0 * GIB)
    samples = [s for s in samples if s.t - T0 <= 15]
    jumped = [
        Sample(s.series, s.value + (400 * MIB if s.t - T0 >= 10 else 0.0), s.t)
        if s.series == "rss_bytes"
        else s
        for s in samples
    ]
    assert whole_run(jumped)[1] == []
    assert whole_run([s for s in samples if s.t - T0 <= 6])[1] == []


@pytest.mark.parametrize("seconds", [6.0, 10.0, 15.0])
def test_a_job_that_ends_within_a_slow_start_up_is_not_stated(seconds: float) -> None:
    """Recorded start-ups on a host three times as slow, ended while still climbing (an
    import error, a crash while building the model): nothing at the end."""
    for name in ("custom_loop", "cnn_fit_validation", "kept_outputs"):
        samples = [s for s in recorded(name, slower=3.0) if s.t - T0 <= seconds]
        assert whole_run(samples) == ([], []), name


def test_a_burst_of_growth_that_ended_a_short_job_is_stated() -> None:
    """A 5-s job, flat for a second, then 400 MB/s until it was killed: no live window
    could judge it; its end states it, with its rate."""
    samples = [Sample("memory_limit_bytes", 24.0 * GIB, T0)]
    samples += [
        Sample("rss_bytes", 10e6 + max(0.0, i * 0.5 - 1.0) * 400e6, T0 + i * 0.5) for i in range(10)
    ]
    live, final = whole_run(samples)
    assert live == []
    (finding,) = final
    assert finding.kind == "host_memory_drift"
    assert float(finding.evidence["slope_bytes_per_hour"]) == pytest.approx(1.44e12, rel=0.1)


def test_a_fast_event_file_is_reported_within_seconds_and_a_burst_is_not() -> None:
    """Image summaries every step: one event file growing 100 GiB/h from 3 s, read every
    0.5 s, no step signal: reported within 5.5 s. A burst of 12 MiB spread over a second
    (an epoch's histograms) on slow scalars is not fast growth."""
    rate = 100 * GIB / 3600
    fast = [
        Sample("event_file_largest_bytes", max(0.0, i * 0.5 - 3.0) * rate, T0 + i * 0.5)
        for i in range(60)
    ]
    report = first_report(UnrotatedEventFileDetector(), fast, every=0.5)
    assert report is not None
    assert report[0] - (T0 + 3.0) <= 5.5
    burst = [
        Sample(
            "event_file_largest_bytes",
            1000.0 * i + min(max(i * 0.5 - 10.0, 0.0), 1.0) * 12 * MIB,
            T0 + i * 0.5,
        )
        for i in range(60)
    ]
    assert first_report(UnrotatedEventFileDetector(), burst, every=0.5) is None


def test_the_end_of_a_run_states_event_file_growth_no_live_window_could_judge() -> None:
    """A 20-s job whose event file grew 3 GB/h (17 MB): no live scale had its windows yet
    (30 s at 5-s windows); at its end, the growth is stated with its rate and projection."""
    rate = 3e9 / 3600
    samples = [Sample("event_file_largest_bytes", i * 0.5 * rate, T0 + i * 0.5) for i in range(41)]
    live, final = whole_run(samples)
    assert live == []
    (finding,) = final
    assert finding.kind == "event_file_unrotated"
    assert finding.evidence["judged_at_end"] == "whole run"
    # The window still open holds a mean of fewer readings: the rate errs a little low.
    assert float(finding.evidence["bytes_per_hour"]) == pytest.approx(3e9, rel=0.15)
    assert "until the run ended" in finding.message


def test_tf_allocator_memory_is_judged_against_its_device() -> None:
    """TensorFlow's allocator on GPU:0 against that GPU's total memory; on the CPU against
    the process's memory limit."""

    def climbing(device: str, limit: Sample) -> Finding:
        samples = [limit, Sample("train_step", 1.0, T0)]
        samples += [
            Sample(
                "tf_allocator_current_bytes",
                2 * GIB + i * 20 * MIB,
                T0 + 2 * i,
                (("device", device),),
            )
            for i in range(100)
        ]
        (detector,) = [d for d in default_detectors() if d.name == "tf_memory_drift"]
        (finding,) = feed(detector, samples).findings
        return finding

    gpu = climbing("GPU:0", Sample("gpu_memory_total_bytes", 16.0 * GIB, T0, (("gpu", "0"),)))
    assert gpu.kind == "tf_memory_drift"
    assert gpu.evidence["limit_bytes"] == 16 * GIB
    cpu = climbing("CPU:0", Sample("memory_limit_bytes", 12.0 * GIB, T0))
    assert cpu.evidence["limit_bytes"] == 12 * GIB
    assert cpu.severity is Severity.CRITICAL
