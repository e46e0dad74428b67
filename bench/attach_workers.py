"""``driftwatch attach`` watching a job of 8 worker processes, beside the same attach of the
same job without workers, in one run: attach's CPU time as a share of one core.

Run from the repository root::

    .venv/bin/python bench/attach_workers.py                        # both phases, ~8 min
    .venv/bin/python bench/attach_workers.py --settled-seconds 60   # a shorter second phase

Two jobs, started together: a Python process that makes a training-like step every
``STEP_SECONDS`` (a little arithmetic, then a sleep) and forks ``--workers`` worker processes
(``multiprocessing``, as a Keras ``PyDataset`` with ``use_multiprocessing=True`` starts its
workers), each making a small batch every ``BATCH_SECONDS`` and exiting once its parent is
gone; and the same job with no worker, the baseline. No TensorFlow: what attach reads of a
process tree is the same, and a real ``fit`` would keep both cores of a small machine busy.
``driftwatch attach PID`` of each, started together, with its defaults (no ``--interval``)
but ``--listen 127.0.0.1:0`` and its history and findings in a temporary directory; its
progress lines go to a file. Each attach's CPU time (user + system, ``/proc/PID/stat``) is
read at the edges of two phases:

1. young: from ``START_UP_SECONDS`` after both attaches serve ``/metrics`` to the jobs' 5th
   minute, while attach samples every 0.5 s (a job's first 5 minutes: the cost right after
   ``attach`` of a fresh job);
2. settled: the next ``--settled-seconds``, at the default 2-s interval (a job attached to
   after its start-up).

At each phase's end each attach's ``/metrics`` is scraped: its ``driftwatch_job_processes``
must be 1 + the job's workers (the whole tree watched).

Exit status 0 when attach of the job with workers uses at most 2 % of a core in both phases
(the goal), 1 when it uses more in one, 2 when the run gave no verdict (an attach exited or
did not count the job's workers).
"""

from __future__ import annotations

import argparse
import os
import platform
import re
import subprocess
import sys
import tempfile
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from driftwatch.runtime.monitor import YOUNG_SECONDS

CPU_GOAL = 0.02
"""attach's CPU time per second of wall time, at most (share of one core)."""
WORKERS = 8
"""Worker processes of the measured job, by default (processes)."""
STEP_SECONDS = 0.1
"""Seconds between two steps of a job's main process (s)."""
BATCH_SECONDS = 0.2
"""Seconds between two batches of a worker (s)."""
START_UP_SECONDS = 10.0
"""Seconds after both attaches serve ``/metrics`` before the young phase starts (s)."""
READY_TIMEOUT = 120.0
"""Seconds to wait for an attach to serve ``/metrics`` (s)."""
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
"""Units of ``utime`` and ``stime`` in ``/proc/PID/stat``, per second."""
PROCESSES_METRIC = "driftwatch_job_processes"
"""attach's count of the job's processes: the target and its descendants."""

JOB = f"""
import multiprocessing, os, sys, time
def work(parent):
    while os.getppid() == parent:
        bytes(sum(range(2000)) % 65536)
        time.sleep({BATCH_SECONDS})
fork = multiprocessing.get_context("fork")
for _ in range(int(sys.argv[1])):
    fork.Process(target=work, args=(os.getpid(),)).start()
while True:
    sum(range(5000))
    time.sleep({STEP_SECONDS})
"""
"""A job of ``argv[1]`` forked workers; runs until killed (its workers then exit)."""


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of process ``pid`` (all its threads), in seconds."""
    with open(f"/proc/{pid}/stat") as file:
        fields = file.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS  # utime, stime: fields 14, 15


@dataclass
class Watch:
    """One job and the attach watching it."""

    workers: int
    job: subprocess.Popen[bytes]
    attach: subprocess.Popen[bytes]
    log: Path
    url: str = ""

    def processes(self) -> float:
        """The job's processes as attach counts them (NaN: not exported or not served)."""
        try:
            with urllib.request.urlopen(self.url, timeout=10) as response:
                text = response.read().decode()
        except OSError:
            return float("nan")
        for line in text.splitlines():
            if line.startswith((PROCESSES_METRIC + "{", PROCESSES_METRIC + " ")):
                return float(line.rsplit(" ", 1)[1])
        return float("nan")


@dataclass(frozen=True, slots=True)
class Phase:
    name: str
    wall: float
    share: dict[int, float]
    """Each attach's CPU time per second of wall time, by its job's workers."""
    processes: dict[int, float]
    """Each attach's count of its job's processes at the phase's end, by its job's workers."""


def start(workers: int, scratch: Path) -> Watch:
    job = subprocess.Popen([sys.executable, "-c", JOB, str(workers)])
    log = scratch / f"attach-{workers}.err"
    with log.open("wb") as err, (scratch / f"attach-{workers}.out").open("wb") as out:
        attach = subprocess.Popen(
            [
                *(sys.executable, "-m", "driftwatch", "attach", str(job.pid)),
                *("--listen", "127.0.0.1:0", "--db", str(scratch / f"history-{workers}.db")),
                *("--findings", str(scratch / f"findings-{workers}.jsonl")),
            ],
            stdout=out,
            stderr=err,
            cwd=scratch,
        )
    return Watch(workers, job, attach, log)


def wait_for_url(watch: Watch) -> bool:
    deadline = time.monotonic() + READY_TIMEOUT
    while time.monotonic() < deadline and watch.attach.poll() is None:
        found = re.search(r"metrics at (\S+)", watch.log.read_text(errors="replace"))
        if found:
            watch.url = found.group(1)
            return True
        time.sleep(0.1)
    return False


def measure(watches: list[Watch], name: str, until: float) -> Phase:
    """Each attach's CPU share from now until the wall-clock time ``until``."""
    cpu0 = {w.workers: cpu_seconds(w.attach.pid) for w in watches}
    started = time.monotonic()
    time.sleep(max(0.0, until - time.time()))
    wall = time.monotonic() - started
    share = {w.workers: (cpu_seconds(w.attach.pid) - cpu0[w.workers]) / wall for w in watches}
    return Phase(name, wall, share, {w.workers: w.processes() for w in watches})


def report(phase: Phase, workers: int) -> bool:
    """Print one phase; whether attach of the job with ``workers`` workers met the goal."""
    measured, baseline = phase.share[workers], phase.share[0]
    print(
        f"{phase.name}, {phase.wall:.0f} s: attach of the job with {workers} workers "
        f"{100 * measured:.2f} % of a core (counted {phase.processes[workers]:g} processes), "
        f"with none {100 * baseline:.2f} % (counted {phase.processes[0]:g}); the workers add "
        f"{100 * (measured - baseline):.2f} points, {measured / baseline:.2f}x"
    )
    return measured <= CPU_GOAL


def run(workers: int, settled_seconds: float, scratch: Path) -> bool | None:
    watches: list[Watch] = []
    try:
        for count in (workers, 0):
            watches.append(start(count, scratch))
        if not all(wait_for_url(w) for w in watches):
            for watch in watches:
                print(f"attach of the job with {watch.workers} workers: {watch.log.read_text()}")
            return None
        youngest = max(_create_time(w.job.pid) for w in watches)
        print(f"both attaches serve /metrics {time.time() - youngest:.1f} s after the jobs start")
        time.sleep(START_UP_SECONDS)
        try:
            phases = [
                measure(watches, "young (samples every 0.5 s)", youngest + YOUNG_SECONDS),
                measure(watches, "settled (samples every 2 s)", time.time() + settled_seconds),
            ]
        except OSError:  # an attach exited and was reaped: its /proc/PID is gone
            print("no verdict: an attach exited before the end")
            return None
        exited = [w.workers for w in watches if w.attach.poll() is not None]
    finally:
        for watch in watches:
            watch.job.kill()
            watch.job.wait()
        for watch in watches:
            try:
                watch.attach.wait(timeout=60)  # attach ends with its job
            except subprocess.TimeoutExpired:
                watch.attach.kill()
                watch.attach.wait()
    met = [report(phase, workers) for phase in phases]
    if exited:
        print(f"no verdict: an attach exited before the end (jobs with {exited} workers)")
        return None
    counted = all(phase.processes[w.workers] == 1 + w.workers for phase in phases for w in watches)
    if not counted:
        print("no verdict: an attach did not count every process of its job")
        return None
    verdict = all(met)
    print(
        f"goal: attach of a job with {workers} worker processes at most "
        f"{100 * CPU_GOAL:g} % of a core, young and settled: {'met' if verdict else 'MISSED'}"
    )
    return verdict


def _create_time(pid: int) -> float:
    """Unix time process ``pid`` started."""
    with open(f"/proc/{pid}/stat") as file:
        ticks = int(file.read().rsplit(")", 1)[1].split()[19])
    with open("/proc/stat") as file:
        boot = next(int(line.split()[1]) for line in file if line.startswith("btime"))
    return boot + ticks / CLOCK_TICKS


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument(
        "--workers", type=int, default=WORKERS, help="worker processes of the measured job"
    )
    parser.add_argument(
        "--settled-seconds", type=float, default=120.0, help="length of the settled phase"
    )
    args = parser.parse_args()
    print(
        f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; Python "
        f"{platform.python_version()}; {os.cpu_count()} CPUs; load average "
        f"{os.getloadavg()[0]:.1f}"
    )
    with tempfile.TemporaryDirectory(prefix="driftwatch-attach-workers-") as tmp:
        verdict = run(args.workers, args.settled_seconds, Path(tmp))
    print(f"load average at the end: {os.getloadavg()[0]:.1f}")
    if verdict is None:
        return 2
    return 0 if verdict else 1


if __name__ == "__main__":
    sys.exit(main())
