from __future__ import annotations

import subprocess
import sys

import pytest

from driftwatch.errors import TargetGone
from driftwatch.series import SERIES
from driftwatch.sources.process import ProcessSource
from driftwatch.target import Target

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


def test_process_source_raises_target_gone_after_exit(sleeper: subprocess.Popen[bytes]) -> None:
    source = ProcessSource(Target.attach(sleeper.pid))
    source.sample(0.0)
    sleeper.kill()
    sleeper.wait()
    with pytest.raises(TargetGone):
        source.sample(1.0)
