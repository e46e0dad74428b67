"""Measures what a scenario does on its own, without driftwatch.

python scenarios/_measure.py NAME [program options]

Runs ``scenarios/NAME.py`` with one TensorFlow thread (as the e2e test does), samples its
VmRSS from /proc every 0.5 s and the bytes under its ``--logdir``, and prints a timeline
(every 2 s) and a summary: RSS when training starts and when it ends, the slope over
training, the event files' total and largest sizes, and the program's own ``done`` line.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

PERIOD = 0.5
"""Sampling period of VmRSS and the log directory, in seconds."""
ENV = {
    "TF_CPP_MIN_LOG_LEVEL": "2",
    "CUDA_VISIBLE_DEVICES": "",
    "PYTHONUNBUFFERED": "1",
    "TF_NUM_INTRAOP_THREADS": "1",
    "TF_NUM_INTEROP_THREADS": "1",
}


def rss_mb(pid: int) -> float | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except OSError:
        return None
    return None


def logdir_bytes(directory: Path) -> tuple[int, int]:
    """Total and largest file size under ``directory``."""
    sizes = [p.stat().st_size for p in directory.rglob("*") if p.is_file()]
    return sum(sizes), max(sizes, default=0)


def main() -> None:
    name, *options = sys.argv[1:]
    logdir = Path(tempfile.mkdtemp(prefix=f"measure-{name}-"))
    program = Path(os.environ.get("SCENARIO_DIR", Path(__file__).parent)) / f"{name}.py"
    command = [sys.executable, str(program), "--logdir", str(logdir), *options]
    began = time.monotonic()
    child = subprocess.Popen(command, stdout=subprocess.PIPE, text=True, env={**os.environ, **ENV})
    lines: list[tuple[float, str]] = []

    def read() -> None:
        assert child.stdout is not None
        for line in child.stdout:
            lines.append((time.monotonic() - began, line.rstrip()))

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    samples: list[tuple[float, float, int, int]] = []
    while child.poll() is None:
        rss = rss_mb(child.pid)
        if rss is not None:
            samples.append((time.monotonic() - began, rss, *logdir_bytes(logdir)))
        time.sleep(PERIOD)
    reader.join(timeout=5)
    wall = time.monotonic() - began
    start = next((t for t, line in lines if line.startswith("training for")), 0.0)
    for t, rss, total, largest in samples[::4]:
        print(f"t={t:5.1f}s rss={rss:7.1f}MB logdir={total / 1e6:8.2f}MB", end=" ")
        print(f"largest={largest / 1e6:8.2f}MB")
    training = [s for s in samples if s[0] >= start]
    if len(training) >= 2:
        first, last = training[0], training[-1]
        slope = (last[1] - first[1]) / (last[0] - first[0])
        peak = max(s[1] for s in training)
        print(
            f"training from t={start:.1f}s: rss {first[1]:.0f} -> {last[1]:.0f} MB "
            f"(peak {peak:.0f}), {slope:+.1f} MB/s; logdir {last[2] / 1e6:.1f} MB "
            f"(largest {last[3] / 1e6:.1f} MB, {last[3] / 1e6 / (last[0] - first[0]):.2f} MB/s)"
        )
    total, largest = logdir_bytes(logdir)
    print(f"final logdir {total / 1e6:.2f} MB, largest file {largest / 1e6:.2f} MB")
    for t, line in lines:
        print(f"[{t:5.1f}s] {line}")
    print(f"exit {child.returncode}, wall {wall:.1f} s")


if __name__ == "__main__":
    main()
