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
