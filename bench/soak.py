"""Soak benchmark: the daemon through a simulated day with 8 targets, and what
sampling 8 targets once a second costs in real time (and, reported beside it, what the same
8 targets cost while they are young: driftwatch samples a target every 0.5 s in its first 5
minutes).

Run from the repository root::

    .venv/bin/python bench/soak.py                              # the goals (~15 min on 2 cores)
    .venv/bin/python bench/soak.py --hours 2 --cpu-seconds 20   # a quick look
    .venv/bin/python bench/soak.py --tracemalloc                # and what grew (much slower)

Part 1, accelerated. Eight real processes (``sleep``, found by a ``--match`` pattern), four
of them with a hook channel that this script writes on their behalf: one step per simulated
second (about 1 s, lognormal noise), TensorFlow allocator readings every 10 s and an epoch
every 10 minutes, all stamped with the simulated clock. A ``Daemon`` and its ``History`` (a
fresh database) run on that clock, which advances 1 s per tick while the daemon ticks as fast
as it can: every tick reads ``/proc`` for real, reads the channels, runs the detectors and
hands batches to the history writer. The resident set size of this process (the daemon's) is
read after ``--warmup`` simulated hours and at the end; growth beyond 5 MB fails the goal.

Part 2, real time. Eight fresh processes: four ``sleep`` and four running a real
``driftwatch.Hook`` loop (a 0.5 s step; TensorFlow probes off, so no TensorFlow in them). A
new ``Daemon`` with a new ``History`` runs its own loop at a 1 s interval; after it has
found every target and settled (``--settle`` seconds), this process's CPU time (every thread:
sampling, detectors, the history writer) is read over ``--cpu-seconds`` of wall-clock time.
More than 1 % of one core fails the goal; the targets are taken as past their first 5
minutes (``driftwatch.runtime.monitor.YOUNG_SECONDS`` set to 0), as a long job's are. The
same is then measured with the targets young (sampled every 0.5 s), reported against no goal.
No HTTP server runs and nothing scrapes.

Exit status 0 when both goals are met, 1 otherwise.
"""

from __future__ import annotations

import argparse
import logging
import os
import platform
import random
import re
import subprocess
import sys
import tempfile
import threading
import time
import tracemalloc
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import psutil

from driftwatch.channel.paths import ensure_private_dir
from driftwatch.channel.ring import ChannelWriter
from driftwatch.channel.wire import SERIES_META, RecordKind
from driftwatch.daemon.agent import Daemon
from driftwatch.daemon.config import load_config
from driftwatch.findings import Finding
from driftwatch.history.writer import History
from driftwatch.runtime import monitor
from driftwatch.target.pidns import identify

TARGETS = 8
YOUNG_SECONDS = monitor.YOUNG_SECONDS
"""driftwatch's own: how long a target counts as young, in seconds."""
HOOKED = 4
RSS_GROWTH_GOAL = 5e6
CPU_GOAL = 0.01
CHANNEL_RECORDS = 4096
"""Records per synthetic channel: the ring wraps within the first simulated hour. The hook's
default ring (65,536 records, 2.5 MiB) would take 15 simulated hours to wrap at these rates,
its pages becoming resident in the reader as they are first written (bounded, file-backed),
and here twice over: this process is the writer too."""
T0 = 1_800_000_000.0
"""Where the simulated clock starts (2027-01-15)."""
TF_SERIES = [
    ["tf_allocator_current_bytes", {"device": "CPU:0"}],
    ["tf_allocator_peak_bytes", {"device": "CPU:0"}],
]
HOOK_LOOP = """
import sys, time
import driftwatch
hook = driftwatch.Hook(run=sys.argv[1], channel_dir=sys.argv[2],
                       probe_every_steps=10**9, probe_every_seconds=1e9)
while True:
    with hook.step():
        time.sleep(0.5)
"""


class SimulatedClock:
    """Unix time that moves only when told to."""

    def __init__(self, start: float) -> None:
        self.now = start

    def __call__(self) -> float:
        return self.now


class SyntheticHook:
    """The channel a hooked process would write, written here at the simulated clock."""

    def __init__(self, directory: Path, process: psutil.Process, run: str, seed: int) -> None:
        self._writer = ChannelWriter.create(
            directory, identify(process.pid), process.create_time(), CHANNEL_RECORDS
        )
        self._writer.set_meta({"run": run, "pid": process.pid, SERIES_META: TF_SERIES})
        self._random = random.Random(seed)
        self._step = 0

    def write(self, t: float) -> None:
        """What one simulated second of a healthy run leaves in the channel."""
        self._step += 1
        duration = self._random.lognormvariate(0.0, 0.05)
        self._writer.write(RecordKind.STEP, self._step, t, duration, 0.05 * duration)
        if self._step % 10 == 0:
            current = 2e9 + self._random.gauss(0.0, 5e6)
            self._writer.write(RecordKind.VALUE, 0, t, current)
            self._writer.write(RecordKind.VALUE, 1, t, 2.5e9)
        if self._step % 600 == 0:
            self._writer.write(RecordKind.EPOCH, self._step // 600, t, 600.0, 30.0)

    def close(self) -> None:
        self._writer.close()


@contextmanager
def processes(
    commands: list[list[str]], envs: list[dict[str, str]] | None = None
) -> Iterator[list[subprocess.Popen[bytes]]]:
    """Start ``commands`` (each with its environment in ``envs``, if given); kill and reap
    them afterwards."""
    environments = envs if envs is not None else [None] * len(commands)
    started = [subprocess.Popen(c, env=e) for c, e in zip(commands, environments, strict=True)]
    try:
        yield started
    finally:
        for process in started:
            process.kill()
            process.wait()


def unique_sleep() -> tuple[list[str], str]:
    """A sleep command no other process runs, and the pattern that finds it alone."""
    seconds = f"86400.{uuid.uuid4().int % 10**9}"
    return ["sleep", seconds], f"^sleep {re.escape(seconds)}$"


def rss() -> tuple[int, int]:
    """This process's resident set size, and its anonymous part (heap: where leaks show)."""
    with open("/proc/self/status") as status:
        fields = dict(line.split(":", 1) for line in status if line.startswith("Rss"))
    return int(psutil.Process().memory_info().rss), int(fields["RssAnon"].split()[0]) * 1024


def cpu_seconds() -> float:
    times = psutil.Process().cpu_times()
    return float(times.user + times.system)


def db_bytes(db: Path) -> int:
    """The database with its write-ahead log."""
    return sum(p.stat().st_size for p in db.parent.glob(db.name + "*"))


def mb(size: float) -> str:
    return f"{size / 1e6:.1f} MB"


def soak(workdir: Path, hours: float, warmup: float, trace: bool) -> bool:
    """Part 1; prints its figures and returns whether RSS stayed within the goal."""
    command, pattern = unique_sleep()
    channels = ensure_private_dir(workdir / "channels-soak")
    db = workdir / "soak.db"
    clock = SimulatedClock(T0)
    findings: list[tuple[str, Finding]] = []
    with processes([command] * TARGETS) as children:
        hooks = [
            SyntheticHook(channels, psutil.Process(child.pid), f"hooked-{i}", seed=i)
            for i, child in enumerate(children[:HOOKED])
        ]
        history = History(db, clock=clock)
        daemon = Daemon(
            lambda: load_config(None, [pattern], 1.0),
            directories=lambda config: [channels],
            clock=clock,
            on_finding=lambda run, finding: findings.append((run, finding)),
            history=history,
        )
        ticks, warm_ticks = round(hours * 3600), round(warmup * 3600)
        rss_warm = (0, 0)
        started = time.monotonic()
        print(f"soak: {TARGETS} targets ({HOOKED} hooked), {hours:g} simulated hours")
        print(
            "simulated h | real s | ticks/s | watched | RSS | RssAnon | history db | "
            "deferred batches"
        )
        for tick in range(1, ticks + 1):
            for hook in hooks:
                hook.write(clock.now)
            daemon.tick()
            clock.now += 1.0
            if tick == warm_ticks:
                rss_warm = rss()
                if trace:  # what is allocated from here on and still held at the end
                    tracemalloc.start(10)
            if tick % 3600 == 0 or tick == ticks:
                print(progress_line(tick, started, len(daemon.runs), db, history), flush=True)
        rss_end = rss()
        watched = len(daemon.runs)
        if trace:
            print_held_allocations()
        daemon.close()
        history.close()
        for hook in hooks:
            hook.close()
    ok = rss_verdict(rss_warm, rss_end, watched, warmup, hours)
    print(f"history database: {mb(db_bytes(db))} for {TARGETS} runs of {hours:g} h")
    print(f"findings (a healthy soak should raise none): {len(findings)}")
    for run, finding in findings:
        print(f"  {run}: [{finding.severity.value}] {finding.kind}: {finding.message}")
    return ok


def progress_line(tick: int, started: float, watched: int, db: Path, history: History) -> str:
    """A row of the soak's table after ``tick`` simulated seconds (real time since
    ``started``, on the monotonic clock)."""
    elapsed = time.monotonic() - started
    return (
        f"{tick / 3600:11.1f} | {elapsed:6.0f} | {tick / elapsed:7.0f} | "
        f"{watched:7d} | {mb(rss()[0]):>8} | {mb(rss()[1]):>8} | "
        f"{mb(db_bytes(db)):>10} | "
        f"{history.deferred}"
    )


def print_held_allocations() -> None:
    """What was allocated since ``tracemalloc`` started and is still held, by place (the
    12 biggest); stops tracing."""
    print("\nallocated since the warm-up and still held, by place (tracemalloc):")
    for stat in tracemalloc.take_snapshot().statistics("traceback")[:12]:
        print(f"  {stat.size / 1e3:9.1f} kB in {stat.count} blocks")
        for line in stat.traceback.format(limit=6):
            print(f"      {line}")
    tracemalloc.stop()


def rss_verdict(
    rss_warm: tuple[int, int], rss_end: tuple[int, int], watched: int, warmup: float, hours: float
) -> bool:
    """Print RSS (and its anonymous part) after the warm-up and at the end; whether it grew
    less than the goal while every target stayed watched."""
    growth = rss_end[0] - rss_warm[0]
    ok = growth < RSS_GROWTH_GOAL and watched == TARGETS
    print(
        f"\nRSS after {warmup:g} simulated h: {mb(rss_warm[0])} (anonymous {mb(rss_warm[1])}); "
        f"at {hours:g} h: {mb(rss_end[0])} (anonymous {mb(rss_end[1])})"
    )
    print(
        f"RSS growth: {mb(growth)} (anonymous {mb(rss_end[1] - rss_warm[1])}; goal < "
        f"{mb(RSS_GROWTH_GOAL)}): {'met' if ok else 'MISSED'}"
    )
    return ok


def cpu_cost(workdir: Path, settle: float, seconds: float, young: bool) -> bool:
    """Part 2; prints its figures and returns whether the CPU cost stayed within the goal.

    ``young``: the targets are as started, so the daemon samples them every 0.5 s (their first
    5 minutes), and the figure is reported against no goal; else they are taken as past their
    youth, sampled at the configured 1 s as a long job is: the goal applies.
    """
    monitor.YOUNG_SECONDS = YOUNG_SECONDS if young else 0.0
    phase = "young (sampled every 0.5 s)" if young else "past their first 5 minutes, at 1 Hz"
    command, pattern = unique_sleep()
    channels = ensure_private_dir(workdir / f"channels-cpu-{young}")
    hooked = [
        [sys.executable, "-c", HOOK_LOOP, f"hooked-{i}", str(channels)] for i in range(HOOKED)
    ]
    with processes([command] * (TARGETS - HOOKED) + hooked):
        history = History(workdir / f"cpu-{young}.db")
        daemon = Daemon(
            lambda: load_config(None, [pattern], 1.0),
            directories=lambda config: [channels],
            history=history,
        )
        measured: dict[str, float] = {}

        def measure() -> None:
            time.sleep(settle)
            measured["watched"] = len(daemon.runs)
            measured["cpu0"], measured["t0"] = cpu_seconds(), time.monotonic()
            time.sleep(seconds)
            measured["cpu1"], measured["t1"] = cpu_seconds(), time.monotonic()
            daemon.request_stop()

        print(f"\nreal time: {TARGETS} targets ({HOOKED} hooked) {phase}, {seconds:g} s measured")
        meter = threading.Thread(target=measure)
        meter.start()
        daemon.run()
        meter.join()
        history.close()
    wall = measured["t1"] - measured["t0"]
    share = (measured["cpu1"] - measured["cpu0"]) / wall
    ok = (young or share < CPU_GOAL) and measured["watched"] == TARGETS
    print(f"targets watched when measuring: {measured['watched']:.0f}")
    per_second = 2.0 if young else 1.0
    verdict = "no goal" if young else f"goal < {CPU_GOAL:.0%}: {'met' if ok else 'MISSED'}"
    print(
        f"CPU: {measured['cpu1'] - measured['cpu0']:.2f} s in {wall:.1f} s = {share:.2%} of one "
        f"core, {1e3 * share / TARGETS / per_second:.2f} ms per target per tick ({verdict})"
    )
    return ok


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--hours", type=float, default=24.0, help="simulated hours (part 1)")
    parser.add_argument("--warmup", type=float, default=1.0, help="simulated warm-up hours")
    parser.add_argument("--tracemalloc", action="store_true", help="trace what grows (slow)")
    parser.add_argument("--settle", type=float, default=15.0, help="real seconds before part 2")
    parser.add_argument(
        "--cpu-seconds", type=float, default=120.0, help="real seconds measured (part 2)"
    )
    args = parser.parse_args()
    if not 0 < args.warmup < args.hours:
        parser.error("--warmup must be above 0 and below --hours")
    # Without a GPU, each of the 16 monitors says once that NVML is off: noise here.
    logging.getLogger("driftwatch.runtime.monitor").setLevel(logging.ERROR)
    load = os.getloadavg()[0]
    print(
        f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; Python {platform.python_version()}"
        f"; {os.cpu_count()} CPUs; load average {load:.1f}"
    )
    with tempfile.TemporaryDirectory(prefix="driftwatch-soak-") as tmp:
        workdir = Path(tmp)
        memory_ok = soak(workdir, args.hours, args.warmup, args.tracemalloc)
        cpu_ok = cpu_cost(workdir, args.settle, args.cpu_seconds, young=False)
        cpu_cost(workdir, args.settle, args.cpu_seconds, young=True)
    print(f"\nload average at the end: {os.getloadavg()[0]:.1f}")
    return 0 if memory_ok and cpu_ok else 1


if __name__ == "__main__":
    sys.exit(main())
