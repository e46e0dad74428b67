"""Descriptors and threads a real Keras fit leaks, under ``driftwatch run`` with its
defaults: the finding arrives before the job runs out, with the time it will take."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from driftwatch.history.reader import HistoryReader, StoredFinding
from tests.conftest import TF_ENV
from tests.test_custom_loop_hook import ONE_THREAD, findings

pytestmark = [pytest.mark.tf, pytest.mark.paired]

FD_LIMIT = 2048
"""The job's soft and hard RLIMIT_NOFILE (prlimit)."""
NPROC_LIMIT = 4096
"""The job's soft RLIMIT_NPROC (prlimit): root may pass it, but driftwatch reads it."""

FIT = """
import errno, os, sys, threading, time
from concurrent.futures import ThreadPoolExecutor
import numpy as np
import keras

keras.utils.set_random_seed(0)
model = keras.Sequential(
    [keras.Input((8,)), keras.layers.Dense(16, activation="relu"), keras.layers.Dense(1)]
)
model.compile("sgd", "mse")
x = np.random.default_rng(0).normal(size=(64 * 32, 8)).astype("float32")
y = np.zeros((64 * 32, 1), "float32")
logdir, mode, pause = sys.argv[1], sys.argv[2], float(sys.argv[3])
end = time.time() + float(sys.argv[4])
kept, stop = [], threading.Event()


class Leak(keras.callbacks.Callback):
    def on_train_batch_end(self, batch, logs=None):
        if not kept:
            print("leak_start", time.time(), flush=True)
        time.sleep(pause)
        if mode == "fds":
            try:
                log = open(os.path.join(logdir, f"batch-{len(kept)}.log"), "w")
            except OSError as err:
                if err.errno != errno.EMFILE:
                    raise
                print("emfile", time.time(), len(kept), flush=True)
                self.model.stop_training = True
                return
            log.write(str(logs))
            kept.append(log)
        elif mode == "threads":
            worker = threading.Thread(target=stop.wait, daemon=True)
            worker.start()
            kept.append(worker)
        else:  # a pool of 16 warming up, and 16 files opened at once: steps, not leaks
            kept.append(batch)
            if len(kept) == 100:
                self.pool = ThreadPoolExecutor(16)
                self.files = [open(os.path.join(logdir, f"shard-{i}"), "w") for i in range(16)]
            if len(kept) >= 100:
                self.pool.submit(time.sleep, 0.5)
        if time.time() > end:
            print("timeout", time.time(), len(kept), flush=True)
            self.model.stop_training = True


model.fit(x, y, batch_size=32, epochs=1000, verbose=0, callbacks=[Leak()])
print("threads_end", time.time(), threading.active_count(), flush=True)
"""


def run_leaking_fit(tmp_path: Path, limit: str, *args: str) -> tuple[dict[str, list[float]], Path]:
    """Run the fit under ``driftwatch run`` with its defaults, its limits set by ``prlimit
    limit``; the job's marks (name: numbers) and the history database."""
    script = tmp_path / "train.py"
    script.write_text(FIT)
    logs = tmp_path / "logs"
    logs.mkdir()
    db = tmp_path / "h.db"
    command = [sys.executable, "-m", "driftwatch", "run", "--listen", "127.0.0.1:0"]
    command += ["--findings", str(tmp_path / "findings.jsonl"), "--db", str(db), "--"]
    command += ["prlimit", limit, sys.executable, str(script), str(logs), *args]
    result = subprocess.run(
        command,
        capture_output=True,
        text=True,
        timeout=280,
        check=False,
        env={**os.environ, **TF_ENV, **ONE_THREAD},
    )
    assert result.returncode == 0, result.stderr[-3000:]
    marks = {}
    for line in result.stdout.splitlines():
        name, *numbers = line.split()
        if name in ("leak_start", "emfile", "timeout", "threads_end"):
            marks[name] = [float(n) for n in numbers]
    return marks, db


def stored(db: Path, kind: str) -> StoredFinding:
    reader = HistoryReader(db)
    try:
        (found,) = [f for f in reader.findings(reader.run(None).id) if f.kind == kind]
    finally:
        reader.close()
    return found


def test_a_callback_leaking_a_log_file_per_batch_is_told_before_it_runs_out(
    tmp_path: Path,
) -> None:
    # Expected: a fit whose callback opens a log file per batch and never closes it, about
    # 40 a second, under a limit of 2,048 descriptors (EMFILE some 50 s after its start):
    # fd_exhaustion, critical, reported before EMFILE, its first projected moment of
    # exhaustion within 25 % of the time that was actually left.
    marks, db = run_leaking_fit(tmp_path, f"--nofile={FD_LIMIT}", "fds", "0.02", "150")
    assert "emfile" in marks, marks
    emfile = marks["emfile"][0]
    first = next(f for f in findings(tmp_path) if f["kind"] == "fd_exhaustion")
    assert first["severity"] == "critical"
    assert first["evidence"]["limit_fds"] == FD_LIMIT
    seen = stored(db, "fd_exhaustion").first_seen
    predicted = seen + first["evidence"]["seconds_to_limit"]
    evidence = first["evidence"]
    rate = marks["emfile"][1] / (emfile - marks["leak_start"][0])
    print(
        f"fd leak: {rate:.1f}/s on average, {evidence['slope_fds_per_hour'] / 3600:.1f}/s "
        f"when seen at {evidence['level_fds']:.0f}, {seen - marks['leak_start'][0]:.1f} s "
        f"into the leak; EMFILE predicted in {predicted - seen:.1f} s, came in "
        f"{emfile - seen:.1f} s"
    )
    assert seen < emfile
    assert predicted - seen == pytest.approx(emfile - seen, rel=0.25)


def test_a_callback_starting_a_thread_per_batch_is_told_with_its_time_to_the_limit(
    tmp_path: Path,
) -> None:
    # Expected: a fit whose callback starts a never-ending thread per batch, about 40 a
    # second for 40 s, under a soft RLIMIT_NPROC of 4,096 (reached some 100 s in at that
    # rate; root passes it, so the job goes on): thread_exhaustion, critical, within 30 s of
    # the leak's start, its time to the limit within 25 % of what the job's own rate gives.
    marks, db = run_leaking_fit(tmp_path, f"--nproc={NPROC_LIMIT}", "threads", "0.02", "40")
    start, (end, leaked) = marks["leak_start"][0], marks["timeout"]
    rate = leaked / (end - start)
    first = next(f for f in findings(tmp_path) if f["kind"] == "thread_exhaustion")
    assert first["severity"] == "critical"
    limit = first["evidence"]["limit_threads"]
    assert limit <= NPROC_LIMIT
    level = first["evidence"]["level_threads"]
    expected = (limit - level) / rate
    print(
        f"thread leak: {rate:.1f}/s, predicted {first['evidence']['seconds_to_limit']:.1f} s "
        f"to the limit from {level:.0f}, the job's own rate gives {expected:.1f} s"
    )
    assert stored(db, "thread_exhaustion").first_seen - start <= 30.0
    assert first["evidence"]["seconds_to_limit"] == pytest.approx(expected, rel=0.25)


def test_a_pool_warming_up_and_files_opened_at_once_are_no_leak(tmp_path: Path) -> None:
    # Expected: a fit that, 100 batches in, starts a pool of 16 threads (filled as work is
    # submitted each batch) and opens 16 files at once, then runs on for 30 s: neither
    # thread_exhaustion nor fd_exhaustion.
    marks, _ = run_leaking_fit(tmp_path, "--nofile=2048", "pool", "0.02", "30")
    assert "timeout" in marks, marks
    kinds = {f["kind"] for f in findings(tmp_path)}
    assert not kinds & {"thread_exhaustion", "fd_exhaustion"}, kinds
