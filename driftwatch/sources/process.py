"""Process source: memory, CPU, threads, descriptors and I/O of the target (/proc, psutil),
and the parts of its resident memory (anonymous, file-backed, shared) from ``/proc/PID/status``."""

from __future__ import annotations

import math
from pathlib import Path

import psutil

from driftwatch.series import Sample
from driftwatch.target import Target, translate_psutil

CGROUP_ROOT = Path("/sys/fs/cgroup")
UNLIMITED = 1 << 62  # cgroup v1 writes "no limit" as a huge page-rounded number
LIMIT_REFRESH_SECONDS = 60.0
STATUS_FIELDS = {
    b"RssAnon": "rss_anon_bytes",
    b"RssFile": "rss_file_bytes",
    b"RssShmem": "rss_shmem_bytes",
}
"""``/proc/PID/status`` fields read each tick (memory in kB there), and their series."""


def status_values(pid: int) -> dict[str, float]:
    """Resident memory by kind from ``/proc/PID/status`` (kernels before 4.5 lack these
    lines)."""
    try:
        with open(f"/proc/{pid}/status", "rb") as status:
            text = status.read()
    except (FileNotFoundError, ProcessLookupError) as err:
        raise psutil.NoSuchProcess(pid) from err
    except PermissionError as err:
        raise psutil.AccessDenied(pid) from err
    values: dict[str, float] = {}
    for line in text.splitlines():
        key, _, rest = line.partition(b":")
        series = STATUS_FIELDS.get(key)
        if series is not None:
            number = float(rest.split()[0])
            values[series] = number * 1024
    return values


def _cgroup_limit(directory: Path, name: str) -> float:
    """The smallest memory limit set on ``directory`` or its ancestors; inf if none."""
    limit = math.inf
    for level in (directory, *directory.parents):
        try:
            text = (level / name).read_text().strip()
        except OSError:
            continue
        if text.isdigit() and int(text) < UNLIMITED:
            limit = min(limit, float(text))
        if level == CGROUP_ROOT:
            break
    return limit


def memory_limit(pid: int) -> float:
    """What the process may use: its cgroup's memory limit (v2 or v1), else host memory."""
    limit = float(psutil.virtual_memory().total)
    try:
        lines = Path(f"/proc/{pid}/cgroup").read_text().splitlines()
    except OSError:
        return limit
    for line in lines:
        _, controllers, path = line.split(":", 2)
        if controllers == "":  # cgroup v2
            limit = min(limit, _cgroup_limit(CGROUP_ROOT / path.lstrip("/"), "memory.max"))
        elif "memory" in controllers.split(","):
            directory = CGROUP_ROOT / "memory" / path.lstrip("/")
            limit = min(limit, _cgroup_limit(directory, "memory.limit_in_bytes"))
    return limit


class ProcessSource:
    """Reads the target's ``/proc/PID/stat`` once per sample (liveness, CPU, threads,
    memory), and its descriptors and I/O counters through its ``psutil.Process``."""

    name = "process"

    def __init__(self, target: Target) -> None:
        self._target = target
        self._limit = math.nan
        self._limit_read_at = -math.inf

    def sample(self, now: float) -> list[Sample]:
        target = self._target
        process = target.process
        stat = target.read_stat()  # alive, same process, not a zombie: from the same read
        with translate_psutil(target.pid, "the process statistics"):
            status = status_values(target.pid)
            fds = process.num_fds()
            io = process.io_counters()
        # read_chars/write_chars exist on Linux only; the stubs do not know the platform.
        read_chars: int = getattr(io, "read_chars", 0)
        write_chars: int = getattr(io, "write_chars", 0)
        values = {
            "rss_bytes": stat.rss_bytes,
            "cpu_seconds": stat.cpu_seconds,
            "threads": stat.threads,
            "open_fds": fds,
            "read_bytes": io.read_bytes,
            "write_bytes": io.write_bytes,
            "read_syscall_bytes": read_chars,
            "write_syscall_bytes": write_chars,
            "nondisk_write_bytes": max(0, write_chars - io.write_bytes),
            **status,
        }
        if now - self._limit_read_at >= LIMIT_REFRESH_SECONDS:
            self._limit = memory_limit(target.pid)
            self._limit_read_at = now
        values["memory_limit_bytes"] = self._limit
        return [Sample(series, float(value), now) for series, value in values.items()]

    def close(self) -> None:
        """Nothing to release: the ``psutil.Process`` holds no descriptors."""
