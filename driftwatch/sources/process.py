"""Process source: memory, CPU, threads, descriptors and I/O of the target (/proc, psutil),
the parts of its resident memory (anonymous, file-backed, shared) from ``/proc/PID/status``,
and the limits of its memory, descriptors and threads (``driftwatch.sources.limits``)."""

from __future__ import annotations

import math
import os
import re

import psutil

from driftwatch.series import Sample
from driftwatch.sources.limits import resource_limits
from driftwatch.target.process import Target, read_proc_file, translate_psutil

LIMIT_REFRESH_SECONDS = 60.0
STATUS_FIELDS = {
    b"VmRSS": "rss_bytes",
    b"RssAnon": "rss_anon_bytes",
    b"RssFile": "rss_file_bytes",
    b"RssShmem": "rss_shmem_bytes",
}
"""``/proc/PID/status`` fields read each tick (memory in kB there), and their series."""
STATUS_LINES = re.compile(rb"^(" + b"|".join(STATUS_FIELDS) + rb"):\s*(\d+)", re.MULTILINE)
"""The lines of those fields and their numbers."""
IO_FIELDS = (b"rchar", b"wchar", b"read_bytes", b"write_bytes")
"""The ``/proc/PID/io`` counters read each tick (bytes)."""
IO_LINES = re.compile(rb"^(" + b"|".join(IO_FIELDS) + rb"):\s*(\d+)", re.MULTILINE)
"""The lines of those counters and their numbers."""


def _proc_file(pid: int, name: str) -> bytes:
    """``/proc/PID/name``, its errors as psutil's (the source's callers translate those)."""
    try:
        return read_proc_file(f"/proc/{pid}/{name}")
    except (FileNotFoundError, ProcessLookupError) as err:
        raise psutil.NoSuchProcess(pid) from err
    except PermissionError as err:
        raise psutil.AccessDenied(pid) from err


def fd_count(pid: int) -> int:
    """Descriptors the process has open: the size of ``/proc/PID/fd`` (Linux 6.2 and later
    count them there), else its listing (as psutil's ``num_fds`` does, which costs 60 µs for
    150 descriptors); its errors as psutil's."""
    path = f"/proc/{pid}/fd"
    try:
        return os.stat(path).st_size or len(os.listdir(path))
    except (FileNotFoundError, ProcessLookupError) as err:
        raise psutil.NoSuchProcess(pid) from err
    except PermissionError as err:
        raise psutil.AccessDenied(pid) from err


def status_values(pid: int) -> dict[str, float]:
    """Resident memory, in all and by kind, from ``/proc/PID/status`` (kernels before 4.5
    lack the lines by kind). ``VmRSS`` is the sum of the three, as ``statm``'s resident
    pages that psutil reads are."""
    text = _proc_file(pid, "status")
    return {STATUS_FIELDS[key]: float(kb) * 1024 for key, kb in STATUS_LINES.findall(text)}


def io_values(pid: int) -> tuple[int, int, int, int]:
    """``rchar``, ``wchar``, ``read_bytes`` and ``write_bytes`` of ``/proc/PID/io`` (as
    psutil's ``io_counters`` reads them, without its object)."""
    fields = dict(IO_LINES.findall(_proc_file(pid, "io")))
    try:
        counts = [int(fields[key]) for key in IO_FIELDS]
    except KeyError as err:
        raise psutil.AccessDenied(pid, msg=f"unexpected /proc/{pid}/io") from err
    return counts[0], counts[1], counts[2], counts[3]


class ProcessSource:
    """Reads the target's ``/proc/PID/stat`` once per sample (liveness, CPU, threads), its
    ``status`` (memory), ``io`` (I/O counters) and ``fd`` (descriptors)."""

    name = "process"

    def __init__(self, target: Target) -> None:
        self._target = target
        self._limits: dict[str, float] = {}
        self._limit_read_at = -math.inf

    def sample(self, now: float) -> list[Sample]:
        target = self._target
        # alive, same process, not a zombie: from the same read; RSS from ``status`` below
        stat = target.read_stat(rss=False)
        with translate_psutil(target.pid, "the process statistics"):
            status = status_values(target.pid)
            fds = fd_count(target.pid)
            read_chars, write_chars, read_bytes, write_bytes = io_values(target.pid)
        values = {
            "rss_bytes": stat.rss_bytes,  # replaced by status's VmRSS (always there since 2.6)
            "cpu_seconds": stat.cpu_seconds,
            "threads": stat.threads,
            "process_stopped": stat.stopped,
            "open_fds": fds,
            "read_bytes": read_bytes,
            "write_bytes": write_bytes,
            "read_syscall_bytes": read_chars,
            "write_syscall_bytes": write_chars,
            "nondisk_write_bytes": max(0, write_chars - write_bytes),
            **status,
        }
        if math.isnan(values["rss_bytes"]):
            values["rss_bytes"] = target.read_stat().rss_bytes
        if now - self._limit_read_at >= LIMIT_REFRESH_SECONDS:
            self._limits = resource_limits(target.pid)
            self._limit_read_at = now
        values.update({k: v for k, v in self._limits.items() if math.isfinite(v)})
        return [Sample(series, float(value), now) for series, value in values.items()]

    def close(self) -> None:
        """Nothing to release: the ``psutil.Process`` holds no descriptors."""
