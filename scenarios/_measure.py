"""Measures what a scenario does on its own, without driftwatch.

python scenarios/_measure.py [--tmpfs MIB] NAME [program options]

Runs ``scenarios/NAME.py`` with one TensorFlow thread (as the e2e test does) and samples,
every 0.5 s from /proc: its VmRSS, its open descriptors and threads, its descendants (the
live ones' summed PSS, as worker memory, and those exited but not reaped: zombies), and the
bytes under its ``--logdir``. It prints a timeline (every 2 s) and a summary: each figure when
training starts and when it ends, with its slope over training, the event files' total and
largest sizes, and the program's own ``done`` line.

``--tmpfs MIB``: the logdir is a tmpfs of that size, mounted for the run (as root) and
unmounted after, and the program runs from it (its working directory), as
``tests/jobs.py`` runs a verdict with ``filesystem_mib``; the summary then gives the
filesystem's use as ``statvfs`` reads it.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

PERIOD = 0.5
"""Sampling period, in seconds."""
ENV = {
    "TF_CPP_MIN_LOG_LEVEL": "2",
    "CUDA_VISIBLE_DEVICES": "",
    "PYTHONUNBUFFERED": "1",
    "TF_NUM_INTRAOP_THREADS": "1",
    "TF_NUM_INTEROP_THREADS": "1",
}


@dataclass(frozen=True)
class Reading:
    t: float
    rss: float  # MB
    fds: int
    threads: int
    children: int  # live descendants
    zombies: int  # descendants exited and not reaped
    workers: float  # the live descendants' PSS, MB
    logdir: int  # bytes under the logdir
    largest: int  # the largest file under it, bytes
    used: float  # MB used of the logdir's filesystem (statvfs)


def status(pid: int) -> dict[str, str]:
    fields = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        name, _, value = line.partition(":")
        fields[name] = value.strip()
    return fields


def descendants(pid: int) -> list[tuple[int, str]]:
    """Every descendant of ``pid`` with its state letter (``Z``: a zombie)."""
    parents: dict[int, list[tuple[int, str]]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        state, parent = stat.rpartition(")")[2].split()[:2]
        parents.setdefault(int(parent), []).append((int(entry), state))
    found, todo = [], [pid]
    while todo:
        for child in parents.get(todo.pop(), []):
            found.append(child)
            todo.append(child[0])
    return found


def pss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
        if line.startswith("Pss:"):
            return int(line.split()[1]) / 1024
    return 0.0


def logdir_bytes(directory: Path) -> tuple[int, int]:
    """Total and largest file size under ``directory``."""
    sizes = []
    for path in directory.rglob("*"):
        try:
            if path.is_file():
                sizes.append(path.stat().st_size)
        except OSError:  # removed since listed (a checkpoint rotated away)
            continue
    return sum(sizes), max(sizes, default=0)


def used_mb(directory: Path) -> float:
    stats = os.statvfs(directory)
    return (stats.f_blocks - stats.f_bavail) * stats.f_frsize / 1e6


def read(pid: int, t: float, logdir: Path) -> Reading | None:
    try:
        fields = status(pid)
        rss = int(fields["VmRSS"].split()[0]) / 1024
        fds = len(os.listdir(f"/proc/{pid}/fd"))
        tree = descendants(pid)
        workers = 0.0
        for child, state in tree:
            if state != "Z":
                try:
                    workers += pss_mb(child)
                except OSError:  # exited since listed
                    continue
    except (OSError, KeyError):  # gone, or a zombie (no VmRSS) as it exits
        return None
    return Reading(
        t,
        rss,
        fds,
        int(fields["Threads"]),
        sum(1 for _, state in tree if state != "Z"),
        sum(1 for _, state in tree if state == "Z"),
        workers,
        *logdir_bytes(logdir),
        used_mb(logdir),
    )


def change(first: Reading, last: Reading, name: str, unit: str = "") -> str:
    before, after = getattr(first, name), getattr(last, name)
    slope = (after - before) / (last.t - first.t)
    if isinstance(before, int):
        return f"{name} {before} -> {after}{unit} ({slope:+.1f}/s)"
    return f"{name} {before:.0f} -> {after:.0f}{unit} ({slope:+.1f}{unit}/s)"


def workers_change(training: list[Reading]) -> str:
    """The workers' PSS from the first reading that found them (if any) to the last."""
    found = [s for s in training if s.children]
    if len(found) < 2:
        return ""
    return f"; from t={found[0].t:.1f}s " + change(found[0], found[-1], "workers", "MB")


def main() -> None:
    arguments = sys.argv[1:]
    tmpfs_mib = 0
    if arguments[:1] == ["--tmpfs"]:
        tmpfs_mib, arguments = int(arguments[1]), arguments[2:]
    name, *options = arguments
    logdir = Path(tempfile.mkdtemp(prefix=f"measure-{name}-"))
    if tmpfs_mib:
        mount = ["mount", "-t", "tmpfs", "-o", f"size={tmpfs_mib}m", "tmpfs", str(logdir)]
        subprocess.run(mount, check=True)
    try:
        measure(name, options, logdir, tmpfs_mib)
    finally:
        if tmpfs_mib:
            subprocess.run(["umount", "--lazy", str(logdir)], check=True)


def measure(name: str, options: list[str], logdir: Path, tmpfs_mib: int) -> None:
    program = Path(os.environ.get("SCENARIO_DIR", Path(__file__).parent)) / f"{name}.py"
    command = [sys.executable, str(program), "--logdir", str(logdir), *options]
    began = time.monotonic()
    child = subprocess.Popen(
        command,
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, **ENV},
        cwd=logdir if tmpfs_mib else None,
    )
    lines: list[tuple[float, str]] = []

    def collect() -> None:
        assert child.stdout is not None
        for line in child.stdout:
            lines.append((time.monotonic() - began, line.rstrip()))

    reader = threading.Thread(target=collect, daemon=True)
    reader.start()
    samples: list[Reading] = []
    while child.poll() is None:
        reading = read(child.pid, time.monotonic() - began, logdir)
        if reading is not None:
            samples.append(reading)
        time.sleep(PERIOD)
    reader.join(timeout=5)
    wall = time.monotonic() - began
    start = next((t for t, line in lines if line.startswith("training for")), 0.0)
    end = next((t for t, line in lines if line.startswith("done ")), wall)
    for s in samples[::4]:
        print(
            f"t={s.t:5.1f}s rss={s.rss:7.1f}MB fds={s.fds:5d} threads={s.threads:4d} "
            f"children={s.children:3d} zombies={s.zombies:4d} workers={s.workers:7.1f}MB "
            f"logdir={s.logdir / 1e6:7.2f}MB largest={s.largest / 1e6:6.2f}MB"
            + (f" used={s.used:6.1f}MB" if tmpfs_mib else "")
        )
    training = [s for s in samples if start <= s.t <= end]
    if len(training) >= 2:
        first, last = training[0], training[-1]
        span = last.t - first.t
        peak = max(s.rss for s in training)
        print(
            f"training from t={start:.1f}s to t={last.t:.1f}s: "
            + change(first, last, "rss", "MB")
            + f" (peak {peak:.0f}); "
            + "; ".join(change(first, last, figure) for figure in ("fds", "threads", "zombies"))
            + f"; children {first.children} -> {last.children}"
            + workers_change(training)
            + f"; logdir {last.logdir / 1e6:.1f} MB (largest {last.largest / 1e6:.1f} MB, "
            + f"{(last.logdir - first.logdir) / 1e6 / span:+.2f} MB/s)"
            + (
                f"; filesystem used {first.used:.1f} -> {last.used:.1f} MB "
                f"({(last.used - first.used) / span:+.2f} MB/s) of {tmpfs_mib} MiB"
                if tmpfs_mib
                else ""
            )
        )
    total, largest = logdir_bytes(logdir)
    print(f"final logdir {total / 1e6:.2f} MB, largest file {largest / 1e6:.2f} MB")
    for t, line in lines:
        print(f"[{t:5.1f}s] {line}")
    print(f"exit {child.returncode}, wall {wall:.1f} s")


if __name__ == "__main__":
    main()
