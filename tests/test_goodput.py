"""Goodput: where a run's wall time went, by phase, and the phases add up
to the wall time watched.

Each test states its trace's expected breakdown in its docstring, worked out by hand from the
trace before the accounting was run. Synthetic traces are the hook's step records (one
``step_seconds`` and one ``step_gap_seconds`` per period) or the event files' samples (one
``step_seconds`` per logged interval, no gap); the last test is a real Keras run with
validation under ``driftwatch run``, read back with ``driftwatch report``.
"""

from __future__ import annotations

import itertools
import json
import math
import os
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from driftwatch.channel.paths import ensure_private_dir
from driftwatch.channel.ring import ChannelWriter
from driftwatch.channel.wire import SERIES_META, RecordKind
from driftwatch.detect.goodput import PHASES, Breakdown, GoodputAccount
from driftwatch.detect.periodic_stalls import PeriodicStallDetector
from driftwatch.runtime.monitor import Monitor
from driftwatch.series import Sample
from driftwatch.sources.hook import HookSource
from driftwatch.target.process import TargetInfo
from driftwatch.view.terminal import render_summary, signal_rows
from tests.conftest import promtool_check_metrics, run_cli
from tests.jobs import Watched
from tests.test_exporter import samples_of, scrape
from tests.test_hook_source import CREATE_TIME, PID, PROCESS
from tests.test_periodic_stalls import logged, paused, replayed, step_times

T0 = 1_700_000_000.0


class Trace:
    """Hook records written as a job runs: ``step`` advances the clock by one period."""

    def __init__(self, account: GoodputAccount, t: float = T0) -> None:
        self.account, self.t = account, t

    def step(self, seconds: float, gap: float = 0.0) -> None:
        self.t += seconds
        self.account.observe(Sample("step_seconds", seconds, self.t))
        self.account.observe(Sample("step_gap_seconds", gap, self.t))

    def pause(self, seconds: float) -> None:
        """Time no record covers (validation, an epoch's end: the hook closes its period)."""
        self.t += seconds


def seconds_of(breakdown: Breakdown | None) -> dict[str, float]:
    assert breakdown is not None
    return dict(breakdown.seconds)


def test_a_hooked_run_with_checkpoints_validation_and_a_hang_adds_up_to_its_wall_time() -> None:
    """5 s of start-up, a first step of 2 s (tracing), then 10 epochs of 100 steps of 0.1 s
    (0.01 s of each outside the train step); step 50 of each epoch also saves a checkpoint
    in a callback (3 s more, outside the step); a 5-s validation after each epoch; after the
    5th validation the job hangs for 200 s before its next step; 4 s after the last
    validation (saving, exiting) the process ends.

    Expected: startup 5 + (2 - 0.1) = 6.9 s; stalled 5 + 200 = 205 s (the 5th validation
    and the hang are one silence, past the stall limit of 120 s: all of it); periodic_stall
    10 x 3 + 8 x 5 = 70 s (the last validation comes after the last step); host_overhead
    1000 x 0.01 + 5 + 4 = 19 s (after the last step: host overhead); productive
    1000 x 0.09 + 0.1 = 90.1 s; 391 s in all, the wall time from start to end; goodput
    90.1 / 391 = 23 %."""
    account = GoodputAccount(started=T0)
    trace = Trace(account)
    trace.pause(5.0)
    trace.step(2.0)
    for epoch in range(10):
        for step in range(1, 101):
            if step == 50:
                trace.step(3.1, gap=3.01)
            else:
                trace.step(0.1, gap=0.01)
        trace.pause(5.0)
        if epoch == 4:
            trace.pause(200.0)
    end = trace.t - 5.0 + 4.0 + 5.0  # the last validation, then 4 s to exit
    seconds = seconds_of(account.breakdown(end, final=True))
    assert seconds == pytest.approx(
        {
            "startup": 6.9,
            "periodic_stall": 70.0,
            "stalled": 205.0,
            "host_overhead": 19.0,
            "productive": 90.1,
            "input_wait": 0.0,
        },
        abs=1e-4,
    )
    assert sum(seconds.values()) == pytest.approx(end - T0, abs=1e-4)
    assert Breakdown(seconds).ratio == pytest.approx(90.1 / 391.0, abs=1e-6)


def test_a_hang_counts_as_stalled_while_it_lasts_and_no_phase_ever_goes_down() -> None:
    """Steps of 0.5 s for a minute, then no step for 300 s, then steps again; read every 1 s
    as a monitor would. Expected: stalled stays 0 until the stall limit (120 s) has passed,
    then counts the whole silence so far (121 s at 121 s) and grows by 1 s a tick; when steps
    come back the silence (300 s less the resuming step's 0.5 s) is stalled; every phase
    only grows from one reading to the next; between readings, what is counted lags the
    wall time by at most one step and one reading (0.5 + 1 s) outside the hang."""
    account = GoodputAccount(started=T0)
    trace = Trace(account)
    readings: list[tuple[float, dict[str, float]]] = []
    for tick in range(1, 600):
        now = T0 + tick
        in_hang = T0 + 60 < now <= T0 + 360
        while trace.t + 0.5 <= now and not in_hang:
            trace.step(0.5, gap=0.05)
        if in_hang and trace.t < T0 + 60:
            trace.step(0.5, gap=0.05)
        if not in_hang and now > T0 + 360 and trace.t < T0 + 360:
            trace.t = T0 + 360 - 0.5  # the hang ends: the next step ends at 360.0
        readings.append((now, seconds_of(account.breakdown(now))))
    for (_, before), (_, after) in itertools.pairwise(readings):
        assert all(after[phase] >= before[phase] for phase in PHASES)
    by_time = dict(readings)
    assert by_time[T0 + 170]["stalled"] == 0
    assert by_time[T0 + 181]["stalled"] == pytest.approx(121.0, abs=1.0)
    assert by_time[T0 + 250]["stalled"] == pytest.approx(190.0, abs=1.0)
    final = by_time[T0 + 599]
    assert final["stalled"] == pytest.approx(299.5, abs=0.6)
    for now, seconds in readings:
        if not T0 + 60 < now <= T0 + 181:
            assert -1e-6 <= now - T0 - sum(seconds.values()) <= 1.5


@pytest.mark.parametrize("every", [1, 10, 100])
def test_a_5_s_validation_every_200_steps_is_a_fifth_of_the_wall_time_whatever_the_logging(
    every: int,
) -> None:
    """The periodic-stall detector's scenario: steps of 0.1 s (mean 0.105 s with rare
    20-fold hiccups), a 5-s validation after every 200th, logged every step (the hook, no
    gap samples here), every 10 or every 100 steps (TensorBoard scalars). Expected:
    periodic_stall about 22 %: the validations, 5 s of every 26 s (19 %), and the hiccups,
    pauses by the same rule (0.2 % of steps lasting 2 s more: 0.004 s per step of 0.13 s on
    average, 3 %); the rest productive, nothing stalled; the phases add up to the span of
    the samples."""
    samples = logged(paused(step_times(20_000, 0.1, seed=1), 200, 5.0), every)
    account = GoodputAccount(started=samples[0].t - samples[0].value * every)
    for sample in samples:
        account.observe(sample)
    breakdown = account.breakdown(samples[-1].t, final=True)
    assert breakdown is not None
    shares = {phase: seconds / breakdown.total for phase, seconds in breakdown.seconds.items()}
    assert 0.20 < shares["periodic_stall"] < 0.25
    assert 0.75 < shares["productive"] < 0.80
    assert shares["stalled"] == 0
    assert breakdown.total == pytest.approx(samples[-1].t - account_start(samples, every))


def account_start(samples: list[Sample], every: int) -> float:
    return samples[0].t - samples[0].value * every


def test_the_hook_records_of_the_checkpoints_example_put_its_checkpoints_in_pauses() -> None:
    """The hook's records of ``examples/checkpoints.py`` (40 s; a checkpoint every 300 steps
    of about 12 ms; tests/data/periodic_stalls). The periodic-stall detector puts the
    checkpoints at 1 % to 10 % of the wall time; 16 of the records do not chain to the one
    before (the ends of ``fit``'s epochs, where the hook closes its period): 7.36 s that no
    record covers. Expected: periodic_stall those 7.36 s and the checkpoints (1 % to 10 % of
    the wall time); start-up about the first record's 1.2 s (tracing the train function);
    the phases add up to the records' span."""
    samples = replayed("checkpoints_hook_steps.json")
    start = samples[0].t - samples[0].value
    account = GoodputAccount(started=start)
    for sample in samples:
        account.observe(sample)
    breakdown = account.breakdown(samples[-1].t, final=True)
    assert breakdown is not None
    checkpoints = breakdown.seconds["periodic_stall"] - 7.36
    assert 0.01 < checkpoints / breakdown.total < 0.1
    assert 1.1 < breakdown.seconds["startup"] < 1.3
    assert breakdown.total == pytest.approx(samples[-1].t - start)


def test_a_run_watched_from_its_middle_has_no_startup() -> None:
    """Records from before monitoring began (the hook's ring keeps them), then 10 s of steps
    of 0.1 s. Expected: no start-up; 10 s productive; the records before the start left
    out."""
    account = GoodputAccount(started=T0)
    trace = Trace(account, t=T0 - 30)
    while trace.t < T0 + 10 - 1e-9:
        trace.step(0.1)
    seconds = seconds_of(account.breakdown(trace.t))
    assert seconds["startup"] == 0
    assert seconds["productive"] == pytest.approx(10.0, abs=0.11)


def test_no_step_no_goodput() -> None:
    """A process that never trains: no breakdown and no samples (the series appear with the
    first step record)."""
    account = GoodputAccount(started=T0)
    assert account.breakdown(T0 + 100) is None
    assert account.samples(T0 + 100) == []


def test_analyze_prints_the_goodput_of_a_samples_file(tmp_path: Path) -> None:
    """A samples file of hook records: 2 s before the first record, 600 steps of 0.1 s with
    a 3-s pause every 100 steps (5 of them between records, as validation is). Expected:
    ``driftwatch analyze`` prints a goodput line: startup 2 s + the first step's excess
    (none: 0.1 s like the rest), periodic stall 15 s, productive 60 s; 77 s in all, 78 %."""
    lines, t = [{"t": T0, "series": "rss_bytes", "value": 1e8}], T0 + 2.0
    for step in range(1, 601):
        t += 0.1
        lines.append({"t": t, "series": "step_seconds", "value": 0.1})
        if step % 100 == 0 and step < 600:
            t += 3.0
    path = tmp_path / "samples.jsonl"
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    result = run_cli("analyze", str(path))
    assert result.returncode == 0, result.stderr
    (line,) = [line for line in result.stdout.splitlines() if line.startswith("goodput:")]
    assert line.startswith("goodput: 78% of 77.0 s: productive 60.0 s (78%), startup 2.0 s")
    assert "periodic stall 15.0 s (19%)" in line


@pytest.mark.tf
def test_a_real_keras_run_with_validation_accounts_for_its_wall_time(
    healthy_scenario: Callable[[str], Watched], tmp_path: Path
) -> None:
    """``driftwatch run`` (default flags) of scenarios/healthy_fit_validation.py for its 20 s
    (the run whose verdict test_scenarios_e2e judges: one job for both): ``fit`` with
    validation after each epoch of 512 batches. Expected, from ``driftwatch report --json``:
    start-up (importing TensorFlow, building the model, tracing the first step) of a second
    or more; periodic_stall (the validations) more than 0; productive steps more than 0;
    nothing stalled; the phases add up to the wall time from the process's start to the last
    sample, within a sampling interval (1 s); the summary printed at the end, the text report
    and the HTML page say the same goodput."""
    run = healthy_scenario("healthy_fit_validation.py")
    printed = (run.stdout + run.stderr).splitlines()
    summary = [line.strip() for line in printed if line.strip().startswith("goodput: ")]
    assert run.db is not None
    db = str(run.db)
    report = run_cli("report", "--json", "--db", db)
    assert report.returncode == 0, report.stderr
    document = json.loads(report.stdout)
    goodput = document["goodput"]
    seconds = goodput["seconds"]
    assert seconds["startup"] > 1.0
    assert seconds["periodic_stall"] > 0
    assert seconds["productive"] > 0
    assert seconds["stalled"] == 0
    watched = document["run"]["last_seen"] - document["run"]["create_time"]
    assert math.isclose(sum(seconds.values()), watched, abs_tol=1.0)
    assert 0 < goodput["ratio"] < 1
    assert summary, printed[-20:]
    assert f"{goodput['ratio']:.0%} of " in summary[-1]
    page = tmp_path / "report.html"
    text = run_cli("report", "--html", str(page), "--db", db)
    assert f"  goodput: {goodput['ratio']:.0%} of " in text.stdout
    html = page.read_text()
    assert "<h2>Goodput</h2>" in html
    assert f"{goodput['ratio']:.0%} of " in html


def test_a_monitor_exports_goodput_counters_that_promtool_accepts(
    tmp_path: Path, promtool: str
) -> None:
    """A hook channel of a process started at 0 s: its first period (1 s, tracing) starts
    at 2 s, then 80 steps of 0.1 s, 0.02 s of each outside the train step; a monitor reads
    it at 12 s. Expected on /metrics, for run "train": startup 2 + 0.9 = 2.9 s, productive
    0.1 + 80 x 0.08 = 6.5 s, host_overhead 80 x 0.02 = 1.6 s, the pauses 0; 11.0 s in all,
    to the last record's end; goodput_ratio 6.5 / 11 = 0.59; promtool finds nothing to
    say of the exposition; the live view's goodput row and the summary read the same."""
    writer = ChannelWriter.create(ensure_private_dir(tmp_path / "dw"), PROCESS, CREATE_TIME)
    t, step = CREATE_TIME + 3.0, 1
    writer.write(RecordKind.STEP, step, t, 1.0, 0.0)
    for _ in range(80):
        t, step = t + 0.1, step + 1
        writer.write(RecordKind.STEP, step, t, 0.1, 0.02)
    info = TargetInfo(PID, CREATE_TIME, "python", ("python",), "ml", os.geteuid())
    monitor = Monitor("train", info, [HookSource(writer.path)], clock=lambda: CREATE_TIME + 12)
    snapshot = monitor.tick()
    text = scrape([snapshot])
    exported = samples_of(text)
    phases = {
        dict(labels)["phase"]: value
        for (name, labels), value in exported.items()
        if name == "driftwatch_wall_seconds_total" and dict(labels)["run"] == "train"
    }
    assert phases == pytest.approx(
        {
            "startup": 2.9,
            "productive": 6.5,
            "host_overhead": 1.6,
            "periodic_stall": 0.0,
            "stalled": 0.0,
            "input_wait": 0.0,
        },
        abs=1e-4,  # the ring stores step times as 32-bit floats
    )
    assert exported[("driftwatch_goodput_ratio", (("run", "train"),))] == pytest.approx(6.5 / 11)
    result = promtool_check_metrics(promtool, text)
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.strip() == "", result.stdout
    assert ("goodput", "59% (6.5 s in steps of 11.0 s)") in signal_rows(snapshot)
    summary = render_summary(snapshot, [], "process 4242 has exited", CREATE_TIME)
    assert "  goodput: 59% of 11.0 s: productive 6.5 s (59%), startup 2.9 s (26%), " in summary


def test_goodput_pauses_inside_steps_are_the_detectors_stalls_even_at_the_bands_edge() -> None:
    """Steps of 2.5 s (the typical step is recomputed by time as well as by count), and every
    25th step a stall of 4 typical steps, give or take a few percent: some just under the
    rule's edge, some just over. The periodic-stall detector and goodput judge each step by
    the same band, so goodput's pauses from the first stall the detector counts to its last
    are exactly those stalls' seconds (their share of that span, times it)."""
    rng = np.random.default_rng(7)
    durations = 2.5 * rng.lognormal(0, 0.05, 1000)
    stalls = durations[24::25]
    stalls[:] = 12.5 * (1 + rng.uniform(-0.005, 0.035, len(stalls)))
    samples = logged(durations, 1)
    detector = PeriodicStallDetector()
    for sample in samples:
        detector.observe(sample)
    (finding,) = detector.evaluate(samples[-1].t).findings
    first, last = finding.since, float(finding.evidence["last_stall_t"])
    counted = float(finding.evidence["share_of_wall_time"]) * (last - first)
    account = GoodputAccount(started=first)  # the steps before it are its reference alone
    for sample in samples:
        if sample.t <= last:
            account.observe(sample)
    breakdown = account.breakdown(last, final=True)
    assert breakdown is not None
    assert breakdown.seconds["periodic_stall"] == pytest.approx(counted, abs=1e-3)


# -- input wait ---------------------------------------------------------------------------


class WaitingRun:
    """A hooked run: 2 s of start-up, then steps of 0.1 s (``gap`` of each outside the train
    step) until ``seconds`` after its start, with the hook's input-wait reading ``share``
    after each step whose number ``reading_after`` picks (step 80 ends 10 s in)."""

    def __init__(
        self,
        share: float,
        reading_after: Callable[[int], bool],
        gap: float = 0.0,
        seconds: int = 40,
    ) -> None:
        self.account = GoodputAccount(started=T0)
        self.trace = Trace(self.account)
        self.trace.pause(2.0)
        self.share, self.reading_after, self.gap = share, reading_after, gap
        self.seconds, self.steps = seconds, 0

    def until(self, now: float) -> None:
        while self.trace.t + 0.1 <= now + 1e-9:
            self.trace.step(0.1, gap=self.gap)
            self.steps += 1
            if self.reading_after(self.steps):
                self.account.observe(Sample("input_wait_share", self.share, self.trace.t))

    def live(self) -> dict[int, dict[str, float]]:
        """Read every second, as a monitor does, then once more as the run ends: the
        readings by second since the start, from the first step's."""
        readings = {}
        for tick in range(1, self.seconds):
            self.until(T0 + tick)
            breakdown = self.account.breakdown(T0 + tick)
            if breakdown is not None:
                readings[tick] = dict(breakdown.seconds)
        return {**readings, self.seconds: self.final()}

    def final(self) -> dict[str, float]:
        end = T0 + self.seconds
        self.until(end)
        return seconds_of(self.account.breakdown(end, final=True))


def every_10_s(step: int) -> bool:
    """The hook's probes: every 10 s (its steps are too slow to make 100 in that time)."""
    return step % 100 == 80


def after_12_steps_then_every_10_s(step: int) -> bool:
    """The hook's probes once input wait is timed from the first step: its first window
    starts after step 2 (the traced step left out) and is read 10 steps later (step 12);
    then every 10 s."""
    return step == 12 or every_10_s(step)


def never(step: int) -> bool:
    return False


def assert_monotone(readings: dict[int, dict[str, float]]) -> None:
    for before, after in itertools.pairwise(readings.values()):
        assert all(after[phase] >= before[phase] - 1e-9 for phase in PHASES)


def test_a_run_waiting_on_input_for_nine_tenths_of_each_step_is_at_most_a_fifth_productive() -> (
    None
):
    """fit over an input pipeline that takes 90 % of each step (waited for inside the train
    function: nothing outside it), the hook's first reading 10 s in, then every 10 s; read
    every second. Expected: 38 s of steps, 34.2 s of them waiting for input. Before the
    first reading the steps are counted productive as they settle (7 s by 9 s in: a run may
    never send a reading); the first reading splits them, and what was already exported
    stays productive (counters never go down), given back by input_wait; from then on each
    reading splits the steps held since the previous one. So productive ends at 7 s, under
    a fifth of the 40 s; input_wait at 34.2 - (7 - 3.8) = 31 s; every phase only grows; the
    phases add up to the 40 s."""
    readings = WaitingRun(0.9, every_10_s).live()
    assert_monotone(readings)
    final = readings[40]
    assert final["productive"] / sum(final.values()) <= 0.20
    assert final["productive"] == pytest.approx(7.0, abs=0.11)
    assert final["input_wait"] == pytest.approx(31.0, abs=0.11)
    assert final["startup"] == pytest.approx(2.0, abs=1e-4)
    assert final["host_overhead"] == pytest.approx(0.0, abs=1e-4)  # the clock's rounding
    assert final["periodic_stall"] == final["stalled"] == 0
    assert sum(final.values()) == pytest.approx(40.0, abs=1e-4)


def test_with_the_hooks_early_first_reading_nine_tenths_of_each_step_is_input_wait() -> None:
    """The same run as the hook reads it: its first reading after step 12 (it starts the
    window 2 steps in and reads it FIRST_INPUT_READING_STEPS later), then every 10 s; read
    every second. Expected: the 1.1 s of steps counted before the first reading is soon
    outgrown, and the run ends split exactly: productive 3.8 s (a tenth of the 38 s of
    steps: goodput 9.5 %), input_wait 34.2 s, startup 2 s; every phase only grows from one
    reading to the next."""
    readings = WaitingRun(0.9, after_12_steps_then_every_10_s).live()
    assert_monotone(readings)
    assert readings[40] == pytest.approx(
        {
            "productive": 3.8,
            "input_wait": 34.2,
            "startup": 2.0,
            "periodic_stall": 0.0,
            "stalled": 0.0,
            "host_overhead": 0.0,
        },
        abs=1e-4,
    )
    assert Breakdown(readings[40]).ratio == pytest.approx(0.095, abs=1e-6)


def test_steps_are_held_between_readings_and_never_shown_productive_before_they_are_split() -> None:
    """The same run: from the first reading on, productive grows by a tenth of each window
    of steps when a reading splits it (held in between): never past a tenth of the steps
    so far once the first reading's 0.9 s is outgrown; the sum of the phases lags the wall
    time by at most a window of steps (10 s) and a step."""
    readings = WaitingRun(0.9, after_12_steps_then_every_10_s).live()
    for tick, seconds in readings.items():
        assert 0 <= tick - sum(seconds.values()) <= 10.1 + 1e-4
        if tick >= 12:
            assert seconds["productive"] <= 0.1 * (tick - 2) + 1e-4


def test_read_only_at_its_end_the_first_window_is_split_too() -> None:
    """The run of the first test, its first reading 10 s in, read only once it has ended
    (``driftwatch analyze`` of a recording): each reading splits the steps since the
    previous one, the first those since the start. Expected: productive 3.8 s, input_wait
    34.2 s."""
    final = WaitingRun(0.9, every_10_s).final()
    assert final["productive"] == pytest.approx(3.8, abs=1e-4)
    assert final["input_wait"] == pytest.approx(34.2, abs=1e-4)


def test_the_wait_comes_out_of_productive_time_never_out_of_host_overhead() -> None:
    """The hook counts a batch's wait inside the step (fit's fetch is in its train function;
    a custom loop's fetch between two steps is taken out of the time outside the step), so
    a reading splits productive time only: 0.01 s of each 0.1-s step outside the step (a
    callback), half of every step waiting (share 0.5). Expected: input_wait 0.05 s of each of
    the 380 steps, host_overhead still 0.01 s a step, productive 0.04 s."""
    final = WaitingRun(0.5, after_12_steps_then_every_10_s, gap=0.01).final()
    assert final["input_wait"] == pytest.approx(380 * 0.05, abs=1e-4)
    assert final["host_overhead"] == pytest.approx(380 * 0.01, abs=1e-4)
    assert final["productive"] == pytest.approx(380 * 0.04, abs=1e-4)


def test_a_run_whose_readings_are_all_zero_ends_as_the_same_run_without_readings() -> None:
    """Readings of 0 (a pipeline always ahead of the steps) move nothing: the run ends with
    the breakdown of the same run that sends none, input_wait 0; every phase only grows."""
    readings = WaitingRun(0.0, after_12_steps_then_every_10_s, gap=0.01).live()
    assert_monotone(readings)
    without = WaitingRun(0.0, never, gap=0.01).final()
    assert readings[40] == pytest.approx(without, abs=1e-9)
    assert without["input_wait"] == 0
    assert without["productive"] == pytest.approx(380 * 0.09, abs=1e-4)


def test_a_run_that_sends_no_reading_holds_nothing_back() -> None:
    """No input-wait reading (event files, a loop not over tf.data, several steps per call):
    nothing is held, each reading lags the wall time by at most a step and the first step
    held for start-up, and input_wait stays 0."""
    readings = WaitingRun(0.9, never, gap=0.01).live()
    for tick, seconds in readings.items():
        assert 0 <= tick - sum(seconds.values()) <= (0.1 if tick > 3 else 1.0) + 1e-4
        assert seconds["input_wait"] == 0


def test_steps_go_on_being_counted_when_the_readings_stop() -> None:
    """Readings of 0.5 after step 10 and 10 s and 20 s in, then none for the 80 s left (the
    job went on in a loop whose input is not timed). Expected: the steps since the last
    reading are held until steps have gone on for INPUT_WAIT_HOLD_SECONDS (30 s) without
    one, then counted as they settled, and from then on as they settle; input_wait half of
    the first 18 s of steps, 9 s; productive the other 89 s of the 98 s of steps."""
    readings = WaitingRun(0.5, lambda step: step in (10, 80, 180), seconds=100).live()
    assert_monotone(readings)
    assert 49 - sum(readings[49].values()) > 20  # held since 20 s in
    for tick in range(52, 100):
        assert 0 <= tick - sum(readings[tick].values()) <= 0.1 + 1e-4
    assert readings[100]["input_wait"] == pytest.approx(9.0, abs=1e-4)
    assert readings[100]["productive"] == pytest.approx(89.0, abs=1e-4)


def test_a_hang_is_stalled_not_input_wait_even_when_the_input_is_what_hung() -> None:
    """Steps of 0.1 s with readings of 0.5 every 100 steps; after 300 steps the input
    pipeline hangs for 200 s inside a step's period (the hook's record of it says 200.1 s),
    and the reading after it says 0.95 of the periods since the previous one waited. Then
    200 more steps. Expected: the 200 s are stalled (no step for longer than the stall
    limit), not input wait: a reading splits only the time in steps since the previous one
    (the 100 steps around the hang: at most their 10 s); the phases add up to the wall
    time."""
    account = GoodputAccount(started=T0)
    trace = Trace(account)
    for step in range(1, 501):
        trace.step(200.1 if step == 350 else 0.1)
        if step % 100 == 0:
            share = 0.95 if step == 400 else 0.5
            account.observe(Sample("input_wait_share", share, trace.t))
    seconds = seconds_of(account.breakdown(trace.t, final=True))
    assert seconds["stalled"] == pytest.approx(200.0, abs=1e-3)
    assert seconds["input_wait"] == pytest.approx(4 * 5.0 + 10.0, abs=1e-3)
    assert sum(seconds.values()) == pytest.approx(trace.t - T0, abs=1e-3)


def test_steps_counted_before_the_first_reading_are_given_back_by_input_wait_not_a_pause() -> None:
    """2 s of start-up, steps of 0.1 s until 8 s in, a 2-s validation (no record covers
    it), then steps again until 40 s; the first reading (0.9) after the first step past the
    validation, then every 10 s; read every second. The first reading splits the 6 s of
    steps already counted productive: what they owe is taken from input_wait's growth, so
    the validation that settles at the same moment keeps its 2 s, and so it ends."""
    account = GoodputAccount(started=T0)
    trace = Trace(account)
    trace.pause(2.0)
    readings, steps = {}, 0
    for tick in range(3, 41):
        while trace.t + 0.1 <= T0 + tick + 1e-6:
            steps += 1
            if steps == 61:  # 8 s in
                trace.pause(2.0)
            trace.step(0.1)
            if steps % 100 == 61:
                account.observe(Sample("input_wait_share", 0.9, trace.t))
        readings[tick] = seconds_of(account.breakdown(T0 + tick, final=tick == 40))
    assert_monotone(readings)
    assert readings[11]["periodic_stall"] == pytest.approx(2.0, abs=1e-4)
    assert readings[40]["periodic_stall"] == pytest.approx(2.0, abs=1e-4)
    assert readings[40]["productive"] == pytest.approx(6.0, abs=0.11)


def test_a_monitor_exports_the_input_wait_the_hook_reads_and_the_live_view_shows_it(
    tmp_path: Path,
) -> None:
    """A hook channel of a process started at 0 s: a first period of 1 s (tracing) starting
    at 2 s, then 80 steps of 0.1 s with nothing outside the step; the hook's input-wait
    reading 0.75 after step 10 and after step 81 (fit, waiting inside its train function); a
    monitor reads it at 12 s. Expected: startup 2 + 0.9 = 2.9 s; the first reading splits
    the first 10 steps (1 s in steps, 1.9 s of periods with the tracing): 0.75 x 1.9 s is
    more than their 1 s, so all of it is input wait; the second the next 71 steps: 0.75 x
    7.1 = 5.325 s. So input_wait 6.325 s, productive 1.775 s, 11 s in all; goodput 16 %;
    the live row and the summary say the input wait."""
    writer = ChannelWriter.create(ensure_private_dir(tmp_path / "dw"), PROCESS, CREATE_TIME)
    writer.set_meta({SERIES_META: [["input_wait_share", {}]]})
    t, step = CREATE_TIME + 3.0, 1
    writer.write(RecordKind.STEP, step, t, 1.0, 0.0)
    for _ in range(80):
        t, step = t + 0.1, step + 1
        writer.write(RecordKind.STEP, step, t, 0.1, 0.0)
        if step in (10, 81):
            writer.write(RecordKind.VALUE, 0, t + 0.05, 0.75)
    info = TargetInfo(PID, CREATE_TIME, "python", ("python",), "ml", os.geteuid())
    monitor = Monitor("train", info, [HookSource(writer.path)], clock=lambda: CREATE_TIME + 12)
    snapshot = monitor.tick()
    exported = samples_of(scrape([snapshot]))
    phases = {
        dict(labels)["phase"]: value
        for (name, labels), value in exported.items()
        if name == "driftwatch_wall_seconds_total" and dict(labels)["run"] == "train"
    }
    assert phases == pytest.approx(
        {
            "startup": 2.9,
            "productive": 1.775,
            "input_wait": 6.325,
            "host_overhead": 0.0,
            "periodic_stall": 0.0,
            "stalled": 0.0,
        },
        abs=1e-4,  # the ring stores step times as 32-bit floats
    )
    assert ("goodput", "16% (1.8 s in steps of 11.0 s; 6.3 s waiting for input)") in (
        signal_rows(snapshot)
    )
    summary = render_summary(snapshot, [], "process 4242 has exited", CREATE_TIME)
    assert "  goodput: 16% of 11.0 s: productive 1.8 s (16%), input wait 6.3 s (57%), " in (summary)
