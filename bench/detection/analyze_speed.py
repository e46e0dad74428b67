"""How long does ``driftwatch analyze`` take on a day-long recording of a 20 Hz job?

Run from the repository root::

    .venv/bin/python bench/detection/analyze_speed.py            # time it (3 runs)
    .venv/bin/python bench/detection/analyze_speed.py --profile  # cProfile, top functions

It writes a samples file (issue 4's goal: a 24-hour, 20 Hz trace must be analysed in under
10 s) to a temporary directory: one ``step_seconds`` line per step (50 ms steps, lognormal
AR(0.8) noise, a 6 s checkpoint every 5,000 steps) and, every 20 steps, ``rss_bytes``
(10 GiB with a 150 MiB GC sawtooth) and ``train_step``: 1.73M step lines and 2 x 86,400
others, about 120 MB. Then it times ``driftwatch analyze FILE --json`` as a subprocess
(start-up and import included), best and median of ``--runs``, and checks that the healthy
trace gives no warning or critical finding.
"""

from __future__ import annotations

import argparse
import cProfile
import json
import os
import pstats
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

T0 = 1_700_000_000.0
STEP_SECONDS = 0.05
PROBE_EVERY = 20
CHECKPOINT_EVERY = 5000
GIB = float(1 << 30)
MIB = float(1 << 20)


def write_trace(path: Path, seconds: float, seed: int = 0) -> int:
    """Write the recording; return its number of lines."""
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


def time_cli(path: Path) -> tuple[float, list[dict[str, object]]]:
    """Wall seconds of ``driftwatch analyze PATH --json`` and the findings it printed."""
    started = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-m", "driftwatch", "analyze", str(path), "--json"],
        capture_output=True,
        text=True,
        check=True,
    )
    wall = time.perf_counter() - started
    return wall, [json.loads(line) for line in done.stdout.splitlines() if line.strip()]


def profile(path: Path, top: int) -> None:
    """cProfile of the analysis in this process, sorted by own time."""
    from driftwatch.analyze import analyze

    profiler = cProfile.Profile()
    profiler.enable()
    analyze(path)
    profiler.disable()
    pstats.Stats(profiler).sort_stats("tottime").print_stats(top)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0] if __doc__ else None)
    parser.add_argument("--hours", type=float, default=24.0, help="recording length (24)")
    parser.add_argument("--runs", type=int, default=3, help="timed runs (3)")
    parser.add_argument("--profile", action="store_true", help="print a cProfile instead")
    parser.add_argument("--top", type=int, default=25, help="functions the profile shows")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "day.jsonl"
        lines = write_trace(path, args.hours * 3600)
        size = path.stat().st_size
        print(f"recording: {lines:,} lines, {size / 1e6:.0f} MB, {args.hours:g} h at 20 Hz")
        if args.profile:
            profile(path, args.top)
            return 0
        walls = []
        for _ in range(args.runs):
            wall, findings = time_cli(path)
            walls.append(wall)
            alarms = [f["kind"] for f in findings if f["severity"] != "info"]
            print(f"  driftwatch analyze: {wall:.2f} s, warning/critical findings: {alarms or 0}")
        load = os.getloadavg()[0]
        print(
            f"best {min(walls):.2f} s, median {statistics.median(walls):.2f} s "
            f"({os.cpu_count()} CPUs, load average {load:.2f} at the end)"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
