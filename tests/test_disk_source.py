"""The filesystems a job writes to, read by ``DiskSource`` on a real size-limited tmpfs."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from driftwatch.series import Sample
from driftwatch.sources.disk import DiskSource, mount_point, written_directories
from driftwatch.target.process import Target
from tests.conftest import TF_ENV
from tests.test_custom_loop_hook import ONE_THREAD, findings
from tests.test_resource_exhaustion_e2e import stored

MIB = 1 << 20


@pytest.fixture
def small_filesystem(tmp_path: Path) -> Iterator[Path]:
    """A 16-MiB tmpfs mounted for the test (root only, as every test machine runs)."""
    mount = tmp_path / "small"
    mount.mkdir()
    made = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=16m", "none", str(mount)], check=False
    )
    if made.returncode != 0:
        pytest.skip("mounting a tmpfs needs root")
    yield mount
    subprocess.run(["umount", "-l", str(mount)], check=False)


WRITER = """
import sys, time
with open(sys.argv[1], "wb") as out:  # held open for writing, filled on each line of stdin
    print("open", flush=True)
    for line in sys.stdin:
        out.write(b"x" * (int(line) << 20))
        out.flush()
        print("written", flush=True)
"""


def by_series(samples: list[Sample]) -> dict[str, Sample]:
    return {sample.series: sample for sample in samples}


def test_a_filesystem_the_job_writes_to_is_found_by_its_open_file_and_its_use_read(
    small_filesystem: Path, tmp_path: Path
) -> None:
    # Expected: the job's working directory is elsewhere; its one file open for writing is
    # on the 16-MiB tmpfs, which is found by that file and named by its mount point; 6 MiB
    # written show as 6 MiB more used at the next reading.
    writer = subprocess.Popen(
        [sys.executable, "-c", WRITER, str(small_filesystem / "checkpoint.bin")],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        cwd=tmp_path,
    )
    try:
        assert writer.stdin is not None
        assert writer.stdout is not None
        assert writer.stdout.readline().strip() == "open"
        # (its stderr may be a file too: pytest's capture of this test's output)
        assert str(small_filesystem) in written_directories(writer.pid, "")
        source = DiskSource(Target.attach(writer.pid), [])
        before = [
            s for s in source.sample(time.time()) if s.labels == (("mount", str(small_filesystem)),)
        ]
        seen = by_series(before)
        assert seen["disk_size_bytes"].value == 16 * MIB
        writer.stdin.write("6\n")
        writer.stdin.flush()
        assert writer.stdout.readline().strip() == "written"
        after = by_series(
            [s for s in source.sample(time.time()) if s.labels == seen["disk_used_bytes"].labels]
        )
        grown = after["disk_used_bytes"].value - seen["disk_used_bytes"].value
        assert grown == pytest.approx(6 * MIB, abs=64 * 1024)
        mounts = {dict(s.labels)["mount"] for s in source.sample(time.time())}
        assert mount_point(str(tmp_path)) in mounts  # the working directory's too
    finally:
        writer.kill()
        writer.wait()


def test_a_logdir_is_watched_before_anything_is_written_and_pseudo_filesystems_never(
    small_filesystem: Path,
) -> None:
    source = DiskSource(Target.attach(os.getpid()), [small_filesystem, Path("/proc")])
    mounts = {dict(s.labels)["mount"] for s in source.sample(time.time())}
    assert str(small_filesystem) in mounts
    assert "/proc" not in mounts


# -- a real Keras job filling its checkpoint directory ----------------------------------

CHECKPOINTING_FIT = """
import errno, os, sys, time
import numpy as np
import keras

keras.utils.set_random_seed(0)
model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(16), keras.layers.Dense(1)])
model.compile("sgd", "mse")
x = np.zeros((64 * 32, 8), "float32")
y = np.zeros((64 * 32, 1), "float32")
payload = os.urandom(1 << 20)


class KeepEveryCheckpoint(keras.callbacks.Callback):
    saved = 0
    started = 0.0

    def on_train_batch_end(self, batch, logs=None):
        # A 1-MiB checkpoint every quarter second by the clock, none ever removed: a steady
        # 4 MiB/s however slowly a busy host runs the steps between them.
        if not self.saved:
            self.started = time.monotonic()
            print("first_save", time.time(), flush=True)
        time.sleep(max(0.0, self.started + 0.25 * self.saved - time.monotonic()))
        try:
            with open(f"checkpoint-{self.saved}.bin", "wb") as out:
                out.write(payload)
        except OSError as err:
            if err.errno != errno.ENOSPC:
                raise
            print("full", time.time(), flush=True)
            self.model.stop_training = True
            return
        self.saved += 1


model.fit(x, y, batch_size=32, epochs=1000, verbose=0, callbacks=[KeepEveryCheckpoint()])
"""


@pytest.mark.tf
@pytest.mark.paired
def test_checkpoints_filling_a_small_filesystem_are_told_before_it_is_full(
    small_filesystem: Path, tmp_path: Path
) -> None:
    # Expected: a fit that keeps a 1-MiB checkpoint every quarter second in its working
    # directory, a 16-MiB tmpfs made larger here (96 MiB: full some 30-40 s in): under
    # driftwatch run with its defaults, disk_exhaustion naming that mount, critical, before
    # ENOSPC, its first projected moment of being full within 25 % of the time actually left.
    subprocess.run(["mount", "-o", "remount,size=96m", str(small_filesystem)], check=True)
    script = tmp_path / "train.py"
    script.write_text(CHECKPOINTING_FIT)
    db = tmp_path / "h.db"
    command = [sys.executable, "-m", "driftwatch", "run", "--listen", "127.0.0.1:0"]
    command += ["--findings", str(tmp_path / "findings.jsonl"), "--db", str(db), "--"]
    result = subprocess.run(
        [*command, sys.executable, str(script)],
        cwd=small_filesystem,
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
        env={**os.environ, **TF_ENV, **ONE_THREAD},
    )
    assert result.returncode == 0, result.stderr[-3000:]
    marks = {
        line.split()[0]: float(line.split()[1])
        for line in result.stdout.splitlines()
        if line.startswith(("first_save", "full"))
    }
    assert "full" in marks, result.stdout[-2000:]
    first = next(f for f in findings(tmp_path) if f["kind"] == "disk_exhaustion")
    assert first["severity"] == "critical"
    assert str(small_filesystem) in first["message"]
    seen = stored(db, "disk_exhaustion").first_seen
    left = first["evidence"]["seconds_to_limit"]
    assert seen < marks["full"]
    assert left == pytest.approx(marks["full"] - seen, rel=0.25)
