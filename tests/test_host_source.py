from __future__ import annotations

import logging
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from driftwatch.errors import SourceUnavailable
from driftwatch.runtime.monitor import Monitor
from driftwatch.series import SERIES
from driftwatch.sources import default_sources
from driftwatch.sources.host import (
    PRESSURE_DIR,
    PRESSURE_RESOURCES,
    PRESSURE_SHARE_SECONDS,
    QUOTA_LOOKUP_SECONDS,
    HostSource,
    NodePressure,
    cgroup_directory,
    counting_cgroups,
    describe,
    parse_cpu_stat,
    parse_pressure,
    quota_set,
)
from driftwatch.target.process import Target
from tests.conftest import promtool_check_metrics, run_cli
from tests.test_exporter import scrape

PSI = """some avg10=1.50 avg60=0.88 avg300=5.37 total=4496091587
full avg10=0.25 avg60=0.00 avg300=0.00 total=2000000
"""
PSI_CPU_BEFORE_5_13 = "some avg10=12.00 avg60=3.10 avg300=0.80 total=7000000\n"
CPU_STAT_V2 = """usage_usec 19907731194
user_usec 18360502959
system_usec 1547228235
nr_periods 1200
nr_throttled 300
throttled_usec 4500000
nr_bursts 0
burst_usec 0
"""
CPU_STAT_V2_NO_CONTROLLER = "usage_usec 1\nuser_usec 1\nsystem_usec 0\n"
CPU_STAT_V1 = """nr_periods 1200
nr_throttled 300
throttled_time 4500000000
nr_bursts 0
burst_time 0
"""
HYBRID_CGROUP = "4:memory:/job\n2:cpuacct:/\n1:cpu:/job\n0::/job\n"
HYBRID_MOUNTS = """31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755
32 31 0:29 / /sys/fs/cgroup/cpu rw,relatime - cgroup cgroup rw,cpu
35 31 0:32 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory
41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw
"""
V2_CGROUP = "0::/kubepods.slice/pod1/abc\n"
V2_MOUNTS = "29 23 0:26 / /sys/fs/cgroup rw,nosuid shared:4 - cgroup2 cgroup2 rw,nsdelegate\n"


def test_pressure_lines_are_parsed_from_the_kernel_format() -> None:
    assert parse_pressure(PSI) == {"some": 4496.091587, "full": 2.0}
    assert parse_pressure(PSI_CPU_BEFORE_5_13) == {"some": 7.0}
    assert parse_pressure("garbage\n\n") == {}


@pytest.mark.skipif(not PRESSURE_DIR.is_dir(), reason="this kernel publishes no PSI")
def test_pressure_of_this_node_is_parsed_from_the_real_files() -> None:
    for resource in PRESSURE_RESOURCES:
        lines = parse_pressure((PRESSURE_DIR / resource).read_text())
        assert "some" in lines, resource
        assert all(seconds >= 0 for seconds in lines.values())


def test_cpu_stat_throttling_is_parsed_from_v1_and_v2_in_seconds() -> None:
    expected = {
        "cgroup_cpu_periods": 1200.0,
        "cgroup_cpu_throttled_periods": 300.0,
        "cgroup_cpu_throttled_seconds": 4.5,
    }
    assert parse_cpu_stat(CPU_STAT_V2) == expected
    assert parse_cpu_stat(CPU_STAT_V1) == expected
    assert parse_cpu_stat(CPU_STAT_V2_NO_CONTROLLER) == {}
    assert set(expected) <= set(SERIES)


def test_the_real_cpu_stat_files_of_this_process_are_parsed() -> None:
    """Each cgroup hierarchy mounted here (v1's cpu, v2), at this process's cgroup: v1's
    cpu.stat always counts throttling, v2's only where the CPU controller is enabled (and the
    kernel has CFS bandwidth control)."""
    cgroup = Path("/proc/self/cgroup").read_text()
    mounts = Path("/proc/self/mountinfo").read_text().splitlines()
    read = 0
    for kind in ("cgroup", "cgroup2"):
        only = "\n".join(line for line in mounts if f" - {kind} " in line)
        located = cgroup_directory(cgroup, only, "cpu")
        if located is None or not (located[1] / "cpu.stat").exists():
            continue
        counters = parse_cpu_stat((located[1] / "cpu.stat").read_text())
        if kind == "cgroup2":
            controllers = (located[1] / "cgroup.controllers").read_text().split()
            assert not counters or "cpu" in controllers
        else:
            assert len(counters) == 3
        assert all(value >= 0 for value in counters.values())
        read += 1
    if read == 0:
        pytest.skip("no cgroup cpu.stat visible here")


def test_the_cgroup_directory_is_found_through_the_mounts() -> None:
    cpu = Path("/sys/fs/cgroup/cpu")
    assert cgroup_directory(HYBRID_CGROUP, HYBRID_MOUNTS, "cpu") == (cpu, cpu / "job")
    root = Path("/sys/fs/cgroup")
    expected = (root, root / "kubepods.slice/pod1/abc")
    assert cgroup_directory(V2_CGROUP, V2_MOUNTS, "cpu") == expected
    # cpu and cpuacct co-mounted, as systemd does on cgroup v1
    combined = "3:cpu,cpuacct:/user.slice\n"
    mounts = "33 31 0:30 / /sys/fs/cgroup/cpu,cpuacct rw - cgroup cgroup rw,cpu,cpuacct\n"
    at = Path("/sys/fs/cgroup/cpu,cpuacct")
    assert cgroup_directory(combined, mounts, "cpu") == (at, at / "user.slice")
    # a container's /sys/fs/cgroup that is its own subtree, without a cgroup namespace
    mounts = "50 40 0:26 /docker/abc /sys/fs/cgroup ro - cgroup2 cgroup2 rw\n"
    assert cgroup_directory("0::/docker/abc\n", mounts, "cpu") == (root, root)
    # a mount point with a space, as mountinfo escapes it
    mounts = r"50 40 0:26 / /mnt/my\040cgroups rw - cgroup2 cgroup2 rw" + "\n"
    spaced = Path("/mnt/my cgroups")
    assert cgroup_directory("0::/a\n", mounts, "cpu") == (spaced, spaced / "a")
    assert cgroup_directory(HYBRID_CGROUP, "", "cpu") is None
    assert cgroup_directory("garbage\n", V2_MOUNTS, "cpu") is None


def write_cgroup(directory: Path, stat: str, quota: str | None = None) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "cpu.stat").write_text(stat)
    if quota is not None:
        (directory / "cpu.max").write_text(quota)


def test_cgroups_with_throttling_counters_and_quotas_are_found(tmp_path: Path) -> None:
    top, pod, container = tmp_path, tmp_path / "pod", tmp_path / "pod" / "container"
    write_cgroup(top, CPU_STAT_V2, "max 100000\n")
    write_cgroup(pod, CPU_STAT_V1)
    (pod / "cpu.cfs_quota_us").write_text("50000\n")
    write_cgroup(container, CPU_STAT_V2_NO_CONTROLLER, "max 100000\n")
    assert counting_cgroups(container, top) == [pod, top]
    assert counting_cgroups(container, pod) == [pod]  # not above the mount
    assert [quota_set(level) for level in (container, pod, top)] == [False, True, False]
    (pod / "cpu.cfs_quota_us").write_text("-1\n")
    assert not quota_set(pod)
    assert counting_cgroups(tmp_path / "gone", tmp_path / "gone") == []


FIXTURE_PID = 42


def fixture_host(tmp_path: Path, cpu_stat: str, quota: str | None, psi: dict[str, str]) -> Path:
    """A ``/proc`` under ``tmp_path`` whose process ``FIXTURE_PID`` lives in the cgroup ``/job``
    of a v2 hierarchy mounted at ``tmp_path/cgroup`` (with ``cpu_stat`` and ``quota``), and the
    PSI files ``psi`` under ``tmp_path/pressure``; returns that ``/proc``."""
    proc = tmp_path / "proc"
    (proc / str(FIXTURE_PID)).mkdir(parents=True)
    (proc / "self").mkdir()
    (proc / str(FIXTURE_PID) / "cgroup").write_text("0::/job\n")
    mounts = f"41 31 0:38 / {tmp_path / 'cgroup'} rw - cgroup2 cgroup2 rw\n"
    (proc / "self" / "mountinfo").write_text(mounts)
    write_cgroup(tmp_path / "cgroup" / "job", cpu_stat, quota)
    (tmp_path / "pressure").mkdir()
    for resource, text in psi.items():
        (tmp_path / "pressure" / resource).write_text(text)
    return proc


def test_the_host_source_reads_fixture_files(tmp_path: Path) -> None:
    psi = {"cpu": PSI_CPU_BEFORE_5_13, "io": PSI, "memory": PSI}
    proc = fixture_host(tmp_path, CPU_STAT_V2, "50000 100000\n", psi)
    source = HostSource(FIXTURE_PID, tmp_path / "pressure", proc)
    samples = source.sample(7.0)
    assert source.sample(11.9) == []  # within READ_INTERVAL_SECONDS of the last reading
    assert len(source.sample(12.0)) == len(samples)
    values = {(s.series, s.labels): s.value for s in samples}
    assert {s.t for s in samples} == {7.0}
    assert values[("cgroup_cpu_throttled_seconds", ())] == 4.5
    assert values[("pressure_some_seconds", (("resource", "cpu"),))] == 7.0
    assert ("pressure_full_seconds", (("resource", "cpu"),)) not in values
    assert values[("pressure_full_seconds", (("resource", "io"),))] == 2.0
    assert len(values) == 3 + 1 + 2 + 2
    for series, labels in values:
        assert tuple(name for name, _ in labels) == SERIES[series].label_names


def read_thrice(source: HostSource, caplog: pytest.LogCaptureFixture) -> tuple[set[str], list[str]]:
    """The series of three readings (each the same) and what the source logged meanwhile."""
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="driftwatch.sources.host"):
        readings = [{s.series for s in source.sample(float(now))} for now in range(3)]
    assert readings[0] == readings[1] == readings[2]
    assert {r.levelno for r in caplog.records} <= {logging.INFO}
    return readings[0], [r.getMessage() for r in caplog.records]


def test_missing_files_switch_each_reading_off_once_quietly(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    proc = fixture_host(tmp_path, CPU_STAT_V1, "50000 100000\n", {})
    source = HostSource(FIXTURE_PID, tmp_path / "pressure", proc, interval=0.0)
    series, logged = read_thrice(source, caplog)
    assert series == {
        "cgroup_cpu_periods",
        "cgroup_cpu_throttled_periods",
        "cgroup_cpu_throttled_seconds",
    }
    assert len(logged) == 1
    assert "pressure-stall information not monitored" in logged[0]

    # The cgroup goes away (the job's container ended): off too, and then the whole source.
    caplog.clear()
    (tmp_path / "cgroup" / "job" / "cpu.stat").unlink()
    with (
        caplog.at_level(logging.INFO, logger="driftwatch.sources.host"),
        pytest.raises(SourceUnavailable, match="host contention is not monitored"),
    ):
        source.sample(3.0)
    assert len(caplog.records) == 1
    assert "CPU throttling not monitored" in caplog.records[0].getMessage()


@pytest.mark.parametrize(
    ("cpu_stat", "message"),
    [
        (CPU_STAT_V2_NO_CONTROLLER, "no cpu.stat with throttling counters"),
        (CPU_STAT_V2, "no CPU quota on the target's cgroup"),
    ],
)
def test_a_cgroup_that_cannot_be_throttled_is_logged_once(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, cpu_stat: str, message: str
) -> None:
    # Only cpu, with the "full" line the kernel writes as zeros for the whole node: left out.
    proc = fixture_host(tmp_path, cpu_stat, None, {"cpu": PSI})
    source = HostSource(FIXTURE_PID, tmp_path / "pressure", proc, interval=0.0)
    series, logged = read_thrice(source, caplog)
    assert series == {"pressure_some_seconds"}
    assert len(logged) == 1
    assert message in logged[0]


def test_without_a_cpu_quota_throttling_is_looked_for_again_later(tmp_path: Path) -> None:
    """Nothing throttles a cgroup without a quota: its counters are not stored until one is
    set (as ``docker update --cpus`` or a Kubernetes resize may)."""
    proc = fixture_host(tmp_path, CPU_STAT_V2, None, {})
    source = HostSource(FIXTURE_PID, tmp_path / "pressure", proc, interval=0.0)
    assert source.sample(0.0) == []
    (tmp_path / "cgroup" / "job" / "cpu.max").write_text("50000 100000\n")
    assert source.sample(QUOTA_LOOKUP_SECONDS - 1) == []
    assert {s.series for s in source.sample(QUOTA_LOOKUP_SECONDS)} == {
        "cgroup_cpu_periods",
        "cgroup_cpu_throttled_periods",
        "cgroup_cpu_throttled_seconds",
    }


def test_the_host_source_reads_this_machine_for_a_real_process(
    sleeper: subprocess.Popen[bytes],
) -> None:
    target = Target.attach(sleeper.pid)
    sources = default_sources(target, [])
    host = next(s for s in sources if isinstance(s, HostSource))
    try:
        samples = host.sample(1.0)
    except SourceUnavailable:
        pytest.skip("neither PSI nor a cgroup cpu.stat with throttling counters here")
    finally:
        for source in sources:
            source.close()
    series = {s.series for s in samples}
    assert series <= set(SERIES)
    if PRESSURE_DIR.is_dir():
        assert "pressure_some_seconds" in series


@pytest.fixture
def quota_cgroup() -> Iterator[Path]:
    """A real cgroup allowed 10 ms of CPU per 100 ms, made beside this process's own (needs
    the right to create cgroups: root, or a delegated hierarchy); removed afterwards."""
    located = cgroup_directory(
        Path("/proc/self/cgroup").read_text(), Path("/proc/self/mountinfo").read_text(), "cpu"
    )
    if located is None:
        pytest.skip("no CPU controller mounted here")
    top = located[0]
    directory = top / f"driftwatch-test-{uuid.uuid4().hex[:8]}"
    try:
        directory.mkdir()
    except OSError as err:
        pytest.skip(f"cannot create a cgroup here: {err.strerror}")
    try:
        if (directory / "cpu.cfs_quota_us").exists():  # v1
            (directory / "cpu.cfs_period_us").write_text("100000")
            (directory / "cpu.cfs_quota_us").write_text("10000")
        elif (directory / "cpu.max").exists():
            (directory / "cpu.max").write_text("10000 100000")
        else:
            pytest.skip("the CPU controller is not enabled for new cgroups here")
        yield directory
    finally:
        directory.rmdir()


def test_a_real_cpu_quota_shows_as_throttling(quota_cgroup: Path) -> None:
    busy = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        (quota_cgroup / "cgroup.procs").write_text(str(busy.pid))
        source = HostSource(busy.pid, interval=0.0)
        before = {s.series: s.value for s in source.sample(0.0)}
        time.sleep(1.0)
        after = {s.series: s.value for s in source.sample(1.0)}
    finally:
        busy.kill()
        busy.wait()
    periods = after["cgroup_cpu_periods"] - before["cgroup_cpu_periods"]
    throttled = after["cgroup_cpu_throttled_periods"] - before["cgroup_cpu_throttled_periods"]
    # 10 periods in a second; a busy process uses its 10 ms in each and is throttled.
    assert 5 <= periods <= 15
    assert throttled >= periods - 2
    seconds = after["cgroup_cpu_throttled_seconds"] - before["cgroup_cpu_throttled_seconds"]
    assert 0.3 < seconds < 2.0


def test_host_series_are_exported_and_pass_promtool(
    tmp_path: Path, sleeper: subprocess.Popen[bytes], promtool: str
) -> None:
    """Through a real monitor: the cgroup counters carry the run, the node's pressure does not."""
    proc = fixture_host(tmp_path, CPU_STAT_V2, "50000 100000\n", {"cpu": PSI, "io": PSI})
    source = HostSource(FIXTURE_PID, tmp_path / "pressure", proc)
    snapshot = Monitor("train", Target.attach(sleeper.pid).info, [source]).tick()
    text = scrape([snapshot])
    assert 'driftwatch_cgroup_cpu_throttled_seconds_total{run="train"} 4.5' in text
    assert 'driftwatch_node_pressure_full_seconds_total{resource="io"} 2.0' in text
    assert 'driftwatch_node_pressure_some_seconds_total{resource="cpu"} 4496.091587' in text
    result = promtool_check_metrics(promtool, text)
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.strip() == "", result.stdout


def test_doctor_describes_a_v2_cgroup_with_a_quota_and_psi(tmp_path: Path) -> None:
    """A v2 hierarchy (``cgroup.controllers`` at its root) whose cgroup ``/job`` has a
    quota, and PSI files. Expected: works; names v2, the quota's cgroup and the three PSI
    resources."""
    psi = {"cpu": PSI_CPU_BEFORE_5_13, "io": PSI, "memory": PSI}
    proc = fixture_host(tmp_path, CPU_STAT_V2, "50000 100000\n", psi)
    (tmp_path / "cgroup" / "cgroup.controllers").write_text("cpu io memory\n")
    ok, detail = describe(FIXTURE_PID, tmp_path / "pressure", proc)
    assert ok
    assert "pressure stalls (PSI) of cpu, io, memory" in detail
    assert f"cgroup v2 CPU throttling counters readable, CPU quota at {tmp_path}/cgroup/job" in (
        detail
    )


def test_doctor_says_why_host_contention_cannot_be_read(tmp_path: Path) -> None:
    """No PSI files and a cgroup v2 whose CPU controller is not enabled (``cpu.stat``
    without throttling counters); then no cgroup file at all. Expected: not working, each
    reason named; no traceback."""
    proc = fixture_host(tmp_path, CPU_STAT_V2_NO_CONTROLLER, None, {})
    ok, detail = describe(FIXTURE_PID, tmp_path / "pressure", proc)
    assert not ok
    assert "no pressure-stall information" in detail
    assert "without throttling counters" in detail
    ok, detail = describe(FIXTURE_PID + 1, tmp_path / "pressure", proc)
    assert not ok
    assert "the cgroup cannot be read (No such file or directory)" in detail


def test_doctor_reports_this_machines_host_contention_readings() -> None:
    """``driftwatch doctor`` on this machine. Expected: a ``host`` line that names PSI
    exactly when ``/proc/pressure/cpu`` exists here, and the version of the hierarchy that
    holds the CPU controller, as ``/proc/self/mountinfo`` says."""
    result = run_cli("doctor")
    assert result.returncode == 0, result.stderr
    (line,) = [line for line in result.stdout.splitlines() if line.split()[1:2] == ["host"]]
    assert ("pressure stalls (PSI) of cpu" in line) == Path("/proc/pressure/cpu").is_file()
    mounts = Path("/proc/self/mountinfo").read_text().splitlines()
    v1_cpu = any(" - cgroup " in m and "cpu" in m.split()[-1].split(",") for m in mounts)
    v2 = any(" - cgroup2 " in m for m in mounts)
    if v1_cpu:
        assert "cgroup v1" in line
    elif v2:
        assert "cgroup v2" in line


def test_a_daemons_targets_share_one_reading_of_the_node_pressure(tmp_path: Path) -> None:
    """Two targets' host sources given one ``NodePressure`` (as the daemon gives its targets):
    the second, sampled within ``PRESSURE_SHARE_SECONDS`` of the first, gets the same
    reading though the file changed in between; one sampled later reads it again, and a
    source of its own (``driftwatch attach``) always reads it."""
    proc = fixture_host(tmp_path, CPU_STAT_V2, None, {"cpu": PSI, "io": PSI, "memory": PSI})
    clock = [100.0]
    shared = NodePressure(tmp_path / "pressure", clock=lambda: clock[0])
    one, two = (HostSource(FIXTURE_PID, proc=proc, pressure=shared) for _ in range(2))
    alone = HostSource(FIXTURE_PID, tmp_path / "pressure", proc)

    def io_some(source: HostSource, now: float) -> float:
        samples = source.sample(now)
        return next(
            s.value
            for s in samples
            if s.series == "pressure_some_seconds" and s.labels == (("resource", "io"),)
        )

    before = io_some(one, 10.0)
    (tmp_path / "pressure" / "io").write_text(PSI.replace("total=4496091587", "total=5000000000"))
    clock[0] += PRESSURE_SHARE_SECONDS / 2
    assert io_some(two, 10.5) == before
    assert io_some(alone, 10.5) == 5000.0
    clock[0] += PRESSURE_SHARE_SECONDS
    assert io_some(one, 20.0) == 5000.0
