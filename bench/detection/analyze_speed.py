"""How long does ``driftwatch analyze`` take, and does it cost what the data costs?

Run from the repository root::

    .venv/bin/python bench/detection/analyze_speed.py                # both (3 runs each)
    .venv/bin/python bench/detection/analyze_speed.py --only logdirs  # the gap measurement
    .venv/bin/python bench/detection/analyze_speed.py --profile      # cProfile of the trace

Two measurements, each of a healthy 20 Hz job (50 ms steps, lognormal AR(0.8) noise, a 6 s
checkpoint every 5,000 steps), timing ``driftwatch analyze PATH --json`` as a subprocess
(start-up and import included), wall and CPU seconds (the CPU seconds are what a shared
machine's other work disturbs least), best and median of ``--runs``:

1. A samples file of a day (the goal: a 24-hour, 20 Hz trace analysed in under 10 s):
   one ``step_seconds`` line per step and, every 20 steps, ``rss_bytes`` (10 GiB with a
   150 MiB GC sawtooth) and ``train_step``: 1.73M step lines and 2 x 86,400 others.
2. TensorBoard logdirs of 12 hours of that job (the goal: a gap inside a logdir costs
   nothing), the loss logged every 20 steps as Keras' callback logs it: ``straight``, the 12
   hours in one go; ``resumed``, 6 hours, then the job stopped and resumed 2 days later into
   the same logdir (new event files, steps going on from where they were); ``misdated``,
   the 12 hours in one file whose first record (the writer's ``file_version``) is dated
   3 years earlier. Their runs are interleaved, so the three see the same machine; each
   variant's medians are printed as ratios to the straight one's. Checked: the gap is
   stated (``recording_gap``), no ``stalled`` finding at all, and no warning or critical.
"""

from __future__ import annotations

import argparse
import cProfile
import json
import math
import os
import pstats
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np

from driftwatch.sources.eventfiles import describe

T0 = 1_700_000_000.0
STEP_SECONDS = 0.05
PROBE_EVERY = 20
CHECKPOINT_EVERY = 5000
LOG_EVERY = 20
"""Steps between two logged losses in the logdirs (Keras' ``update_freq``)."""
RESTART_SECONDS = 180.0
"""A resumed job's start-up before its first step (imports, data, restoring a checkpoint):
its writer, created then, dates the new event file's first record."""
GIB = float(1 << 30)
MIB = float(1 << 20)
DAY = 86400.0
YEAR = 365 * DAY


def step_durations(seconds: float, seed: int = 0) -> np.ndarray:
    """Step times of ``seconds`` of the job: lognormal AR(0.8) noise around 50 ms, and a 6-s
    checkpoint every ``CHECKPOINT_EVERY`` steps."""
    rng = np.random.default_rng(seed)
    n = int(seconds / STEP_SECONDS)
    shocks = rng.standard_normal(n) * 0.08 * np.sqrt(1 - 0.8**2)
    log_noise = np.empty(n)
    level = 0.0
    for i, shock in enumerate(shocks.tolist()):  # AR(0.8): a loop, but a cheap one
        level = 0.8 * level + shock
        log_noise[i] = level
    steps = STEP_SECONDS * np.exp(log_noise)
    steps[CHECKPOINT_EVERY - 1 :: CHECKPOINT_EVERY] += 6.0
    return steps


def write_trace(path: Path, seconds: float, seed: int = 0) -> int:
    """Write the samples file; return its number of lines."""
    steps = step_durations(seconds, seed)
    rng = np.random.default_rng(seed + 1)
    n = steps.size
    ends = T0 + np.cumsum(steps)
    probes = np.arange(PROBE_EVERY - 1, n, PROBE_EVERY)
    probe_t = ends[probes]
    sawtooth = 150 * MIB * (((probe_t - T0) / 240.0) % 1.0)
    rss = 10 * GIB + sawtooth + rng.standard_normal(probes.size) * 4 * MIB
    lines = 0
    with path.open("w", encoding="utf-8") as out:
        step_t, step_v = ends.tolist(), steps.tolist()
        probe_values = zip(rss.tolist(), probe_t.tolist(), strict=True)
        probe_at = dict(zip(probes.tolist(), probe_values, strict=True))
        for i, (t, value) in enumerate(zip(step_t, step_v, strict=True)):
            out.write(f'{{"t": {t:.4f}, "series": "step_seconds", "value": {value:.6g}}}\n')
            probe = probe_at.get(i)
            if probe is not None:
                rss_now, at = probe
                out.write(f'{{"t": {at:.4f}, "series": "rss_bytes", "value": {rss_now:.0f}}}\n')
                out.write(f'{{"t": {at:.4f}, "series": "train_step", "value": {i + 1}}}\n')
                lines += 2
        lines += n
    return lines


class EventLog:
    """One TensorBoard event file, written record by record with the wall times given: what a
    TF2 summary writer created at ``created`` writes (its first record, ``file_version``, is
    dated then), at any date. Scalars are ``simple_value`` summaries (TF1's form, which
    tensorboard migrates to TF2's on reading)."""

    _count = 0  # files written by this process: their names must differ

    def __init__(self, directory: Path, created: float) -> None:
        describe()  # tensorboard's protos on their TensorFlow stub, as driftwatch loads them
        from tensorboard.compat.proto import event_pb2
        from tensorboard.summary.writer.record_writer import RecordWriter

        EventLog._count += 1
        directory.mkdir(parents=True, exist_ok=True)
        name = f"events.out.tfevents.{created:.0f}.bench.{os.getpid()}.{EventLog._count}.v2"
        self.path = directory / name
        self._event = event_pb2.Event
        self._records = RecordWriter(self.path.open("wb"))
        self._write(self._event(wall_time=created, file_version="brain.Event:2"))

    def scalar(self, step: int, wall_time: float, tag: str, value: float) -> None:
        event = self._event(wall_time=wall_time, step=step)
        event.summary.value.add(tag=tag, simple_value=value)
        self._write(event)

    def _write(self, event: Any) -> None:
        self._records.write(event.SerializeToString())

    def close(self) -> None:
        self._records.close()


def write_logdir(
    logdir: Path,
    hours: float,
    resumed_after: float = 0.0,
    first_record_dated: float | None = None,
) -> tuple[int, float]:
    """A logdir of ``hours`` of the job, its loss logged every ``LOG_EVERY`` steps in
    ``train/``; return the number of scalars and the last one's wall time.

    ``resumed_after`` seconds: halfway, the job stops and resumes that much later from the
    step it reached, into an event file of its own, whose writer the restarted job created
    ``RESTART_SECONDS`` before that step. ``first_record_dated``: the date of the (one)
    event file's first record, by default that of the start."""
    steps = step_durations(hours * 3600)
    ends = T0 + np.cumsum(steps)
    half = steps.size // 2
    if resumed_after:
        ends[half:] += resumed_after
    loss = 2.0 * np.exp(-np.arange(steps.size) / steps.size)
    log = EventLog(logdir / "train", T0 if first_record_dated is None else first_record_dated)
    scalars, resumed, logged = 0, False, math.nan
    for i in range(LOG_EVERY - 1, steps.size, LOG_EVERY):
        if resumed_after and i >= half and not resumed:
            log.close()
            log = EventLog(logdir / "train", float(ends[half] - steps[half]) - RESTART_SECONDS)
            resumed = True
        logged = float(ends[i])
        log.scalar(i + 1, logged, "batch_loss", float(loss[i]))
        scalars += 1
    log.close()
    return scalars, logged


class Timing(NamedTuple):
    wall: float
    """Seconds of wall time."""
    cpu: float
    """Seconds of CPU time (user and system): what the machine's other work disturbs least."""


def time_cli(path: Path) -> tuple[Timing, list[dict[str, object]]]:
    """The cost of ``driftwatch analyze PATH --json`` and the findings it printed."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-m", "driftwatch", "analyze", str(path), "--json"],
        capture_output=True,
        text=True,
        check=True,
    )
    wall = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime
    found = [json.loads(line) for line in done.stdout.splitlines() if line.strip()]
    return Timing(wall, cpu), found


def profile(path: Path, top: int) -> None:
    """cProfile of the analysis in this process, sorted by own time."""
    from driftwatch.commands.analyze import analyze

    profiler = cProfile.Profile()
    profiler.enable()
    analyze(path)
    profiler.disable()
    pstats.Stats(profiler).sort_stats("tottime").print_stats(top)


def alarms(findings: list[dict[str, object]]) -> list[object]:
    return [f["kind"] for f in findings if f["severity"] != "info"]


def bench_trace(directory: Path, hours: float, runs: int) -> None:
    path = directory / "day.jsonl"
    lines = write_trace(path, hours * 3600)
    size = path.stat().st_size
    print(f"samples file: {lines:,} lines, {size / 1e6:.0f} MB, {hours:g} h at 20 Hz")
    timings = []
    for _ in range(runs):
        timing, findings = time_cli(path)
        timings.append(timing)
        found = alarms(findings) or 0
        print(
            f"  driftwatch analyze: {timing.wall:.2f} s ({timing.cpu:.2f} s CPU), "
            f"warning/critical findings: {found}"
        )
    walls = [t.wall for t in timings]
    cpu = statistics.median(t.cpu for t in timings)
    print(f"  best {min(walls):.2f} s, median {statistics.median(walls):.2f} s ({cpu:.2f} s CPU)")


LOGDIRS: dict[str, dict[str, float]] = {
    "straight": {},
    "resumed": {"resumed_after": 2 * DAY},
    "misdated": {"first_record_dated": T0 - 3 * YEAR},
}
"""The logdir variants: keyword arguments of ``write_logdir``."""


def check_logdir(name: str, findings: list[dict[str, object]], last: float) -> list[str]:
    """What is wrong with a variant's findings: see the module's docstring."""
    problems = [f"{kind} reported" for kind in alarms(findings)]
    kinds = [f["kind"] for f in findings]
    if "stalled" in kinds and "stalled" not in alarms(findings):
        problems.append("stalled reported")
    if name != "straight" and "recording_gap" not in kinds:
        problems.append("the gap is not stated")
    for finding in findings:
        evidence = finding["evidence"]
        assert isinstance(evidence, dict)
        if float(evidence["first_reported"]) > last:
            problems.append(f"{finding['kind']} reported after the last record")
    return problems


def bench_logdirs(directory: Path, hours: float, runs: int) -> bool:
    last: dict[str, float] = {}
    for name, variant in LOGDIRS.items():
        scalars, last[name] = write_logdir(directory / name, hours, **variant)
        print(f"logdir {name}: {scalars:,} scalars over {hours:g} h of steps")
    timings: dict[str, list[Timing]] = {name: [] for name in LOGDIRS}
    ok = True
    for run in range(runs):
        for name in LOGDIRS:
            timing, findings = time_cli(directory / name)
            timings[name].append(timing)
            problems = check_logdir(name, findings, last[name])
            ok = ok and not problems
            if run == 0:
                kinds = ", ".join(str(f["kind"]) for f in findings) or "none"
                print(f"  {name}: findings: {kinds}; {'; '.join(problems) or 'as expected'}")
    wall = {name: statistics.median(t.wall for t in measured) for name, measured in timings.items()}
    cpu = {name: statistics.median(t.cpu for t in measured) for name, measured in timings.items()}
    for name, measured in timings.items():
        shown = ", ".join(f"{t.wall:.2f}" for t in measured)
        print(
            f"  {name}: {shown} s; median {wall[name]:.2f} s, "
            f"{wall[name] / wall['straight']:.2f}x straight; CPU median {cpu[name]:.2f} s, "
            f"{cpu[name] / cpu['straight']:.2f}x straight"
        )
    return ok


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0] if __doc__ else None)
    parser.add_argument("--hours", type=float, default=24.0, help="samples file length (24)")
    parser.add_argument("--logdir-hours", type=float, default=12.0, help="logdirs' steps (12)")
    parser.add_argument("--runs", type=int, default=3, help="timed runs of each (3)")
    parser.add_argument("--only", choices=("trace", "logdirs"), help="one measurement")
    parser.add_argument("--profile", action="store_true", help="cProfile the samples file")
    parser.add_argument("--top", type=int, default=25, help="functions the profile shows")
    args = parser.parse_args()
    ok = True
    with tempfile.TemporaryDirectory() as tmp:
        directory = Path(tmp)
        if args.profile:
            path = directory / "day.jsonl"
            write_trace(path, args.hours * 3600)
            profile(path, args.top)
            return 0
        if args.only != "logdirs":
            bench_trace(directory, args.hours, args.runs)
        if args.only != "trace":
            ok = bench_logdirs(directory, args.logdir_hours, args.runs)
    load = os.getloadavg()[0]
    print(f"({os.cpu_count()} CPUs, load average {load:.2f} at the end)")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
