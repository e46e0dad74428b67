from __future__ import annotations

import math
import threading
import time
from dataclasses import replace

import pytest

from driftwatch.detect import Engine, Evaluation
from driftwatch.detect.basic import NonFiniteDetector, StallDetector
from driftwatch.errors import SourceUnavailable, TargetGone
from driftwatch.findings import Finding, Severity
from driftwatch.runtime.monitor import (
    FAST_EVENT_FILE_RATE,
    FAST_HOLD_SECONDS,
    FAST_INTERVAL,
    SETTLED_EVALUATE_SECONDS,
    YOUNG_SECONDS,
    Cadence,
    FastSignals,
    Monitor,
    watch,
)
from driftwatch.runtime.snapshot import Snapshot
from driftwatch.runtime.store import Store
from driftwatch.series import Sample
from driftwatch.target.process import TargetInfo

INFO = TargetInfo(1234, 1.0, "python", ("python", "train.py"), "ml", 1000)


class ScriptedSource:
    """Plays a script: a list of values (one per tick) or an exception to raise."""

    def __init__(self, name: str, series: str, script: list[float | BaseException]) -> None:
        self.name = name
        self.series = series
        self.script = list(script)
        self.closed = 0

    def sample(self, now: float) -> list[Sample]:
        step = self.script.pop(0) if self.script else 0.0
        if isinstance(step, BaseException):
            raise step
        return [Sample(self.series, step, now)]

    def close(self) -> None:
        self.closed += 1


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        self.now += 1.0
        return self.now


def test_unavailable_source_is_switched_off_once_and_others_go_on() -> None:
    gpu = ScriptedSource("nvml", "gpu_process_memory_bytes", [SourceUnavailable("no driver")])
    rss = ScriptedSource("process", "rss_bytes", [1.0, 2.0, 3.0])
    monitor = Monitor("run", INFO, [rss, gpu], clock=Clock())
    for _ in range(3):
        snapshot = monitor.tick()
    assert snapshot.values == {("rss_bytes", ()): 3.0}
    down = {s.name: (s.up, s.reason) for s in snapshot.sources}
    assert down == {"process": (True, ""), "nvml": (False, "no driver")}
    assert gpu.closed == 1
    monitor.close()
    assert rss.closed == 1
    assert gpu.closed == 1


def test_a_failing_source_is_reported_as_an_internal_error(
    caplog: pytest.LogCaptureFixture,
) -> None:
    broken = ScriptedSource("eventfiles", "event_files", [ZeroDivisionError("boom")])
    monitor = Monitor("run", INFO, [broken], clock=Clock())
    snapshot = monitor.tick()
    assert snapshot.sources[0].up is False
    assert "internal error" in snapshot.sources[0].reason
    assert "source eventfiles failed" in caplog.text


def test_target_gone_ends_the_tick() -> None:
    source = ScriptedSource("process", "rss_bytes", [TargetGone(1, "process 1 has exited")])
    monitor = Monitor("run", INFO, [source], clock=Clock())
    with pytest.raises(TargetGone):
        monitor.tick()


def test_recent_median_export_ignores_a_single_slow_step() -> None:
    store = Store()
    for i, value in enumerate([0.01] * 20 + [5.0]):
        store.add(Sample("step_seconds", value, float(i)))
    monitor = Monitor("run", INFO, [], store=store, clock=Clock())
    assert monitor.tick().values[("step_seconds", ())] == 0.01


def test_findings_are_reported_once_per_kind_and_kept() -> None:
    nonfinite = ScriptedSource("eventfiles", "nonfinite_total", [0.0, 2.0, 3.0, 3.0])
    reported: list[Finding] = []
    monitor = Monitor(
        "run",
        INFO,
        [nonfinite],
        Engine([NonFiniteDetector()]),
        clock=Clock(),
        on_finding=reported.append,
    )
    assert monitor.tick().findings == ()
    for _ in range(3):
        snapshot = monitor.tick()
    assert [f.kind for f in reported] == ["nonfinite"]
    assert reported[0].severity is Severity.CRITICAL
    assert reported[0].since == 1003.0  # the first tick that saw one (construction reads 1001)
    assert snapshot.findings[0].evidence == {"nonfinite_values": 3}
    assert "3 non-finite" in snapshot.findings[0].message
    assert snapshot.scores == {"nonfinite": 1.0}
    assert list(monitor.reported) == ["nonfinite"]


class ScriptedDetector:
    """Reports the findings of its script, one tuple per evaluation."""

    name = "scripted"
    series: frozenset[str] = frozenset()

    def __init__(self, script: list[tuple[Finding, ...]]) -> None:
        self.script = list(script)

    def observe(self, sample: Sample) -> None:
        pass

    def evaluate(self, now: float) -> Evaluation:
        return Evaluation(1.0, self.script.pop(0) if self.script else ())


def test_findings_are_told_again_when_they_escalate_or_their_diagnosis_changes() -> None:
    def leak(severity: Severity, leak_class: str, rate: float) -> Finding:
        evidence: dict[str, float | str] = {"leak_class": leak_class, "slope_bytes_per_hour": rate}
        return Finding("host_memory_drift", severity, 1000.0, f"{rate}/h", evidence)

    warning, critical = Severity.WARNING, Severity.CRITICAL
    script = [
        (leak(warning, "unknown", 1.0),),
        (leak(warning, "unknown", 2.0),),  # only numbers moved: not news
        (leak(warning, "tensors_kept_alive", 3.0),),  # the class became known
        (leak(critical, "tensors_kept_alive", 4.0),),  # escalated
        (leak(warning, "tensors_kept_alive", 5.0),),  # on the edge: told before
        (leak(critical, "tensors_kept_alive", 6.0),),
        # Two devices with a finding of one kind: the worse one speaks for the kind.
        (leak(warning, "unknown", 7.0), leak(critical, "tensors_kept_alive", 8.0)),
        (),  # it stops holding: the run's summary keeps its latest state
    ]
    told: list[Finding] = []
    monitor = Monitor(
        "run", INFO, [], Engine([ScriptedDetector(script)]), clock=Clock(), on_finding=told.append
    )
    for _ in script:
        monitor.tick()
    assert [(f.severity, f.evidence["leak_class"]) for f in told] == [
        (warning, "unknown"),
        (warning, "tensors_kept_alive"),
        (critical, "tensors_kept_alive"),
    ]
    assert monitor.reported["host_memory_drift"].message == "8.0/h"


def test_stall_detector_adapts_to_how_often_steps_are_logged() -> None:
    detector = StallDetector(min_seconds=60, factor=10)
    for stamp in range(0, 300, 30):  # a step logged every 30 s, last at 270
        detector.observe(Sample("step_timestamp", float(stamp), float(stamp)))
    assert detector.evaluate(270 + 299).findings == ()  # within 10 x 30 s
    evaluation = detector.evaluate(270 + 301)
    (finding,) = evaluation.findings
    assert evaluation.score > 1
    assert finding.kind == "stalled"
    assert finding.since == 270
    assert finding.evidence["usual_log_interval"] == 30


def test_stall_detector_is_quiet_without_steps() -> None:
    assert StallDetector().evaluate(1e9).findings == ()


def test_watch_returns_why_monitoring_ended_and_closes_sources() -> None:
    source = ScriptedSource("process", "rss_bytes", [1.0, 2.0, TargetGone(7, "process 7 exited")])
    monitor = Monitor("run", INFO, [source], clock=Clock())
    seen: list[Snapshot] = []
    reason = watch(monitor, 0.01, threading.Event(), seen.append)
    assert reason == "process 7 exited"
    assert len(seen) == 2
    assert source.closed == 1


class RecordingSink:
    def __init__(self, name: str, log: list[tuple[str, str, Snapshot]]) -> None:
        self.name = name
        self.log = log

    def publish(self, snapshot: Snapshot) -> None:
        self.log.append((self.name, "publish", snapshot))

    def close(self, snapshot: Snapshot, ended: str) -> None:
        self.log.append((self.name, f"close: {ended}", snapshot))


def test_sinks_receive_each_snapshot_then_the_last_with_why_monitoring_ended() -> None:
    source = ScriptedSource("process", "rss_bytes", [1.0, 2.0, TargetGone(7, "process 7 exited")])
    log: list[tuple[str, str, Snapshot]] = []
    monitor = Monitor(
        "run",
        INFO,
        [source],
        clock=Clock(),
        recorder=RecordingSink("recorder", log),
        sinks=[RecordingSink("view", log)],
    )
    watch(monitor, 0.01, threading.Event())
    events = [(name, event, snapshot.ticks) for name, event, snapshot in log]
    assert events == [
        ("recorder", "publish", 1),
        ("view", "publish", 1),
        ("recorder", "publish", 2),
        ("view", "publish", 2),
        ("recorder", "publish", 3),  # the whole run judged once the target is gone
        ("view", "publish", 3),
        ("recorder", "close: process 7 exited", 3),
        ("view", "close: process 7 exited", 3),
    ]
    assert log[-1][2] is monitor.snapshot
    # Sinks read the run's histories through the snapshot.
    history = monitor.snapshot.store.get(("rss_bytes", ()))
    assert history is not None
    assert (history.first, history.peak, history.count) == ((1002.0, 1.0), 2.0, 2)


class LandingAnnotator:
    """Names a capture in the findings once it has landed, which happens when it settles."""

    def __init__(self) -> None:
        self.landed = False

    def annotate(self, now: float, findings: list[Finding], store: Store) -> list[Finding]:
        if not self.landed:
            return findings
        return [replace(f, evidence={**f.evidence, "capture_trace": "trace"}) for f in findings]

    def settle(self) -> None:
        self.landed = True


def test_evidence_that_lands_as_monitoring_ends_is_in_the_findings_the_sinks_close_with() -> None:
    # Expected: a capture that lands only once the target is gone (a trace the hook wrote
    # last) is named in the last findings the recorder and the other sinks get.
    stalled = Finding("stalled", Severity.WARNING, 1000.0, "no step", {})
    source = ScriptedSource("process", "rss_bytes", [1.0, TargetGone(7, "process 7 exited")])
    log: list[tuple[str, str, Snapshot]] = []
    monitor = Monitor(
        "run",
        INFO,
        [source],
        Engine([ScriptedDetector([(stalled,)] * 5)]),
        clock=Clock(),
        recorder=RecordingSink("recorder", log),
        annotator=LandingAnnotator(),
    )
    watch(monitor, 0.01, threading.Event())
    published = [snapshot for _, event, snapshot in log if event == "publish"]
    assert all("capture_trace" not in f.evidence for s in published for f in s.findings)
    (closed,) = [snapshot for _, event, snapshot in log if event.startswith("close")]
    assert closed.findings[0].evidence == {"capture_trace": "trace"}


def watch_ticks(monitor: Monitor, interval: float, count: int) -> tuple[str | None, list[Snapshot]]:
    """``watch`` stopped after ``count`` ticks: what it returned, and the ticks' snapshots."""
    stop = threading.Event()
    ticks: list[Snapshot] = []

    def on_tick(snapshot: Snapshot) -> None:
        ticks.append(snapshot)
        if len(ticks) == count:
            stop.set()

    return watch(monitor, interval, stop, on_tick), ticks


def test_watch_stops_when_asked() -> None:
    source = ScriptedSource("process", "rss_bytes", [])
    ended, ticks = watch_ticks(Monitor("run", INFO, [source], clock=Clock()), 0.01, 3)
    assert ended is None
    assert len(ticks) == 3


class DrainingSource(ScriptedSource):
    """A source whose data outlives the target (a channel, event files): ``drain`` returns
    its ``rest`` once."""

    def __init__(self, name: str, series: str, rest: float) -> None:
        super().__init__(name, series, [])
        self.rest: list[float] = [rest]

    def sample(self, now: float) -> list[Sample]:
        return []

    def drain(self, now: float) -> list[Sample]:
        return [Sample(self.series, value, now) for value in self.rest[:1]]


class ConcludingDetector(ScriptedDetector):
    """Says nothing live; its verdict on the whole run names the last value it saw."""

    series = frozenset({"hook_nonfinite_total"})

    def __init__(self) -> None:
        super().__init__([])
        self.seen: list[float] = []

    def observe(self, sample: Sample) -> None:
        self.seen.append(sample.value)

    def conclude(self, now: float) -> Evaluation:
        finding = Finding("nonfinite", Severity.CRITICAL, now, f"saw {self.seen}")
        return Evaluation(1.0, (finding,))


def test_a_target_that_exits_has_its_sources_drained_and_the_whole_run_judged() -> None:
    process = ScriptedSource("process", "rss_bytes", [1.0, TargetGone(1234, "exited")])
    hook = DrainingSource("hook", "hook_nonfinite_total", 1.0)
    told: list[Finding] = []
    monitor = Monitor(
        "run",
        INFO,
        [process, hook],
        Engine([ConcludingDetector()]),
        clock=Clock(),
        on_finding=told.append,
    )
    assert monitor.tick().findings == ()
    with pytest.raises(TargetGone):
        monitor.tick()
    assert [f.message for f in told] == ["saw [1.0]"]
    assert monitor.snapshot.findings == tuple(told)
    assert monitor.snapshot.values[("hook_nonfinite_total", ())] == 1.0
    assert process.script == []  # the source that found the target gone is not read again


def test_sampling_is_fast_while_a_target_is_young_then_at_the_interval() -> None:
    cadence = Cadence(2.0, started=1000.0)
    quiet = FastSignals()
    assert cadence.interval(1000.0 + YOUNG_SECONDS - 1, quiet) == FAST_INTERVAL
    assert cadence.interval(1000.0 + YOUNG_SECONDS + 1, quiet) == 2.0
    assert Cadence(0.1, started=1000.0).interval(1001.0, quiet) == 0.1  # never slower


def test_a_settled_targets_detectors_judge_it_every_ten_seconds_or_the_interval() -> None:
    cadence, quiet = Cadence(2.0, started=1000.0), FastSignals()
    assert cadence.evaluate_every(1000.0 + YOUNG_SECONDS - 1, quiet) == 2.0
    settled = 1000.0 + YOUNG_SECONDS + 1
    assert cadence.evaluate_every(settled, quiet) == SETTLED_EVALUATE_SECONDS == 10
    assert Cadence(30.0, started=1000.0).evaluate_every(settled, quiet) == 30.0


def test_memory_heading_for_its_limit_makes_sampling_fast_and_judging_frequent_a_while() -> None:
    cadence = Cadence(2.0, started=0.0)  # settled
    signals = FastSignals()
    now = 10_000.0
    gib = float(1 << 30)
    signals.observe([Sample("memory_limit_bytes", 16 * gib, now), Sample("rss_bytes", gib, now)])
    signals.observe([Sample("rss_bytes", gib + 1e6, now + 2)])  # 0.5 MB/s: 9 h to the limit
    assert cadence.interval(now + 2, signals) == 2.0
    assert cadence.evaluate_every(now + 2, signals) == SETTLED_EVALUATE_SECONDS
    signals.observe([Sample("rss_bytes", gib + 1e6 + 20e6, now + 4)])  # 10 MB/s: 25 min
    assert cadence.interval(now + 4, signals) == FAST_INTERVAL
    assert cadence.evaluate_every(now + 4, signals) == 2.0  # the interval
    later = now + 4 + FAST_HOLD_SECONDS + 1
    assert cadence.interval(later, signals) == 2.0
    assert cadence.evaluate_every(later, signals) == SETTLED_EVALUATE_SECONDS


def test_descriptors_heading_for_their_limit_make_sampling_fast_but_one_opened_does_not() -> None:
    # Expected: against a limit of 1,024, one more descriptor in 2 s (17 minutes away at that
    # pace) is churn; 40 more in 2 s (25 s away) is fast and urgent.
    signals = FastSignals()
    now = 10_000.0
    signals.observe([Sample("fd_limit", 1024.0, now), Sample("open_fds", 100.0, now)])
    signals.observe([Sample("open_fds", 101.0, now + 2)])
    assert signals.last_fast == -math.inf
    signals.observe([Sample("open_fds", 141.0, now + 4)])
    assert signals.last_fast == now + 4
    assert signals.urgent_at(now + 4)


def test_sampling_is_fast_while_event_files_grow_a_gibibyte_an_hour() -> None:
    signals = FastSignals()
    signals.observe([Sample("event_file_bytes", 0.0, 0.0)])
    signals.observe([Sample("event_file_bytes", 0.9 * FAST_EVENT_FILE_RATE, 1.0)])
    assert signals.last_fast == -math.inf
    signals.observe([Sample("event_file_bytes", 2.0 * FAST_EVENT_FILE_RATE, 2.0)])
    assert signals.last_fast == 2.0
    assert not signals.urgent_at(2.0)  # a disk fills in hours: judged at the usual pace


class MemorySource:
    """The process source's memory series, as scripted RSS values against a 16 GiB limit."""

    name = "process"

    def __init__(self, rss: list[float]) -> None:
        self.rss = list(rss)

    def sample(self, now: float) -> list[Sample]:
        limit = Sample("memory_limit_bytes", float(16 << 30), now)
        return [limit, Sample("rss_bytes", self.rss.pop(0), now)]

    def close(self) -> None:
        pass


class CountingDetector(ScriptedDetector):
    """Finds ``evaluated <count>`` at each evaluation."""

    def __init__(self) -> None:
        super().__init__([])
        self.evaluations = 0

    def evaluate(self, now: float) -> Evaluation:
        self.evaluations += 1
        finding = Finding("stalled", Severity.WARNING, now, f"evaluated {self.evaluations}", {})
        return Evaluation(1.0, (finding,))


def test_detectors_judge_every_so_often_and_the_ticks_between_publish_their_last_verdict() -> None:
    times = iter(1000.0 + 0.5 * i for i in range(100))  # sampled every 0.5 s (a young target)
    detector = CountingDetector()
    monitor = Monitor(
        "job",
        INFO,
        [MemorySource([1e9] * 8)],
        Engine([detector]),
        clock=lambda: next(times),
        evaluate_every=2.0,
    )
    messages = [monitor.tick().findings[0].message for _ in range(8)]
    # At the first tick, then 2 s later: the ticks in between publish the last verdict.
    assert messages == ["evaluated 1"] * 4 + ["evaluated 2"] * 4


def test_watch_judges_a_young_target_every_interval_while_sampling_it_faster() -> None:
    """``attach`` and ``run``: a young target is sampled every 0.5 s, judged every 1 s here."""
    detector = CountingDetector()
    info = TargetInfo(1234, time.time(), "python", ("python", "train.py"), "ml", 1000)
    monitor = Monitor("job", info, [MemorySource([1e9] * 10)], Engine([detector]))
    _ended, ticks = watch_ticks(monitor, 1.0, 6)
    assert ticks[-1].t - ticks[0].t == pytest.approx(5 * FAST_INTERVAL, abs=0.2)
    assert detector.evaluations == 3
