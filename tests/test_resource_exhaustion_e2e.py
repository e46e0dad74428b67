"""Descriptors and threads a real Keras fit leaks, under ``driftwatch run`` with its
defaults: the finding arrives before the job runs out, with the time it will take."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from driftwatch.history.reader import HistoryReader, StoredFinding
from tests.conftest import TF_ENV
from tests.test_custom_loop_hook import ONE_THREAD, findings

pytestmark = [pytest.mark.tf, pytest.mark.paired]

FD_LIMIT = 2048
"""The job's soft and hard RLIMIT_NOFILE (prlimit)."""
PIDS_MAX = 1024
"""The pids.max of the cgroup driftwatch and its job run in, for the thread leak."""
PIDS_V1 = Path("/sys/fs/cgroup/pids")
"""Where cgroup v1 mounts its pids controller (this test's machines: v1, as root)."""

FIT = """
import errno, os, sys, threading, time
from concurrent.futures import ThreadPoolExecutor
import numpy as np
import keras
import tensorflow as tf

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


def leak_one(logs):  # one more descriptor or thread kept; False once the job runs out
    if mode == "fds":
        try:
            log = open(os.path.join(logdir, f"batch-{len(kept)}.log"), "w")
        except OSError as err:
            if err.errno != errno.EMFILE:
                raise
            print("emfile", time.time(), len(kept), flush=True)
            return False
        log.write(str(logs))
        kept.append(log)
        return True
    worker = threading.Thread(target=stop.wait, daemon=True)
    try:
        worker.start()
    except RuntimeError:  # can't start new thread: the cgroup's pids.max
        print("thread_limit", time.time(), len(kept), flush=True)
        return False
    kept.append(worker)
    return True


class Leak(keras.callbacks.Callback):
    started = 0.0

    def on_train_batch_end(self, batch, logs=None):
        if mode == "pool":  # a pool of 16 warming up, and 16 files opened at once: steps
            time.sleep(pause)
            kept.append(batch)
            if len(kept) == 100:
                self.pool = ThreadPoolExecutor(16)
                self.files = [open(os.path.join(logdir, f"shard-{i}"), "w") for i in range(16)]
            if len(kept) >= 100:
                self.pool.submit(time.sleep, 0.5)
        else:  # one leaked every `pause` seconds of wall time: a steady rate, however fast
            now = time.time()  # the steps go (a neighbour on the machine slows them)
            if not self.started:
                self.started = now
                print("leak_start", now, flush=True)
            while len(kept) < int((now - self.started) / pause) + 1:
                if not leak_one(logs):
                    self.model.stop_training = True
                    return
            time.sleep(0.005)
        if time.time() > end:
            print("timeout", time.time(), len(kept), flush=True)
            self.model.stop_training = True


# One epoch over the data repeated: TensorFlow makes its iterator, and that iterator's
# threads, once. An iterator made anew each epoch may be the first to find the thread limit
# reached, and TensorFlow then aborts the job (a failed check in its thread pool) instead of
# the leak's thread start raising.
batches = tf.data.Dataset.from_tensor_slices((x, y)).batch(32).repeat()
model.fit(batches, steps_per_epoch=10**8, epochs=1, verbose=0, callbacks=[Leak()])
print("threads_end", time.time(), threading.active_count(), flush=True)
"""


def run_leaking_fit(
    tmp_path: Path, limit: str, *args: str, cgroup: Path | None = None
) -> tuple[dict[str, list[float]], Path]:
    """Run the fit under ``driftwatch run`` with its defaults, its limits set by ``prlimit
    limit`` (and both in ``cgroup``, if given); the job's marks (name: numbers) and the
    history database."""
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
        preexec_fn=None if cgroup is None else lambda: join_cgroup(cgroup),
    )
    assert result.returncode == 0, result.stderr[-3000:]
    marks = {}
    for line in result.stdout.splitlines():
        name, *numbers = line.split()
        if name in ("leak_start", "emfile", "thread_limit", "timeout", "threads_end"):
            marks[name] = [float(n) for n in numbers]
    return marks, db


def join_cgroup(cgroup: Path) -> None:
    """Move the calling process into ``cgroup`` (before it runs driftwatch)."""
    (cgroup / "cgroup.procs").write_text(str(os.getpid()))


@pytest.fixture
def pids_cgroup() -> Iterator[Path]:
    """A new cgroup (v1's pids controller) whose pids.max is ``PIDS_MAX``; skipped where
    none can be made (not root, cgroup v2 only)."""
    cgroup = PIDS_V1 / f"driftwatch-test-{os.getpid()}"
    try:
        cgroup.mkdir()
        (cgroup / "pids.max").write_text(str(PIDS_MAX))
    except OSError as err:
        pytest.skip(f"no pids cgroup of our own here: {err}")
    yield cgroup
    for _ in range(50):  # the job's last tasks leave as it exits
        try:
            cgroup.rmdir()
            return
        except OSError:
            time.sleep(0.1)


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
    marks, db = run_leaking_fit(tmp_path, f"--nofile={FD_LIMIT}", "fds", "0.025", "150")
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


def test_a_callback_starting_a_thread_per_batch_is_told_before_it_runs_out(
    tmp_path: Path, pids_cgroup: Path
) -> None:
    # Expected: a fit whose callback starts a never-ending thread per batch, about 40 a
    # second, in a cgroup whose pids.max is 1,024 (driftwatch's own tasks in it too): the
    # job cannot start a thread some 25 s into the leak. thread_exhaustion, critical, within
    # 30 s of the leak's start and before that moment, its first projected moment within
    # 25 % of the time that was actually left.
    marks, db = run_leaking_fit(
        tmp_path, "--nofile=4096", "threads", "0.025", "150", cgroup=pids_cgroup
    )
    assert "thread_limit" in marks, marks
    start, hit = marks["leak_start"][0], marks["thread_limit"][0]
    first = next(f for f in findings(tmp_path) if f["kind"] == "thread_exhaustion")
    evidence = first["evidence"]
    assert first["severity"] == "critical"
    assert evidence["limit_threads"] == PIDS_MAX
    seen = stored(db, "thread_exhaustion").first_seen
    predicted = seen + evidence["seconds_to_limit"]
    rate = marks["thread_limit"][1] / (hit - start)
    print(
        f"thread leak: {rate:.1f}/s on average, "
        f"{evidence['slope_threads_per_hour'] / 3600:.1f}/s when seen at "
        f"{evidence['level_threads']:.0f}, {seen - start:.1f} s into the leak; the limit "
        f"predicted in {predicted - seen:.1f} s, came in {hit - seen:.1f} s"
    )
    assert seen - start <= 30.0
    assert seen < hit
    assert predicted - seen == pytest.approx(hit - seen, rel=0.25)


def test_a_pool_warming_up_and_files_opened_at_once_are_no_leak(tmp_path: Path) -> None:
    # Expected: a fit that, 100 batches in, starts a pool of 16 threads (filled as work is
    # submitted each batch) and opens 16 files at once, then runs on for 30 s: neither
    # thread_exhaustion nor fd_exhaustion.
    marks, _ = run_leaking_fit(tmp_path, "--nofile=2048", "pool", "0.02", "30")
    assert "timeout" in marks, marks
    kinds = {f["kind"] for f in findings(tmp_path)}
    assert not kinds & {"thread_exhaustion", "fd_exhaustion"}, kinds
