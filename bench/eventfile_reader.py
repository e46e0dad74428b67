"""Reading TensorBoard event files: driftwatch's reader and the one it replaced,
side by side in one run.

Run from the repository root (the module form puts this checkout's driftwatch first)::

    .venv/bin/python -m bench.eventfile_reader                  # all three (about 10 min)
    .venv/bin/python -m bench.eventfile_reader --only scalars   # one of attach/images/scalars

The reader replaced is that of ``--base`` (default: the commit before ``records.py`` was
added), exported with ``git archive`` into a temporary directory; each reader runs as a
subprocess with ``PYTHONPATH`` on its own code, start-up included.

1. ``attach``: a real TensorFlow job (a ``tf.function`` training step on a 64x64 weight,
   TF2 summary writer) logs, every step, its loss and an image summary of 4 noise images
   (``--image-side`` pixels square, PNG-encoded once by TensorFlow and written each step
   with ``tf.summary.write`` and the image plugin's metadata: the records
   ``tf.summary.image`` writes), paced to ``--rate`` MB/s for ``--seconds``. ``driftwatch
   attach PID`` (the whole program, defaults: process sampling, the history, the plain
   progress line, a metrics listener) watches it, once with each reader, one job after the
   other. Measured: attach's CPU time over the job's writing (read with psutil when the job
   starts and stops writing) as a share of one core, the step attach had read when the job
   stopped (scraped), and the last step of attach's end-of-run summary against the job's
   last logged step. The same attach of an idle process (``sleep``) over the same time is
   driftwatch's cost without event files. The old reader's attach is stopped
   ``--drain-seconds`` after the job ends if it has not finished reading by then.
2. ``images``: ``driftwatch analyze --json`` of a logdir of ``--image-gb`` GB of such image
   summaries and a loss scalar per step (written here with tensorboard's record writer, in
   TF2's form), with each reader: wall and CPU seconds, and the findings, compared line by
   line. The new reader is also timed with the files dropped from the page cache first
   (``posix_fadvise(DONTNEED)``, these files only): what a logdir read from the disk costs.
3. ``scalars``: the same for a 12-h logdir of the 20 Hz job of
   ``bench/detection/analyze_speed.py``, its loss logged every 10 steps as TF2 tensor
   scalars (86,400 events).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import resource
import statistics
import struct
import subprocess
import sys
import tempfile
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import google_crc32c
import numpy as np
import psutil

from bench.detection.analyze_speed import T0, step_durations
from driftwatch.sources.eventfiles import describe
from driftwatch.sources.scalars import masked

REPO = Path(__file__).resolve().parent.parent
TF_ENV = {"TF_CPP_MIN_LOG_LEVEL": "2", "CUDA_VISIBLE_DEVICES": "", "PYTHONUNBUFFERED": "1"}
IMAGES_PER_STEP = 4
SCALAR_LOG_EVERY = 10
"""Steps of the 20 Hz job between two logged losses in the scalar logdir."""

JOB = r"""
import sys, time
import numpy as np
import tensorflow as tf
from tensorboard.plugins.image import metadata as image_metadata

logdir, side = sys.argv[1], int(sys.argv[4])
rate, seconds = float(sys.argv[2]) * 1e6, float(sys.argv[3])
rng = np.random.default_rng(0)
images = rng.integers(0, 256, (4, side, side, 3), dtype=np.uint8)
encoded = tf.concat(
    [tf.constant([str(side).encode()] * 2), [tf.image.encode_png(image) for image in images]], 0
)
per_step = int(tf.reduce_sum(tf.strings.length(encoded)))
metadata = image_metadata.create_summary_metadata(display_name=None, description=None)
w = tf.Variable(tf.ones([64, 64]) / 64)
writer = tf.summary.create_file_writer(logdir)


@tf.function
@tf.autograph.experimental.do_not_convert
def train_step(step):
    with tf.GradientTape() as tape:
        loss = tf.reduce_mean(tf.square(tf.matmul(w, w) - 1.0))
    w.assign_sub(0.01 * tape.gradient(loss, w))
    tf.summary.write("samples", encoded, step=step, metadata=metadata.SerializeToString())
    tf.summary.scalar("loss", loss, step=step)


with writer.as_default():
    train_step(tf.constant(0, tf.int64))
    writer.flush()
    print("writing", per_step, flush=True)
    start = time.monotonic()
    step = 0
    while time.monotonic() - start < seconds:
        step += 1
        train_step(tf.constant(step, tf.int64))
        ahead = step * per_step / rate - (time.monotonic() - start)
        if ahead > 0:
            time.sleep(ahead)
    writer.close()
elapsed = time.monotonic() - start
print(f"done {step} {step * per_step / elapsed / 1e6:.1f}", flush=True)
"""


def export_base(base: str, into: Path) -> Path:
    """The package as of ``base``, exported into ``into``; its root (for ``PYTHONPATH``)."""
    if not base:
        added = subprocess.run(
            ["git", "log", "--diff-filter=A", "--format=%H", "--", "driftwatch/sources/records.py"],
            cwd=REPO,
            capture_output=True,
            text=True,
            check=True,
        ).stdout.split()
        base = f"{added[-1]}^" if added else "HEAD"
    archive = subprocess.run(
        ["git", "archive", "--format=tar", base, "driftwatch"], cwd=REPO, capture_output=True
    )
    if archive.returncode != 0:
        sys.exit(f"cannot export {base}: {archive.stderr.decode().strip()}")
    into.mkdir(parents=True)
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive.stdout, check=True)
    commit = subprocess.run(
        ["git", "rev-parse", "--short", base], cwd=REPO, capture_output=True, text=True
    )
    print(f"the reader replaced: {commit.stdout.strip()}")
    return into


@dataclass(frozen=True)
class Reader:
    name: str
    code: Path  # the PYTHONPATH its driftwatch is imported from

    def env(self, data_home: Path) -> dict[str, str]:
        return {**os.environ, "PYTHONPATH": str(self.code), "XDG_DATA_HOME": str(data_home)}


class Writer:
    """An event file written record by record as TF2's summary writer writes it."""

    def __init__(self, directory: Path, created: float) -> None:
        describe()
        from tensorboard.compat.proto import event_pb2
        from tensorboard.plugins.image import metadata as image_metadata
        from tensorboard.plugins.scalar import metadata as scalar_metadata
        from tensorboard.util import tensor_util

        directory.mkdir(parents=True, exist_ok=True)
        self._event = event_pb2.Event
        self._tensor = tensor_util.make_tensor_proto
        self._scalar_metadata = scalar_metadata.create_summary_metadata("", "")
        self._image_metadata = image_metadata.create_summary_metadata(None, None)
        path = directory / f"events.out.tfevents.{created:.0f}.bench.{os.getpid()}.v2"
        self._file = path.open("wb")
        self._write(self._event(wall_time=created, file_version="brain.Event:2"))

    def scalar(self, step: int, wall_time: float, tag: str, value: float) -> None:
        event = self._event(wall_time=wall_time, step=step)
        summary = event.summary.value.add(tag=tag, metadata=self._scalar_metadata)
        summary.tensor.CopyFrom(self._tensor(np.float32(value)))
        self._write(event)

    def images(self, step: int, wall_time: float, tag: str, encoded: list[bytes]) -> None:
        event = self._event(wall_time=wall_time, step=step)
        summary = event.summary.value.add(tag=tag, metadata=self._image_metadata)
        summary.tensor.CopyFrom(self._tensor(encoded))
        self._write(event)

    def _write(self, event: Any) -> None:
        """One TFRecord (tensorboard's writer checksums in pure Python: 7 MB/s)."""
        data = event.SerializeToString()
        length = struct.pack("<Q", len(data))
        crc = masked(google_crc32c.value)
        self._file.write(length + struct.pack("<I", crc(length)))
        self._file.write(data + struct.pack("<I", crc(data)))

    def close(self) -> None:
        self._file.close()


def write_image_logdir(logdir: Path, gigabytes: float, side: int) -> int:
    """Steps of image summaries (and a loss each) until ``gigabytes``; their number."""
    rng = np.random.default_rng(0)
    # Noise does not compress: a PNG of it is as large as its pixels.
    encoded = [str(side).encode()] * 2 + [
        rng.bytes(side * side * 3) for _ in range(IMAGES_PER_STEP)
    ]
    per_step = sum(map(len, encoded))
    steps = int(gigabytes * 1e9 / per_step)
    log = Writer(logdir / "train", T0)
    for step in range(1, steps + 1):
        t = T0 + 0.5 * step
        log.images(step, t, "samples", encoded)
        log.scalar(step, t + 0.01, "loss", 2.0 / (1 + step / steps))
    log.close()
    return steps


def write_scalar_logdir(logdir: Path, hours: float) -> int:
    """The 20 Hz job's loss every ``SCALAR_LOG_EVERY`` steps for ``hours``; the events."""
    ends = T0 + np.cumsum(step_durations(hours * 3600))
    log = Writer(logdir / "train", T0)
    logged = range(SCALAR_LOG_EVERY - 1, ends.size, SCALAR_LOG_EVERY)
    for i in logged:
        log.scalar(i + 1, float(ends[i]), "batch_loss", 2.0 * float(np.exp(-i / ends.size)))
    log.close()
    return len(logged)


def drop_from_page_cache(logdir: Path) -> None:
    for path in logdir.rglob("events.out.tfevents.*"):
        fd = os.open(path, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


@dataclass(frozen=True)
class Timed:
    wall: float
    cpu: float
    findings: list[str]  # the JSON lines


def time_analyze(reader: Reader, logdir: Path, scratch: Path) -> Timed:
    """``driftwatch analyze LOGDIR --json`` with ``reader``: its wall and CPU seconds (the
    child's own, from ``wait4``) and its findings."""
    out = scratch / "analyze.out"
    with out.open("wb") as stdout:
        started = time.perf_counter()
        analyze = subprocess.Popen(
            [sys.executable, "-m", "driftwatch", "analyze", str(logdir), "--json"],
            stdout=stdout,
            cwd=scratch,
            env=reader.env(scratch),
        )
        _pid, status, usage = os.wait4(analyze.pid, 0)
        wall = time.perf_counter() - started
    analyze.returncode = os.waitstatus_to_exitcode(status)
    if analyze.returncode != 0:
        sys.exit(f"analyze with the {reader.name} reader failed ({analyze.returncode})")
    lines = out.read_text().splitlines()
    return Timed(wall, usage.ru_utime + usage.ru_stime, [line for line in lines if line.strip()])


def bench_analyze(
    name: str, logdir: Path, readers: list[Reader], runs: list[int], scratch: Path, cold: bool
) -> bool:
    """Time each reader on ``logdir`` (``runs`` times each); whether every run's findings
    equal those of the last reader (the old one)."""
    size = sum(p.stat().st_size for p in logdir.rglob("*") if p.is_file())
    timed: dict[str, list[Timed]] = {}
    for reader, n in zip(readers, runs, strict=True):
        timed[reader.name] = [time_analyze(reader, logdir, scratch) for _ in range(n)]
        if cold and reader is readers[0]:
            timed["new, cold cache"] = []
            for _ in range(n):
                drop_from_page_cache(logdir)
                timed["new, cold cache"].append(time_analyze(reader, logdir, scratch))
    reference = timed[readers[-1].name][0].findings
    same = all(t.findings == reference for runs_ in timed.values() for t in runs_)
    kinds = [json.loads(line)["kind"] for line in reference]
    print(
        f"{name}: {size / 1e6:,.0f} MB; findings: {', '.join(kinds) or 'none'}; "
        f"{'the same' if same else 'NOT the same'} with every reader and run"
    )
    medians = {key: statistics.median(t.wall for t in runs_) for key, runs_ in timed.items()}
    old = medians[readers[-1].name]
    for key, runs_ in timed.items():
        walls = ", ".join(f"{t.wall:.2f}" for t in runs_)
        cpu = statistics.median(t.cpu for t in runs_)
        print(
            f"  {key:16} wall {walls} s (median {medians[key]:.2f} s, "
            f"{size / 1e6 / medians[key]:,.0f} MB/s), CPU median {cpu:.2f} s; "
            f"old/this {old / medians[key]:.1f}x"
        )
    return same


@dataclass
class Attached:
    cpu_share: float  # of one core, while the job wrote
    step_at_job_end: float  # what attach had read when the job stopped writing
    last_step: int | None  # of attach's summary; None if stopped before the end
    job_last_step: int
    job_rate: float  # MB/s the job wrote
    total_cpu: float  # attach's CPU seconds, start-up and the final read included
    drained_after: float | None  # seconds from the job's end to attach's
    unread_at_job_end: float  # event_file_unread_bytes then (NaN: the old reader has none)
    warned_behind: bool  # attach warned that a tick's read budget stopped it


def metric(url: str, name: str) -> float:
    with urllib.request.urlopen(url, timeout=10) as response:
        for line in response.read().decode().splitlines():
            if line.startswith(name + "{") or line.startswith(name + " "):
                return float(line.rsplit(" ", 1)[1])
    return float("nan")


def start_attach(reader: Reader, pid: int, scratch: Path) -> tuple[subprocess.Popen[bytes], Path]:
    err = scratch / f"attach-{reader.name}-{pid}.err"
    out = scratch / f"attach-{reader.name}-{pid}.out"
    with err.open("wb") as err_file, out.open("wb") as out_file:
        attach = subprocess.Popen(
            [sys.executable, "-m", "driftwatch", "attach", str(pid), "--listen", "127.0.0.1:0"],
            stdout=out_file,
            stderr=err_file,
            cwd=scratch,
            env=reader.env(scratch),
        )
    return attach, err


def wait_for_url(err: Path, attach: subprocess.Popen[bytes]) -> str:
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and attach.poll() is None:
        found = re.search(r"metrics at (\S+)", err.read_text())
        if found:
            return found.group(1)
        time.sleep(0.1)
    sys.exit(f"attach did not start: {err.read_text()}")


def attach_job(reader: Reader, args: argparse.Namespace, scratch: Path) -> Attached:
    logdir = scratch / f"job-{reader.name}"
    job_args = (args.rate, args.seconds, args.image_side)
    job = subprocess.Popen(
        [sys.executable, "-c", JOB, str(logdir), *map(str, job_args)],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        cwd=scratch,
        env={**reader.env(scratch), **TF_ENV},
    )
    attach, err = start_attach(reader, job.pid, scratch)
    url = wait_for_url(err, attach)
    watched = psutil.Process(attach.pid)
    assert job.stdout is not None
    first = job.stdout.readline().split()
    if first[:1] != ["writing"]:
        sys.exit(f"the job did not start writing: {first}")
    cpu0, t0 = sum(watched.cpu_times()[:2]), time.monotonic()
    last = job.stdout.readline().split()  # printed after the writer's close
    cpu1, t1 = sum(watched.cpu_times()[:2]), time.monotonic()
    step_at_end = metric(url, "driftwatch_train_step")
    unread = metric(url, "driftwatch_event_file_unread_bytes")
    job.wait()
    if last[:1] != ["done"]:
        sys.exit(f"the job did not end as expected: {last}")
    try:
        _pid, _status, usage = wait4(attach.pid, args.drain_seconds)
        drained: float | None = time.monotonic() - t1
    except TimeoutError:
        usage = None
        drained = None
        total = sum(watched.cpu_times()[:2])
        attach.kill()
        attach.wait()
    if usage is not None:
        total = usage.ru_utime + usage.ru_stime
    summary = (scratch / f"attach-{reader.name}-{job.pid}.out").read_text()
    found = re.search(r"last step (\d+)", summary)
    return Attached(
        cpu_share=(cpu1 - cpu0) / (t1 - t0),
        step_at_job_end=step_at_end,
        last_step=int(found.group(1)) if found and drained is not None else None,
        job_last_step=int(last[1]),
        job_rate=float(last[2]),
        total_cpu=total,
        drained_after=drained,
        unread_at_job_end=unread,
        warned_behind="written faster than" in err.read_text(),
    )


def wait4(pid: int, timeout: float) -> tuple[int, int, resource.struct_rusage]:
    """``os.wait4`` of a child, or ``TimeoutError`` after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        waited, status, usage = os.wait4(pid, os.WNOHANG)
        if waited:
            return waited, status, usage
        if time.monotonic() > deadline:
            raise TimeoutError
        time.sleep(0.05)


def attach_idle(reader: Reader, seconds: float, scratch: Path) -> float:
    """attach's CPU share of one core watching an idle process for ``seconds``."""
    sleeper = subprocess.Popen(["sleep", str(seconds + 120)])
    try:
        attach, err = start_attach(reader, sleeper.pid, scratch)
        wait_for_url(err, attach)
        time.sleep(2)  # past start-up
        watched = psutil.Process(attach.pid)
        cpu0, t0 = sum(watched.cpu_times()[:2]), time.monotonic()
        time.sleep(seconds)
        share = (sum(watched.cpu_times()[:2]) - cpu0) / (time.monotonic() - t0)
        attach.kill()
        attach.wait()
        return share
    finally:
        sleeper.kill()
        sleeper.wait()


def bench_attach(readers: list[Reader], args: argparse.Namespace, scratch: Path) -> bool:
    print(
        f"attach: a TF job writing {IMAGES_PER_STEP} {args.image_side}x{args.image_side} noise "
        f"PNGs and a loss a step at {args.rate:g} MB/s for {args.seconds:g} s"
    )
    ok = True
    for reader in readers:
        idle = attach_idle(reader, args.seconds, scratch)
        watched = attach_job(reader, args, scratch)
        left = watched.unread_at_job_end
        unread = f"{left:,.0f} bytes" if left == left else "no such series"
        drained = (
            f"its summary's last step {watched.last_step} "
            f"({watched.drained_after:.1f} s after the job's end)"
            if watched.drained_after is not None
            else f"still reading {args.drain_seconds:g} s after the job's end: stopped"
        )
        print(
            f"  {reader.name}: {100 * watched.cpu_share:.2f} % of a core while the job wrote "
            f"({watched.job_rate:.0f} MB/s; idle target: {100 * idle:.2f} %); "
            f"step read when the job stopped: {watched.step_at_job_end:.0f} of "
            f"{watched.job_last_step} (unread then: {unread}; "
            f"warned of falling behind: {'yes' if watched.warned_behind else 'no'}); "
            f"{drained}; {watched.total_cpu:.1f} CPU s in all"
        )
        if reader is readers[0]:
            ok = watched.cpu_share <= 0.02 and watched.last_step == watched.job_last_step
            ok = ok and not watched.warned_behind
    return ok


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0] if __doc__ else None)
    parser.add_argument("--only", choices=("attach", "images", "scalars"), help="one part")
    parser.add_argument("--base", default="", help="the commit of the reader replaced")
    parser.add_argument("--runs", type=int, default=3, help="timed analyze runs of this reader")
    parser.add_argument("--old-runs", type=int, default=1, help="of the old reader (1: slow)")
    parser.add_argument("--rate", type=float, default=100.0, help="the job's MB/s (100)")
    parser.add_argument("--seconds", type=float, default=30.0, help="the job's writing (30)")
    parser.add_argument("--image-side", type=int, default=128, help="image pixels square")
    parser.add_argument("--drain-seconds", type=float, default=60.0, help="old attach's end")
    parser.add_argument("--image-gb", type=float, default=1.0, help="image logdir GB (1)")
    parser.add_argument("--hours", type=float, default=12.0, help="scalar logdir hours (12)")
    parser.add_argument("--new-only", action="store_true", help="a quick look: no old reader")
    args = parser.parse_args()
    ok = True
    with tempfile.TemporaryDirectory() as tmp:
        scratch = Path(tmp)
        new = Reader("new", REPO)
        old = Reader("old", export_base(args.base, scratch / "base"))
        readers = [new] if args.new_only else [new, old]
        print(f"({os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.2f} at the start)")
        if args.only in (None, "scalars"):
            events = write_scalar_logdir(scratch / "scalars", args.hours)
            print(f"scalar logdir: {events:,} scalar events over {args.hours:g} h")
            runs = [args.runs, args.old_runs][: len(readers)]
            ok &= bench_analyze("scalars", scratch / "scalars", readers, runs, scratch, False)
        if args.only in (None, "images"):
            steps = write_image_logdir(scratch / "images", args.image_gb, args.image_side)
            print(f"image logdir: {steps:,} steps of images and a loss")
            runs = [args.runs, args.old_runs][: len(readers)]
            ok &= bench_analyze("images", scratch / "images", readers, runs, scratch, True)
        if args.only in (None, "attach"):
            ok &= bench_attach(readers, args, scratch)
    print(f"({os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.2f} at the end)")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
