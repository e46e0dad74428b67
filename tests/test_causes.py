"""Ranked likely causes of slowdowns and stalls: the signals that moved with them.

The synthetic tests state each scenario's expected verdict with its numbers before the
ranking sees it; the real ones (tests/test_causes_e2e.py) run TensorFlow jobs.
"""

from __future__ import annotations

import itertools
import json
import math
import random
import subprocess

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from driftwatch.causes import CAUSES, USUAL_CAUSES, RankedCause, cause_line
from driftwatch.detect import Engine
from driftwatch.detect.catalog import default_detectors, default_engine
from driftwatch.detect.causes.ranker import CauseRanker
from driftwatch.export.prometheus import DriftwatchCollector
from driftwatch.findings import Finding, Severity
from driftwatch.runtime.monitor import Monitor
from driftwatch.series import Sample
from driftwatch.sources.nvml import NvmlSource
from driftwatch.target.process import TargetInfo
from tests.fake_pynvml import install

PID = 4242
SLOWDOWNS = frozenset({"abrupt_slowdown", "gradual_slowdown"})


def slowdown(since: float) -> Finding:
    return Finding("abrupt_slowdown", Severity.WARNING, since, "steps became slower.", {})


def feed(ranker: CauseRanker, samples: list[Sample]) -> None:
    for sample in sorted(samples, key=lambda s: s.t):
        ranker.observe(sample)


def test_an_input_wait_share_that_rises_is_the_top_cause_with_its_numbers() -> None:
    # Expected: input wait 3 % -> 40 % of each step (score (0.40 - 0.03) / 0.05 = 7.4),
    # ranked above the time outside the step that the wait is part of (gap share minus
    # the wait: 10 % -> 10 %, no cause).
    ranker = CauseRanker()
    samples = []
    for t in range(0, 240):
        wait = 0.03 if t < 120 else 0.40
        step = 0.1 if t < 120 else 0.16
        samples += [
            Sample("step_seconds", step, float(t)),
            Sample("input_wait_share", wait, float(t)),
            Sample("step_gap_seconds", step * (wait + 0.10), float(t)),
        ]
    feed(ranker, samples)
    [found] = ranker.annotate([slowdown(120.0)], 240.0)
    assert [c.cause for c in found.causes] == ["input_wait"]
    top = found.causes[0]
    assert top.numbers["input_wait_share_before"] == pytest.approx(0.03)
    assert top.numbers["input_wait_share_after"] == pytest.approx(0.40)
    assert top.score == pytest.approx(7.4)
    assert "point to waiting for input (input wait share 3% -> 40%, " in found.message


def test_an_input_wait_share_is_averaged_over_time_not_per_reading() -> None:
    # The hook sends a share every 100 steps: 100 a second of fast steps waiting 5 %, then,
    # from 60.5 s, 2 a second of slow ones waiting 90 %. The onset's second, whose last
    # reading is after it, joins the after side whole. Expected: over time, its 0.5 s of
    # fast readings weigh 0.5 s against 19.4 s of slow ones, (0.5 * 0.05 + 19.4 * 0.9) /
    # 19.9 = 0.88 after; per reading they would outweigh them, (50 * 0.05 + 39 * 0.9) / 89
    # = 0.42.
    ranker = CauseRanker()
    fast = [Sample("input_wait_share", 0.05, i / 100) for i in range(6050)]
    slow = [Sample("input_wait_share", 0.9, 60.9 + k / 2) for k in range(39)]
    feed(ranker, fast + slow)
    [found] = ranker.annotate([slowdown(60.5)], 80.0)
    numbers = found.causes[0].numbers
    assert numbers["input_wait_share_before"] == pytest.approx(0.05)
    assert numbers["input_wait_share_after"] == pytest.approx(0.88, abs=0.01)


def test_a_finding_of_another_kind_stays_as_it_was_and_a_quiet_slowdown_says_nothing_moved() -> (
    None
):
    # Expected: the job's CPU time flat at 0.9 cores all along: no cause. The leak is left as
    # it was; the slowdown's message says that no measured signal moved with it, then lists
    # the usual causes of an abrupt slowdown.
    ranker = CauseRanker()
    feed(ranker, [Sample("cpu_seconds", 0.9 * t, float(t)) for t in range(300)])
    leak = Finding("host_memory_drift", Severity.WARNING, 100.0, "RSS grows.", {})
    quiet = slowdown(150.0)
    annotated = ranker.annotate([leak, quiet], 300.0)
    assert annotated[0] == leak
    assert annotated[1].causes == ()
    said = annotated[1].message
    assert said.startswith("steps became slower. No measured signal moved with it. ")
    assert said.endswith(USUAL_CAUSES["abrupt_slowdown"])
    assert "a new data shard" in said


def test_stalls_are_compared_with_the_time_between_them() -> None:
    # Expected: every 30 s a 5-s stall (ending at 30, 60, ...) during which the job reads
    # 50 MiB/s from storage (1 MiB/s between): storage reads, log2(50 / 1) = 5.6.
    ranker = CauseRanker()
    read, samples = 0.0, []
    for t in range(1, 301):
        stalled = (t - 1) % 30 >= 25  # reads in (265, 270] count at 266..270
        read += (50 if stalled else 1) * 2**20
        samples.append(Sample("read_bytes", read, float(t)))
    feed(ranker, samples)
    evidence: dict[str, float | str] = {
        "period_seconds": 30.0,
        "stall_seconds": 5.0,
        "last_stall_t": 270.0,
    }
    stalls = Finding("periodic_stall", Severity.INFO, 30.0, "pauses.", evidence)
    [found] = ranker.annotate([stalls], 300.0)
    assert [c.cause for c in found.causes] == ["storage_reads"]
    numbers = found.causes[0].numbers
    assert numbers["read_bytes_per_second_before"] == pytest.approx(2**20, rel=0.01)
    assert numbers["read_bytes_per_second_after"] == pytest.approx(50 * 2**20, rel=0.1)


def test_retracing_is_counted_per_step_from_the_step_counter() -> None:
    # Expected: 1,000 steps/s for 120 s with one trace, then a trace on every step at
    # 5 steps/s; the tracing count is read every 4 s (as the hook does), steps every 1 s:
    # 0 -> 1 trace per step, score (1 - 0) / 0.01 = 100. (Steps' mean time times the
    # traces' rate said 0.05 on a real run whose after-window began on fast steps.)
    ranker = CauseRanker()
    samples, step, traces = [], 0.0, 1.0
    for t in range(1, 241):
        rate = 1000.0 if t <= 120 else 5.0
        step += rate
        traces += 0.0 if t <= 120 else rate
        samples += [
            Sample("train_step", step, float(t)),
            Sample("step_seconds", 1 / rate, float(t)),
        ]
        if t % 4 == 0:
            samples.append(Sample("tracing_count", traces, float(t)))
    feed(ranker, samples)
    [found] = ranker.annotate([slowdown(120.0)], 240.0)
    top = found.causes[0]
    assert top.cause == "retracing"
    assert top.numbers["traces_per_step_before"] == pytest.approx(0.0)
    assert top.numbers["traces_per_step_after"] == pytest.approx(1.0, rel=0.05)
    assert top.score == pytest.approx(100, rel=0.05)


def test_the_final_evaluation_ranks_causes_again_on_all_of_the_run() -> None:
    # Expected: from 120 s a trace every other second at 1,000 steps/s, from 122 s one a
    # step at 5 steps/s. First stated at 122 s: 1 trace in 2,000 steps, no cause (score
    # 0.05). Ranked again at 127 s, inside the 10-s refresh: as first stated. At the run's
    # end, the same moment: 26 traces in 2,025 steps since the onset, retracing (1.3).
    ranker = CauseRanker()

    def run_until(end: int, start: int = 1) -> list[Sample]:
        samples, step, traces = [], 0.0, 1.0
        for t in range(1, end + 1):
            slow = t > 122
            step += 5.0 if slow else 1000.0
            traces += 5.0 if slow else (0.5 if t > 120 else 0.0)
            if t >= start:
                samples += [Sample("train_step", step, float(t))]
                samples += [Sample("tracing_count", traces, float(t))]
        return samples

    feed(ranker, run_until(122))
    [first] = ranker.annotate([slowdown(120.0)], 122.0)
    assert not first.causes
    feed(ranker, run_until(127, start=123))
    [again] = ranker.annotate([slowdown(120.0)], 127.0)
    assert not again.causes
    [final] = ranker.annotate([slowdown(120.0)], 127.0, final=True)
    assert [c.cause for c in final.causes] == ["retracing"]
    assert final.causes[0].numbers["traces_per_step_after"] == pytest.approx(26 / 2025)


def test_a_rate_before_an_onset_older_than_the_fine_buckets_is_still_measured() -> None:
    # Expected: CPU pressure 0.1 s/s until 450 s, 0.8 s/s after; the run ends at 1,200 s, so
    # the window before the onset lies in the 5-minute buckets alone, and the only one that
    # ends before the onset holds one sample (its last). The rate before runs from the
    # signal's first sample: host contention, 0.1 -> 0.8 s/s. From that bucket alone there is
    # no rate before (a bucket alone has no span), and so no cause.
    ranker = CauseRanker()
    feed(
        ranker,
        [
            Sample(
                "pressure_some_seconds",
                0.1 * t if t < 450 else 45 + 0.8 * (t - 450),
                float(t),
                (("resource", "cpu"),),
            )
            for t in range(1, 1201)
        ],
    )
    [final] = ranker.annotate([slowdown(450.0)], 1200.0, final=True)
    assert [c.cause for c in final.causes] == ["host_cpu_contention"]
    assert final.causes[0].numbers["cpu_pressure_share_before"] == pytest.approx(0.1)


def stalled_at_200_s(ranker: CauseRanker) -> Finding:
    """A run's stall since its last step at 200 s, as judged at 400 s, its causes ranked."""
    evidence: dict[str, float | str] = {"seconds_since_last_step": 200.0}
    stalled = Finding("stalled", Severity.WARNING, 200.0, "no training step.", evidence)
    [found] = ranker.annotate([stalled], 400.0)
    return found


def test_a_stalled_run_is_judged_since_its_last_step() -> None:
    # Expected: the job stops stepping at 200 s while its RSS sits at 97 % of its limit:
    # memory near its limit, (0.97 - 0.85) / 0.05 = 2.4.
    ranker = CauseRanker()
    samples = []
    for t in range(400):
        rss = 0.5 if t < 200 else 0.97
        samples += [Sample("rss_bytes", rss * 8e9, float(t)), Sample("memory_limit_bytes", 8e9, t)]
    feed(ranker, samples)
    found = stalled_at_200_s(ranker)
    assert [c.cause for c in found.causes] == ["memory_near_limit"]
    assert found.causes[0].score == pytest.approx(2.4, rel=0.02)


def ranked_ranks(
    input_share: tuple[float, float], collective_share: tuple[float, float]
) -> list[str]:
    """The causes of an abrupt slowdown at 120 s of a rank of a multi-worker job whose step
    rose from 9 to 115 ms, its input-wait and collective-wait shares before and after."""
    ranker = CauseRanker()
    samples = []
    for t in range(240):
        side = int(t >= 120)
        samples += [
            Sample("step_seconds", (0.009, 0.115)[side], float(t)),
            Sample("input_wait_share", input_share[side], float(t)),
            Sample("collective_wait_share", collective_share[side], float(t)),
        ]
    feed(ranker, samples)
    [found] = ranker.annotate([slowdown(120.0)], 240.0)
    return [c.cause for c in found.causes]


def test_a_rank_waiting_for_a_straggler_names_the_other_ranks_and_the_straggler_its_input() -> None:
    # Expected, as a real 2-worker job measured them (rank 1's map slowed): the rank that
    # waits for the other waits 65 % -> 97 % of its steps at the all-reduce, 6 -> 111 ms a
    # step, all of the step's rise: waiting for the other ranks. The straggler's collective
    # wait stays about 6 ms (65 % -> 6 %) while its input wait makes up the rise.
    assert ranked_ranks((0.01, 0.01), (0.65, 0.97)) == ["collective_wait"]
    assert ranked_ranks((0.01, 0.86), (0.65, 0.06)) == ["input_wait"]


def test_a_stopped_process_is_the_cause_of_its_stall() -> None:
    # Expected: steps until 200 s, the process stopped from 205 s: stopped 195 of the 200 s
    # since its last step, (195 / 200) / 0.25 = 3.9.
    ranker = CauseRanker()
    feed(ranker, [Sample("process_stopped", float(t >= 205), float(t)) for t in range(400)])
    found = stalled_at_200_s(ranker)
    assert [c.cause for c in found.causes] == ["process_stopped"]
    assert found.causes[0].score == pytest.approx(3.9, rel=0.02)
    assert "kill -CONT PID" in found.message


def test_causes_travel_in_the_findings_json_and_name_only_known_causes() -> None:
    cause = RankedCause("retracing", 12.5, {"traces_per_step_before": 0.0})
    finding = Finding("abrupt_slowdown", Severity.WARNING, 1.0, "slower.", {}, (cause,))
    record = json.loads(finding.to_json("r"))
    assert record["evidence"]["causes"] == [
        {"cause": "retracing", "score": 12.5, "numbers": {"traces_per_step_before": 0.0}}
    ]
    assert "tf.function retracing" in cause_line(cause)
    with pytest.raises(ValueError, match="no cause"):
        RankedCause("gremlins", 1.0)
    assert all(spec.title and spec.means and spec.fix for spec in CAUSES.values())


class SlowingSteps:
    """A job's steps, 50 ms at the GPU's full SM clock and slower as it falls (20 a second,
    with 5 % noise), read from the same fake NVML the NVML source reads."""

    name = "steps"

    def __init__(self, nvml: NvmlSource) -> None:
        self._nvml = nvml
        self._random = random.Random(0)

    def sample(self, now: float) -> list[Sample]:
        samples = self._nvml.sample(now)
        clock = next(s.value for s in samples if s.series == "gpu_sm_clock_hertz")
        for i in range(20):
            t = now - 1 + (i + 1) / 20
            step = 0.05 * 1980e6 / clock * (1 + 0.05 * self._random.uniform(-1, 1))
            samples.append(Sample("step_seconds", step, t))
        return samples

    def close(self) -> None:
        self._nvml.close()


def test_thermal_throttling_that_starts_mid_run_is_the_top_cause(
    monkeypatch: pytest.MonkeyPatch, promtool: str
) -> None:
    # Expected: from the 150th reading GPU 0 is throttled for heat all the time (0 -> 100 %)
    # and its SM clock falls from 1980 to 1200 MHz: steps 1.65x slower, an abrupt slowdown
    # whose top cause is gpu_thermal, scored 1 / 0.25 + (1 - 1200 / 1980) / 0.1 = 7.9 once
    # the clock has settled; the power cap on GPU 1 never changed and is no cause.
    fake = install(monkeypatch, "throttling", PID)
    fake.change_from = 150
    target = TargetInfo(PID, 0.0, "python", ("python", "train.py"), "me", 1000)
    clock = itertools.count(1000.0, 1.0)
    monitor = Monitor(
        "train", target, [SlowingSteps(NvmlSource(PID))], default_engine(), clock=clock.__next__
    )
    for _ in range(400):
        snapshot = monitor.tick()
    slow = [f for f in snapshot.findings if f.kind in SLOWDOWNS]
    assert slow, [f.kind for f in snapshot.findings]
    top = slow[0].causes[0]
    assert (top.cause, top.detail) == ("gpu_thermal", "GPU 0")
    assert top.numbers["throttled_share_before"] == 0.0
    assert top.numbers["throttled_share_after"] > 0.9
    assert top.numbers["sm_clock_hertz_before"] == 1980e6
    assert top.numbers["sm_clock_hertz_after"] < 1300e6
    assert top.score > 7
    assert "gpu_power_cap" not in {c.cause for c in slow[0].causes}
    assert "point to gpu clocks throttled by heat on GPU 0" in slow[0].message
    registry = CollectorRegistry(auto_describe=False)
    registry.register(DriftwatchCollector(lambda: [snapshot]))
    text = generate_latest(registry).decode()
    kind = slow[0].kind
    labels = f'cause="gpu_thermal",kind="{kind}",run="train"'
    assert f"driftwatch_finding_cause_rank{{{labels}}} 1.0" in text
    assert f"driftwatch_finding_cause_score{{{labels}}} {top.score}" in text
    done = subprocess.run(
        [promtool, "check", "metrics"], input=text, capture_output=True, text=True, check=False
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.strip() == "", done.stdout
    monitor.close()


def test_the_ranking_adds_no_finding_and_changes_none_of_the_detectors_verdicts() -> None:
    # The same samples through the default engine with and without the ranker: the same
    # findings (kinds, severities, onsets), some of them with causes.
    # From 600 s on: steps 1.8x slower, the node's CPU pressure 0.1 -> 0.8 s/s, the job's
    # CPU time 1 -> 0.5 cores (counters: they add up those rates).
    rng = random.Random(1)
    samples = []
    for t in range(1, 1200):
        step = 0.05 if t < 600 else 0.09
        samples += [
            Sample("step_seconds", step * (1 + 0.05 * rng.random()), t + i / 20) for i in range(20)
        ]
        pressure = 0.1 * t if t < 600 else 60 + 0.8 * (t - 600)
        samples.append(Sample("pressure_some_seconds", pressure, t, (("resource", "cpu"),)))
        samples.append(Sample("cpu_seconds", t if t < 600 else 600 + 0.5 * (t - 600), float(t)))
    plain, ranked = Engine(default_detectors()), default_engine()
    verdicts = []
    for engine in (plain, ranked):
        for sample in samples:
            engine.observe(sample)
        findings = engine.evaluate(1200.0, final=True)
        verdicts.append([(f.kind, f.severity, f.since) for f in findings])
    assert verdicts[0] == verdicts[1]
    assert any(k in SLOWDOWNS for k, _, _ in verdicts[0])
    causes = [f.causes for f in ranked.evaluate(1200.0, final=True) if f.kind in SLOWDOWNS]
    assert causes[0][0].cause == "host_cpu_contention"
    assert not math.isnan(causes[0][0].score)
