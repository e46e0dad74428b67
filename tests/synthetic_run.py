"""A run recorded into a real history at an accelerated clock, with known drifts and findings.

Three hours at 10 s ticks: step time steps up by half at 1:30, RSS leaks 40 MiB/h from the
start, event files grow, uploads run at a steady rate, a thread a minute or so leaks
(100 an hour) while descriptors stay flat. The findings are stated as the
detectors would state them (the detectors themselves are tested on their own).
"""

from __future__ import annotations

import math
from pathlib import Path

from driftwatch.causes import RankedCause
from driftwatch.findings import Finding, Severity
from driftwatch.history.writer import History
from driftwatch.runtime.snapshot import Snapshot
from driftwatch.runtime.store import Store
from driftwatch.series import Sample
from driftwatch.target.process import TargetInfo

START = 1_750_000_000.0
TICK = 10.0
HOURS = 3.0
MIB = 2**20
TARGET = TargetInfo(4321, START - 30, "python", ("python", "train.py", "--token=***"), "ml", 1000)

SLOWDOWN = Finding(
    "abrupt_slowdown",
    Severity.WARNING,
    START + 5400,
    "step time up 50% since 01:30: an input pipeline stall; check the data loader",
    {"ratio": 1.5},
    (
        RankedCause(
            "host_cpu_contention",
            6.2,
            {"cpu_pressure_share_before": 0.1, "cpu_pressure_share_after": 0.72},
        ),
        RankedCause("storage_reads", 1.4, {"read_bytes_per_second_before": 1e6}),
    ),
)
LEAK = Finding(
    "host_memory_drift",
    Severity.WARNING,
    START + 600,
    "RSS grows 40 MiB/h: tensors kept alive; clear lists of outputs",
    {"slope_bytes_per_hour": 40.0 * MIB},
)


def samples_at(t: float) -> list[Sample]:
    hours = (t - START) / 3600
    wobble = math.sin(t / 70.0)
    return [
        Sample("step_seconds", (0.2 if hours < 1.5 else 0.3) * (1 + 0.04 * wobble), t),
        Sample("rss_bytes", (900 + 40 * hours + 3 * wobble) * MIB, t),
        Sample("memory_limit_bytes", 4096.0 * MIB, t),
        Sample("tf_allocator_current_bytes", (300 + 2 * wobble) * MIB, t, (("device", "CPU:0"),)),
        Sample("event_file_bytes", 20 * MIB * hours, t),
        Sample("event_file_largest_bytes", 12 * MIB * hours, t),
        Sample("nondisk_write_bytes", 5 * MIB * hours, t),
        Sample("threads", 20.0 + round(100 * hours), t),
        Sample("threads_limit", 1024.0, t),
        Sample("open_fds", 30.0, t),
        Sample("fd_limit", 1024.0, t),
    ]


def findings_at(t: float) -> tuple[Finding, ...]:
    hours = (t - START) / 3600
    found = []
    if hours >= 1.7:
        found.append(SLOWDOWN)
    if hours >= 0.8:
        severity = Severity.CRITICAL if hours >= 2.5 else Severity.WARNING
        found.append(Finding(LEAK.kind, severity, LEAK.since, LEAK.message, LEAK.evidence))
    return tuple(found)


def record(db: Path, run: str = "train", hours: float = HOURS) -> None:
    """Record the run into ``db``, as ``attach`` would with the history's own writer."""
    history = History(db, clock=lambda: START + hours * 3600)
    recorder = history.recorder(run, TARGET)
    store = Store()
    snapshot = Snapshot(run, TARGET, START, 0, store=store)
    for tick in range(int(hours * 3600 / TICK) + 1):
        t = START + tick * TICK
        store.extend(samples_at(t))
        snapshot = Snapshot(run, TARGET, t, tick + 1, findings=findings_at(t), store=store)
        recorder.publish(snapshot)
    recorder.close(snapshot, "process 4321 has exited")
    history.close()
