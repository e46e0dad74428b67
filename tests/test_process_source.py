from __future__ import annotations

import math
import os
import resource
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from driftwatch.errors import TargetGone
from driftwatch.series import SERIES
from driftwatch.sources import limits
from driftwatch.sources.process import ProcessSource
from driftwatch.target.process import Target

# A child that grows its heap by 64 MiB and writes 1 MiB into a pipe each time it reads a line.
GROWER = """
import sys
hoard = []
for line in sys.stdin:
    hoard.append(bytearray(64 << 20))
    sys.stdout.buffer.write(b"x" * (1 << 20))
    sys.stdout.flush()
    sys.stderr.write("ok\\n"); sys.stderr.flush()
"""


def test_open_descriptors_are_counted_as_psutil_counts_them() -> None:
    # Expected: a child with 150 files open more than it starts with: the count psutil's
    # num_fds lists, before and after (read from /proc/PID/fd's size on Linux 6.2 and on).
    # "Before" is read once the child says it is ready: during the interpreter's start-up
    # it opens and closes files of its own.
    code = (
        "import sys\n"
        "files = []\n"
        "print('ready', flush=True)\n"
        "for line in sys.stdin:\n"
        "    files += [open('/dev/null') for _ in range(150)]\n"
        "    print(len(files), flush=True)\n"
    )
    child = subprocess.Popen(
        [sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    assert child.stdin is not None
    assert child.stdout is not None
    try:
        assert child.stdout.readline() == "ready\n"
        source, process = ProcessSource(Target.attach(child.pid)), psutil.Process(child.pid)
        before = {s.series: s.value for s in source.sample(100.0)}["open_fds"]
        assert before == process.num_fds()
        child.stdin.write("open\n")
        child.stdin.flush()
        assert child.stdout.readline() == "150\n"
        after = {s.series: s.value for s in source.sample(101.0)}["open_fds"]
        assert after == process.num_fds() == before + 150
    finally:
        child.kill()
        child.wait()


def test_process_source_reads_every_process_series() -> None:
    child = subprocess.Popen(
        [sys.executable, "-c", GROWER],
        stdin=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    assert child.stdin is not None
    assert child.stderr is not None
    try:
        source = ProcessSource(Target.attach(child.pid))
        before = {s.series: s.value for s in source.sample(100.0)}
        child.stdin.write(b"grow\n")
        child.stdin.flush()
        assert child.stderr.readline() == b"ok\n"
        samples = source.sample(101.0)
    finally:
        child.kill()
        child.wait()
    after = {s.series: s.value for s in samples}
    assert set(after) <= set(SERIES)
    assert {s.t for s in samples} == {101.0}
    assert after["rss_bytes"] - before["rss_bytes"] > 60 << 20
    assert after["threads"] >= 1
    assert after["open_fds"] >= 3
    assert after["cpu_seconds"] >= before["cpu_seconds"] >= 0
    # 1 MiB went into a pipe: a write syscall, but not a storage write.
    assert after["write_syscall_bytes"] - before["write_syscall_bytes"] >= 1 << 20
    assert after["nondisk_write_bytes"] - before["nondisk_write_bytes"] >= 1 << 20
    # The heap it grew is anonymous memory; its parts add up to RSS (read a moment apart).
    assert after["rss_anon_bytes"] - before["rss_anon_bytes"] > 60 << 20
    parts = after["rss_anon_bytes"] + after["rss_file_bytes"] + after["rss_shmem_bytes"]
    assert parts == pytest.approx(after["rss_bytes"], rel=0.05)


def test_process_source_raises_target_gone_after_exit(sleeper: subprocess.Popen[bytes]) -> None:
    source = ProcessSource(Target.attach(sleeper.pid))
    source.sample(0.0)
    sleeper.kill()
    sleeper.wait()
    with pytest.raises(TargetGone):
        source.sample(1.0)


def test_a_process_reads_as_stopped_from_sigstop_until_sigcont(
    sleeper: subprocess.Popen[bytes],
) -> None:
    source = ProcessSource(Target.attach(sleeper.pid))

    def stopped() -> float:
        return next(s.value for s in source.sample(0.0) if s.series == "process_stopped")

    assert stopped() == 0.0
    sleeper.send_signal(signal.SIGSTOP)
    deadline = time.monotonic() + 10
    while psutil.Process(sleeper.pid).status() != psutil.STATUS_STOPPED:
        assert time.monotonic() < deadline, "SIGSTOP did not stop the child"
        time.sleep(0.01)
    assert stopped() == 1.0
    sleeper.send_signal(signal.SIGCONT)
    deadline = time.monotonic() + 10
    while psutil.Process(sleeper.pid).status() == psutil.STATUS_STOPPED:
        assert time.monotonic() < deadline, "SIGCONT did not resume the child"
        time.sleep(0.01)
    assert stopped() == 0.0


BUSY = """
import sys, time
while time.process_time() < 0.5:  # half a CPU second, however long a shared machine takes
    pass
print(time.process_time(), flush=True)
time.sleep(60)
"""
READER = """
import sys
for path in sys.stdin:
    with open(path.strip(), "rb") as f:
        while f.read(1 << 20):
            pass
    sys.stdout.write("read\\n"); sys.stdout.flush()
"""


def cpu_share(pid: int, seconds: float) -> float:
    """The target's CPU seconds per wall second over ``seconds``, as Prometheus's ``rate()``
    (and the live view) read it from the ``cpu_seconds`` counter."""
    source = ProcessSource(Target.attach(pid))
    start = time.monotonic()
    before = {s.series: s.value for s in source.sample(0.0)}
    time.sleep(seconds)
    after = {s.series: s.value for s in source.sample(1.0)}
    return (after["cpu_seconds"] - before["cpu_seconds"]) / (time.monotonic() - start)


def test_cpu_time_of_a_busy_process_is_what_it_used_and_of_an_idle_one_near_zero(
    sleeper: subprocess.Popen[bytes],
) -> None:
    # The busy child says how much CPU time it has used (its own clock, start-up included);
    # the source must read the same, however busy the machine is (its share of a core is
    # not this test's to assert: CI runners are shared).
    busy = subprocess.Popen([sys.executable, "-c", BUSY], stdout=subprocess.PIPE, text=True)
    try:
        assert busy.stdout is not None
        used = float(busy.stdout.readline())
        source = ProcessSource(Target.attach(busy.pid))
        read = {s.series: s.value for s in source.sample(0.0)}["cpu_seconds"]
    finally:
        busy.kill()
        busy.wait()
    assert used >= 0.5
    assert read == pytest.approx(used, abs=0.03)  # clock ticks of 10 ms, and the print
    assert cpu_share(sleeper.pid, 1.0) < 0.05


def file_system(path: Path) -> str:
    """The type of the file system ``path`` lies on (``ext4``, ``tmpfs``, ...)."""
    mounts = psutil.disk_partitions(all=True)
    best = max(
        (m for m in mounts if path.is_relative_to(m.mountpoint)), key=lambda m: len(m.mountpoint)
    )
    return best.fstype


def test_storage_reads_of_a_process_reading_a_real_file(tmp_path: Path) -> None:
    if file_system(tmp_path) in ("tmpfs", "ramfs"):
        pytest.skip(f"{tmp_path} is in memory: no read reaches a storage device")
    data = tmp_path / "data.bin"
    size = 8 << 20
    with data.open("wb") as f:
        f.write(os.urandom(size))
        f.flush()
        os.fsync(f.fileno())
        # Out of the page cache, so the read below goes to the storage device.
        os.posix_fadvise(f.fileno(), 0, 0, os.POSIX_FADV_DONTNEED)
    child = subprocess.Popen(
        [sys.executable, "-c", READER], stdin=subprocess.PIPE, stdout=subprocess.PIPE
    )
    assert child.stdin is not None
    assert child.stdout is not None
    try:
        source = ProcessSource(Target.attach(child.pid))
        before = {s.series: s.value for s in source.sample(0.0)}
        child.stdin.write(f"{data}\n{data}\n".encode())  # a second time: from the page cache
        child.stdin.flush()
        assert child.stdout.readline() == b"read\n"
        assert child.stdout.readline() == b"read\n"
        after = {s.series: s.value for s in source.sample(1.0)}
    finally:
        child.kill()
        child.wait()
    # Both reads pass through read(); only the first reaches the storage device.
    assert after["read_syscall_bytes"] - before["read_syscall_bytes"] >= 2 * size
    assert size <= after["read_bytes"] - before["read_bytes"] < 2 * size


def test_limits_of_descriptors_and_threads_are_the_targets_soft_limits_and_the_kernels() -> None:
    # Expected: a child whose soft RLIMIT_NOFILE is 512 and RLIMIT_NPROC 3000 (or less, when
    # the hard limit is lower) reads 512 descriptors and at most 3000 threads (where the
    # kernel holds it to RLIMIT_NPROC: not as root), no more than the kernel's threads-max.
    def lower_limits() -> None:
        resource.setrlimit(
            resource.RLIMIT_NOFILE, (512, resource.getrlimit(resource.RLIMIT_NOFILE)[1])
        )
        hard = resource.getrlimit(resource.RLIMIT_NPROC)[1]
        soft = 3000 if hard == resource.RLIM_INFINITY else min(3000, hard)
        resource.setrlimit(resource.RLIMIT_NPROC, (soft, hard))

    child = subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(60)"], preexec_fn=lower_limits
    )
    try:
        read = {s.series: s.value for s in ProcessSource(Target.attach(child.pid)).sample(0.0)}
        nproc = 3000 if limits.nproc_applies(child.pid) else math.inf
    finally:
        child.kill()
        child.wait()
    assert read["fd_limit"] == 512
    threads_max = float(Path("/proc/sys/kernel/threads-max").read_text())
    assert 1 <= read["threads_limit"] <= min(nproc, threads_max)


@pytest.mark.skipif(os.getuid() != 0, reason="the kernel's exemption of root, seen as root")
def test_rlimit_nproc_does_not_hold_a_process_of_root() -> None:
    assert not limits.nproc_applies(os.getpid())


def test_a_cgroup_limit_is_the_tightest_of_the_cgroup_and_its_ancestors(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Expected: pids.max of 500 on the job's cgroup's parent, "max" on the job's own and 800
    # on the root's child above: 500; v1's controller directory is read the same way.
    job = tmp_path / "kubepods" / "pod" / "job"
    job.mkdir(parents=True)
    (job / "pids.max").write_text("max\n")
    (job.parent / "pids.max").write_text("500\n")
    (tmp_path / "kubepods" / "pids.max").write_text("800\n")
    v1 = tmp_path / "pids" / "docker" / "c1"
    v1.mkdir(parents=True)
    (v1 / "pids.max").write_text("300\n")
    monkeypatch.setattr(limits, "CGROUP_ROOT", tmp_path)
    monkeypatch.setattr(limits, "_cgroups", lambda pid: [("", "kubepods/pod/job")])
    assert limits.cgroup_limit(1, "pids", "pids.max", "pids.max") == 500
    monkeypatch.setattr(limits, "_cgroups", lambda pid: [("pids", "docker/c1"), ("", "/")])
    assert limits.cgroup_limit(1, "pids", "pids.max", "pids.max") == 300
    monkeypatch.setattr(limits, "_cgroups", lambda pid: [("memory", "docker/c1")])
    assert limits.cgroup_limit(1, "pids", "pids.max", "pids.max") == math.inf
