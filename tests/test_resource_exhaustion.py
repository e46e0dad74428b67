"""Open descriptors and threads judged as resources a job can run out of: the drift detector
of ``RESOURCES``'s rows, on synthetic samples read every 0.5 s as a young target's are."""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from pathlib import Path

import pytest

from driftwatch.detect.catalog import default_detectors
from driftwatch.detect.memory.drift import ResourceDriftDetector
from driftwatch.detect.memory.resources import RESOURCES
from driftwatch.findings import Finding, Severity
from driftwatch.series import Sample
from driftwatch.units import count_rate, human_count

T0 = 1_700_000_000.0
INTERVAL = 0.5
"""Seconds between readings (a young target's sampling)."""
EVALUATE_EVERY = 1.0
"""Seconds between the detector's evaluations, as the monitor's while sampling fast."""


def run(
    resource: str, level: Callable[[float], float], limit: float, seconds: float
) -> tuple[ResourceDriftDetector, list[tuple[float, Finding]]]:
    """Feed ``level(t - T0)`` every ``INTERVAL`` for ``seconds`` (the first training step
    at T0, the limit once), evaluating every ``EVALUATE_EVERY``; the findings with when."""
    row = RESOURCES[resource]
    assert row.limit_series is not None
    detector = ResourceDriftDetector(row)
    detector.observe(Sample(row.limit_series, limit, T0))
    detector.observe(Sample("train_step", 1.0, T0))
    found: list[tuple[float, Finding]] = []
    next_evaluation = T0
    for i in range(int(seconds / INTERVAL) + 1):
        t = T0 + i * INTERVAL
        detector.observe(Sample(row.signal, float(round(level(t - T0))), t))
        if t >= next_evaluation:
            found += [(t, f) for f in detector.evaluate(t).findings]
            next_evaluation = t + EVALUATE_EVERY
    return detector, found


def leak(start: float, base: float, per_second: float) -> Callable[[float], float]:
    """Flat at ``base`` until ``start`` seconds, then growing by ``per_second``."""
    return lambda s: base + max(0.0, s - start) * per_second


def test_a_steady_descriptor_leak_of_300_a_second_is_critical_within_seconds() -> None:
    # Expected: 6 descriptors for 20 s, then +300/s towards a soft RLIMIT_NOFILE of 4,096
    # (reached 13.6 s into the leak): fd_exhaustion, critical, found before the limit and
    # within 10 s of the leak's start, its time to the limit within 25 % of the truth.
    _, found = run("descriptors", leak(20.0, 6.0, 300.0), 4096.0, 33.0)
    assert found, "no finding before the limit"
    t, finding = found[0]
    assert finding.kind == "fd_exhaustion"
    assert finding.severity is Severity.CRITICAL
    assert t - T0 <= 30.0
    actual = T0 + 20.0 + (4096.0 - 6.0) / 300.0 - t
    assert finding.evidence["seconds_to_limit"] == pytest.approx(actual, rel=0.25)
    assert finding.evidence["limit_fds"] == 4096.0
    assert "300/s" in finding.message
    assert "4,096" in finding.message
    assert "close" in finding.message


def test_a_slower_descriptor_leak_is_found_within_30_seconds_with_its_time_to_the_limit() -> None:
    # Expected: +10/s from 40 descriptors, 30 s in, towards 4,096 (405 s into the leak):
    # critical within 30 s of its start, time to the limit within 25 %.
    _, found = run("descriptors", leak(30.0, 40.0, 10.0), 4096.0, 90.0)
    assert found
    t, finding = found[0]
    assert finding.kind == "fd_exhaustion"
    assert finding.severity is Severity.CRITICAL
    assert t - (T0 + 30.0) <= 30.0
    actual = T0 + 30.0 + (4096.0 - 40.0) / 10.0 - t
    assert finding.evidence["seconds_to_limit"] == pytest.approx(actual, rel=0.25)


def test_a_thread_leak_that_fills_pids_max_within_the_hour_is_critical() -> None:
    # Expected: a thread every 3 s from 15, towards a pids.max of 1,024 (50 minutes away):
    # thread_exhaustion, critical, within 4 minutes (the 20-s windows' trend), the time to
    # the limit within 25 %, told per minute.
    _, found = run("threads", leak(10.0, 15.0, 1.0 / 3), 1024.0, 300.0)
    assert found
    t, finding = found[0]
    assert finding.kind == "thread_exhaustion"
    assert finding.severity is Severity.CRITICAL
    assert t - T0 <= 240.0
    actual = T0 + 10.0 + (1024.0 - 15.0) * 3 - t
    assert finding.evidence["seconds_to_limit"] == pytest.approx(actual, rel=0.25)
    assert re.search(r"growing by (19\.\d|20(\.\d)?)/min", finding.message)
    assert "join" in finding.message.lower()


def test_a_time_to_the_limit_counts_from_the_moment_judged_not_from_the_newest_window() -> None:
    # Expected: a filesystem of 96 MiB filling evenly at 4 MiB/s from 4 s in (full 23.95 s
    # later): disk_exhaustion, its first time to the limit within 5 % of the time left then.
    # The newest window's mean is the level of its middle, a second or more before it is
    # judged: counted from that level, the time reads 1-2 s long.
    mib = float(1 << 20)
    _, found = run("disk", leak(4.0, 0.2 * mib, 4 * mib), 96 * mib, 25.0)
    assert found
    t, finding = found[0]
    assert finding.kind == "disk_exhaustion"
    actual = T0 + 4.0 + (96 - 0.2) / 4 - t
    assert finding.evidence["seconds_to_limit"] == pytest.approx(actual, rel=0.05)


def test_a_thread_pool_warming_up_is_a_step_never_a_leak() -> None:
    # Expected: 15 threads, then 16 more at once (a pool's workers), flat for two hours
    # against a pids.max of 1,024: no finding, live or at the end.
    detector, found = run("threads", lambda s: 15.0 if s < 60 else 31.0, 1024.0, 7200.0)
    assert found == []
    assert detector.conclude(T0 + 7200.0).findings == ()


def test_a_pool_growing_over_a_few_batches_then_flat_is_no_leak() -> None:
    # Expected: 16 threads added one every 0.25 s (a pool spawning workers as work comes),
    # then flat for ten minutes: no finding.
    detector, found = run(
        "threads", lambda s: 15.0 + min(16.0, max(0.0, (s - 30.0) * 4)), 1024.0, 600.0
    )
    assert found == []
    assert detector.conclude(T0 + 600.0).findings == ()


def test_descriptors_opened_once_by_a_data_loader_are_no_leak() -> None:
    # Expected: 12 descriptors, 16 more at once (input files, an event file), flat for an
    # hour and a half against 1,024: no finding.
    detector, found = run("descriptors", lambda s: 12.0 if s < 40 else 28.0, 1024.0, 5400.0)
    assert found == []
    assert detector.conclude(T0 + 5400.0).findings == ()


def test_a_leak_that_ends_with_the_run_is_stated_at_the_end() -> None:
    # Expected: two descriptors a second for 50 s from 10, against 65,536 (far): nothing
    # live reaches the limit within the hour, but the run's end states the growth (100
    # descriptors: more than 4 times the minimum growth), with the time it would have taken.
    detector, found = run("descriptors", leak(10.0, 10.0, 2.0), 65536.0, 60.0)
    assert found == []
    (finding,) = detector.conclude(T0 + 60.0).findings
    assert finding.kind == "fd_exhaustion"
    assert finding.evidence["judged_at_end"] == "whole run"
    assert "would have reached its limit of 65,536" in finding.message


def test_every_resource_is_judged_by_the_default_detectors() -> None:
    judged = {d.name for d in default_detectors()}
    assert {row.kind for row in RESOURCES.values()} <= judged


def test_counts_read_with_thousands_and_rates_per_second_minute_or_hour() -> None:
    assert human_count(4552.0) == "4,552"
    assert count_rate(300.0) == "300/s"
    assert count_rate(1.0 / 3) == "20/min"
    assert count_rate(1.0 / 600) == "6/h"


def test_a_thread_started_every_few_batches_is_critical_within_seconds() -> None:
    # Expected: 15 threads, then +45/s (a never-ending thread every 20 batches of a fast
    # fit) towards an RLIMIT_NPROC of 96,365 (35 minutes away): thread_exhaustion,
    # critical, within 30 s of the leak's start.
    _, found = run("threads", leak(20.0, 15.0, 45.0), 96365.0, 60.0)
    assert found
    t, finding = found[0]
    assert finding.kind == "thread_exhaustion"
    assert finding.severity is Severity.CRITICAL
    assert t - (T0 + 20.0) <= 30.0
    actual = T0 + 20.0 + (96365.0 - 15.0) / 45.0 - t
    assert finding.evidence["seconds_to_limit"] == pytest.approx(actual, rel=0.25)


RECORDED = Path(__file__).parent / "data" / "startup" / "fields"
"""Real jobs' start-ups and first minutes, every process field every 0.5 s (threads among
them; ``bench/detection/record_startup.py --fields``)."""


@pytest.mark.parametrize("path", sorted(RECORDED.glob("*.jsonl")), ids=lambda p: p.stem)
def test_recorded_jobs_threads_climbing_through_their_start_up_are_no_leak(path: Path) -> None:
    # Expected: TensorFlow's pools starting (1 -> 8-26 threads) in fits and custom loops,
    # healthy or leaking memory, judged against a pids.max of 1,024: no thread_exhaustion,
    # live or at the end.
    detector = ResourceDriftDetector(RESOURCES["threads"])
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    detector.observe(Sample("threads_limit", 1024.0, rows[0]["t"]))
    found: list[Finding] = []
    next_evaluation = rows[0]["t"]
    for row in rows:
        if row["series"] in detector.series:
            detector.observe(Sample(row["series"], row["value"], row["t"]))
        if row["t"] >= next_evaluation:
            found += detector.evaluate(row["t"]).findings
            next_evaluation = row["t"] + EVALUATE_EVERY
    assert found == []
    assert detector.conclude(rows[-1]["t"]).findings == ()
