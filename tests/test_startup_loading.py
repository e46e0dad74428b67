"""Start-up told by the process's loading (file-backed memory and reads flat), on real
start-ups recorded with every field the process source reads
(``bench/detection/record_startup.py --fields``, ``tests/data/startup/fields/``): the
healthy ones stay quiet on this host, on a busy one and stretched 2x and 3x; leaks right
after start-up, with no step signal, are reported within seconds of it."""

from __future__ import annotations

import json
import math
from collections import defaultdict
from pathlib import Path

import numpy as np
import pytest

from driftwatch.detect.memory.host import HostMemoryDetector
from driftwatch.detect.memory.startup import (
    LOADING_SERIES,
    QUIET_CPU_SECONDS,
    QUIET_FILE_BYTES,
    QUIET_GROWTH_BYTES,
    QUIET_READ_BYTES,
    QUIET_SECONDS,
    STARTUP_MAX_CPU_SECONDS,
    Loading,
)
from driftwatch.detect.memory.startup import STARTUP_MAX_LOADING_SECONDS as MAX_LOADING
from driftwatch.detect.memory.trends import fresh_rises
from driftwatch.findings import Severity
from driftwatch.series import Sample
from tests.test_detectors import GIB, MIB, T0, first_report, growing, whole_run

FIELDS = Path(__file__).parent / "data" / "startup" / "fields"
REPLAYED = ("rss_bytes", "cpu_seconds", "read_syscall_bytes", "rss_file_bytes", "rss_anon_bytes")
HEALTHY = [
    f"{name}{busy}"
    for name in ("custom_loop", "train_keras", "cnn_fit_validation")
    for busy in ("", "_busy")
]
SUITE_HEALTHY = [
    "scenario_healthy_fit_validation",
    "scenario_healthy_fit_cache",
    "scenario_healthy_loop",
    "scenario_healthy_custom_train_step",
]
"""The failure suite's healthy programs (scenarios/), recorded with the e2e test's one
TensorFlow thread: start-up, then 20 s of training."""
TENSORBOARD_FIT = "scenario_fit_validation_tensorboard"
"""``fit`` with the TensorBoard callback: 2 KB a step, +17 MB linearly over its 20 s."""
TENSORBOARD_FIT_WATCHED = "scenario_fit_validation_tensorboard_watched"
"""The same under ``driftwatch run`` (the hook in it, 3585 steps on a busy host): +12.5 MiB,
with a window whose floor falls 0.9 MiB below the one before it."""


def recorded_fields(name: str, *, slower: float = 1.0, limit: float | None = None) -> list[Sample]:
    """A start-up recorded with its fields, read every 0.5 s; a host ``slower`` times as slow
    stretches it, still read every 0.5 s. Each reading's series share its time."""
    rows = [json.loads(line) for line in (FIELDS / f"{name}.jsonl").read_text().splitlines()]
    start = rows[0]["t"]
    series: dict[str, list[tuple[float, float]]] = defaultdict(list)
    for row in rows[1:]:
        series[row["series"]].append(((row["t"] - start) * slower, row["value"]))
    host = rows[0]["value"] if limit is None else limit
    samples = [Sample("memory_limit_bytes", host, T0)]
    times = [t for t, _ in series["rss_bytes"]]
    for t in np.arange(times[0], times[-1], 0.5):
        for name_ in REPLAYED:
            at, values = zip(*series[name_], strict=True)
            samples.append(Sample(name_, float(np.interp(t, at, values)), T0 + float(t)))
    return samples


def loading(samples: list[Sample]) -> Loading:
    """``Loading`` fed the samples' loading series."""
    loading = Loading()
    for sample in samples:
        if sample.series in LOADING_SERIES:
            loading.reading(sample.series, sample.t, sample.value)
    return loading


def loading_ended(samples: list[Sample]) -> float:
    """When ``Loading`` says the process stopped loading, in seconds from the first reading."""
    return loading(samples).ended_at - T0


CREEP_8GIB = pytest.mark.xfail(
    strict=True,
    reason="the first epochs after start-up add 30 MB in 8 s evenly (2.4 MB/s), then stop: "
    "rapid growth reaching 8 GiB within the hour, reported by main's detector too",
)


@pytest.mark.parametrize(
    ("name", "slower"),
    [
        pytest.param(n, k, marks=CREEP_8GIB if (n, k) == ("cnn_fit_validation", 1.0) else ())
        for n in HEALTHY + SUITE_HEALTHY
        for k in (1.0, 2.0, 3.0)
    ],
)
def test_recorded_start_ups_with_their_loading_raise_no_warning(name: str, slower: float) -> None:
    """Real start-ups (import, model build, tracing, first batches, then a creep), recorded on
    this host and on one made busy (a process spinning on its CPU), and the failure suite's
    healthy programs, replayed as recorded and stretched 2x and 3x, against the host's limit
    and an 8 GiB one: no warning live, none at the end (a settling creep is not steady
    growth)."""
    for limit in (None, 8.0 * GIB):
        live, final = whole_run(recorded_fields(name, slower=slower, limit=limit))
        assert (live, final) == ([], []), (limit, live, final)


@pytest.mark.parametrize("name", HEALTHY)
def test_loading_ends_when_the_climb_has_ended(name: str) -> None:
    """The process stops loading (file-backed memory and reads flat for 2 s and 1 CPU-s) at
    the end of its climb: RSS adds less than 8 % of the level after it, never more than
    5 % before the climb's top (a start-up does not end while it is importing)."""
    samples = recorded_fields(name)
    ended = loading_ended(samples)
    rss = [(s.t - T0, s.value) for s in samples if s.series == "rss_bytes"]
    at_end = next(v for t, v in rss if t >= ended)
    top = max(v for t, v in rss if t <= ended + 3.0)
    assert at_end >= 0.95 * top, (ended, at_end, top)
    assert rss[-1][1] - at_end < 0.08 * at_end, (ended, at_end, rss[-1][1])


@pytest.mark.parametrize("name", ["kept_outputs", "kept_outputs_busy"])
def test_a_recorded_leak_from_the_first_batch_is_reported_within_seconds_without_a_step(
    name: str,
) -> None:
    """A custom loop keeping a 64 KiB tensor per batch in a list: its RSS grows from the
    first batch, right after the start-up climb, with no step signal. Against an 8 GiB limit
    it is reported within 7 s of the process's loading ending, as critical."""
    samples = recorded_fields(name, limit=8.0 * GIB)
    ended = loading_ended(samples)
    report = first_report(HostMemoryDetector(), samples, every=0.5)
    assert report is not None
    when, finding = report
    assert when - T0 - ended <= 7.0, (ended, when - T0)
    assert finding.severity is Severity.CRITICAL


@pytest.mark.parametrize("per_hour", [30 * GIB, 400 * GIB])
@pytest.mark.parametrize("name", ["custom_loop", "train_keras", "cnn_fit_validation_busy"])
def test_a_leak_that_continues_the_climb_is_reported_within_seconds(
    name: str, per_hour: float
) -> None:
    """30 GiB/h or 400 GiB/h from the end of a recorded climb (where the process stopped
    loading), at the climb's pace or faster, no step signal, a 16 GiB limit: reported within
    6.5 s of the onset (30 GiB/h: 5 s after it is measurable above 12 MiB of noise; 400 GiB/h:
    within 4 s), and within 1 s of the process's quiet being known (2 s and 1 CPU-second
    after the onset: 7.5 s on the busy host, where the process got 0.15 CPU-s a second)."""
    samples = recorded_fields(name, limit=16.0 * GIB)
    quiet = loading(samples)
    onset = quiet.ended_at - T0
    report = first_report(HostMemoryDetector(), growing(samples, onset, per_hour), every=0.5)
    assert report is not None
    delay = report[0] - T0 - onset
    known = quiet.decided_at - T0 - onset
    bound = 6.5 if per_hour < 100 * GIB else 4.0
    assert delay <= max(bound, known + 1.0), (delay, known)


def test_a_one_off_jump_right_after_start_up_is_not_steep_growth() -> None:
    """+400 MB within a second, 2 s after the process stopped loading, then flat: no
    warning live or at the end (a reading-by-reading rise must go on for 3 s)."""
    samples = recorded_fields("custom_loop", limit=8.0 * GIB)
    at = loading_ended(samples) + 2.0
    jumped = [
        Sample(s.series, s.value + min(max(s.t - T0 - at, 0.0), 1.0) * 400 * MIB, s.t)
        if s.series == "rss_bytes"
        else s
        for s in samples
    ]
    assert whole_run(jumped) == ([], [])


def test_steep_growth_needs_readings_close_together_and_since_start_up() -> None:
    """Seven readings 60 MB apart: steep growth read 0.5 s apart after start-up ended; not
    when they are 10 s apart (a mature target's interval), nor when they began before it."""
    close = [(T0 + 0.5 * i, 600e6 + 60e6 * i) for i in range(7)]
    assert [t.width for t in fresh_rises(close, T0, HostMemoryDetector().thresholds)] == [0.0]
    sparse = [(T0 + 10.0 * i, 600e6 + 60e6 * i) for i in range(7)]
    assert fresh_rises(sparse, T0, HostMemoryDetector().thresholds) == []
    assert fresh_rises(close, T0 + 1.0, HostMemoryDetector().thresholds) == []


def test_a_process_starved_of_cpu_has_not_stopped_loading() -> None:
    """File-backed memory and reads flat for 10 s while the process got no CPU: it has not
    stopped loading (it did not run); once it has run a CPU-second with them flat, it has,
    from the first reading of that stretch."""
    quiet = Loading()

    def read(t: float, cpu: float) -> None:
        for series, value in zip(LOADING_SERIES, (cpu, 50 * MIB, 360 * MIB), strict=True):
            quiet.reading(series, T0 + t, value)

    for i in range(21):
        read(0.5 * i, 3.0)
    assert quiet.ended_at != quiet.ended_at  # NaN: not yet
    read(11.0, 3.6)
    read(11.5, 4.1)
    assert quiet.ended_at - T0 == 9.5
    assert quiet.decided_at - T0 == 11.5


def test_a_leak_in_a_process_that_barely_runs_is_judged_after_two_minutes() -> None:
    """A process that keeps reading and gets little CPU never looks settled: after
    ``STARTUP_MAX_LOADING_SECONDS`` its RSS is judged all the same (a 30 GiB/h leak against
    a 16 GiB limit is reported within 10 s of that)."""
    samples = [Sample("memory_limit_bytes", 16.0 * GIB, T0)]
    rate = 30 * GIB / 3600
    for i in range(300):
        t = T0 + 0.5 * i
        samples += [
            Sample("rss_bytes", 600 * MIB + rate * 0.5 * i, t),
            Sample("cpu_seconds", 0.01 * i, t),
            Sample("read_syscall_bytes", 2 * MIB * i, t),
            Sample("rss_file_bytes", 360 * MIB, t),
        ]
    report = first_report(HostMemoryDetector(), samples, every=0.5)
    assert report is not None
    assert 120.0 <= report[0] - T0 <= 130.0


def scanned_end(rows: list[tuple[float, float, float, float, float]]) -> tuple[float, float]:
    """(ended_at, decided_at) as a scan of every row kept at every reading finds them (the
    reference ``Loading`` must agree with): rows of (t, CPU seconds, bytes read, file-backed
    bytes, watched memory)."""
    kept: list[tuple[float, float, float, float, float]] = []
    first_cpu = first_t = math.nan
    end: tuple[float, float] | None = None  # ended, decided
    after: list[tuple[float, float, float]] = []  # (t, reads, file) since the end was known
    for row in rows:
        t, cpu, reads, file, level = row
        if math.isnan(first_cpu):
            first_cpu, first_t = cpu, t
        elif cpu - first_cpu >= STARTUP_MAX_CPU_SECONDS or t - first_t >= MAX_LOADING:
            return end or (t, t)
        if end:
            old = [r for r in after if r[0] <= t - QUIET_SECONDS]
            _, read_then, file_then = old[-1] if old else after[0]
            after.append((t, reads, file))
            if file - file_then < QUIET_FILE_BYTES and reads - read_then < QUIET_READ_BYTES:
                continue
            end, kept, after = None, [], []  # it loads again: start-up resumes
        kept = [*kept[-1023:], row]
        base = next(
            (
                r
                for r in reversed(kept)
                if r[0] <= t - QUIET_SECONDS
                and (r[1] <= cpu - QUIET_CPU_SECONDS or r[4] <= level - QUIET_GROWTH_BYTES)
            ),
            None,
        )
        if base is None:
            continue
        kept = kept[kept.index(base) :]
        if file - base[3] < QUIET_FILE_BYTES and reads - base[2] < QUIET_READ_BYTES:
            end, after = (base[0], t), [(t, reads, file)]
    return end or (math.nan, math.nan)


@pytest.mark.parametrize("seed", range(40))
def test_loading_ends_where_a_scan_of_every_row_finds_it(seed: int) -> None:
    """``Loading`` keeps the lowest CPU time and memory of its rows so that a reading with no
    possible base costs no scan (a sleep never runs a CPU second: 1024 rows a tick); the
    start-up's end must be the one the scan finds: starved, busy, leaking and loading
    processes, some past 1024 rows."""
    rng = np.random.default_rng(seed)
    cpu_rate = [0.002, 0.05, 0.6][seed % 3]  # CPU seconds per reading
    rows: list[tuple[float, float, float, float, float]] = []
    t, cpu, reads, file, level = float(T0), 0.0, 0.0, 50.0 * MIB, 200.0 * MIB
    for _ in range(int(rng.integers(20, 1500))):
        t += float(rng.choice([0.1, 0.5, 0.5, 2.0]))
        cpu += cpu_rate * float(rng.random())
        reads += float(rng.random()) * 2 * MIB if rng.random() < 0.1 else 0.0
        file += float(rng.random()) * MIB if rng.random() < 0.05 else 0.0
        level += float(rng.normal(0, 2 * MIB)) + (8 * MIB if rng.random() < 0.03 else 0.0)
        rows.append((t, cpu, reads, file, level))
    checked = Loading()
    for t, cpu, reads, file, level in rows:
        checked.level(level)
        for name, value in zip(LOADING_SERIES, (cpu, reads, file), strict=True):
            checked.reading(name, t, value)
    expected = scanned_end(rows)
    assert (checked.ended_at, checked.decided_at) == pytest.approx(expected, nan_ok=True)


@pytest.mark.parametrize("slower", [1.0, 2.0])
def test_steady_growth_to_the_end_of_a_short_fit_is_stated_at_its_end(slower: float) -> None:
    """``fit`` with the TensorBoard callback: after its start-up RSS grows 17 MB (3 %) evenly
    until the job ends 20 s later, too little and too soon for any live window. Its end
    states it, as recorded and on a host twice as slow, with its rate (3.7 GiB/h as
    recorded), as a warning: at that rate the host's limit and an 8 GiB one are hours
    away."""
    for limit in (None, 8.0 * GIB):
        live, final = whole_run(recorded_fields(TENSORBOARD_FIT, slower=slower, limit=limit))
        assert live == [], limit
        (finding,) = final
        assert finding.kind == "host_memory_drift"
        assert finding.evidence["judged_at_end"] == "whole run"
        assert finding.severity is Severity.WARNING
        per_hour = float(finding.evidence["slope_bytes_per_hour"])
        assert per_hour == pytest.approx(3.7 * GIB / slower, rel=0.15), limit
        assert float(finding.evidence["seconds_to_limit"]) > 3600


@pytest.mark.parametrize("slower", [1.0, 2.0])
def test_steady_growth_with_a_window_that_falls_back_is_stated_at_its_end(slower: float) -> None:
    """Under ``driftwatch run`` on a busy host the callback's growth is smaller (fewer steps)
    and a collection lowers one window's floor below the one before it (Kendall's tau 0.88):
    still even to the end (its newer half rises faster than its older), so stated."""
    live, final = whole_run(recorded_fields(TENSORBOARD_FIT_WATCHED, slower=slower))
    assert live == []
    (finding,) = final
    assert finding.kind == "host_memory_drift"
    assert finding.evidence["judged_at_end"] == "whole run"


def test_steady_growth_stated_at_the_end_is_critical_when_the_limit_was_near() -> None:
    """The same growth against a limit 160 MiB above where it ended: at 1 MB/s it would have
    reached it within minutes, so the end states it as critical."""
    samples = recorded_fields(TENSORBOARD_FIT)
    top = max(s.value for s in samples if s.series == "rss_bytes")
    live, final = whole_run(recorded_fields(TENSORBOARD_FIT, limit=top + 160 * MIB))
    assert live == []
    (finding,) = final
    assert finding.kind == "host_memory_drift"
    assert finding.severity is Severity.CRITICAL
    assert float(finding.evidence["seconds_to_limit"]) < 600


def test_a_start_up_that_loads_again_after_a_pause_is_not_judged_until_it_stops() -> None:
    """Expected: a job starting four data-loader workers on a host where it gets a fifth of
    a core (nine jobs on two cores): its import climbs to 698 MB in 20 s, then for 2 s it
    loads nothing while its RSS jumps 66 MiB (a quiet stretch: its start-up looks over),
    then maps 13 MB more of libraries as its workers start, its RSS rising 44 MB in 6 s
    (26 GiB/h, under an hour from a 23.5 GiB limit), then flat for a minute. Its start-up
    resumes when it loads again: no warning live, none at its end. Seen in the nine-job
    test (the job's file-backed memory 448 -> 461 MB after the pause): with start-up ended
    at the pause, a critical host_memory_drift of 23 GiB/h."""
    samples = [Sample("memory_limit_bytes", 23.5 * GIB, T0)]
    rng = np.random.default_rng(0)

    def stage(t: float) -> tuple[float, float, float]:
        """RSS, file-backed bytes and bytes read at ``t`` seconds."""
        if t < 20:
            return 467 * MIB + 231 * MIB * t / 20, 400 * MIB + 48 * MIB * t / 20, 44 * MIB * t / 20
        if t < 22:
            return 698 * MIB + 66 * MIB * (t - 20) / 2, 448 * MIB, 44 * MIB
        if t < 28:
            return (
                764 * MIB + 44 * MIB * (t - 22) / 6,
                448 * MIB + 13 * MIB * (t - 22) / 6,
                44 * MIB,
            )
        return 808 * MIB, 461 * MIB, 44 * MIB

    for i in range(200):
        t = 0.5 * i
        rss, file, reads = stage(t)
        samples += [
            Sample("rss_bytes", rss + float(rng.normal(0, 0.5 * MIB)), T0 + t),
            Sample("cpu_seconds", 0.2 * t, T0 + t),
            Sample("read_syscall_bytes", reads, T0 + t),
            Sample("rss_file_bytes", file, T0 + t),
        ]
    live, final = whole_run(samples)
    assert (live, final) == ([], [])
