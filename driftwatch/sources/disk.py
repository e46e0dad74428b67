"""Disk source: how full each filesystem the job writes to is.

The filesystems are those of the job's event-file logdirs, of its working directory (where
relative checkpoint and log paths land), and of every file it has open for writing (its
``/proc/PID/fdinfo`` flags), found again every ``WRITERS_REFRESH_SECONDS``; once found, a
filesystem stays watched (a checkpoint directory is written to a few seconds an epoch).
Each is named by its mount point and read with ``statvfs`` every tick: its size, and what is
used of it as the job sees it (the size less what an unprivileged writer may still use, so
that full means a write fails).
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass
from pathlib import Path

from driftwatch.series import Sample
from driftwatch.target.process import Target, read_proc_file

WRITERS_REFRESH_SECONDS = 30.0
"""Seconds between two looks at the files the job has open for writing."""
MAX_DESCRIPTORS_READ = 1024
"""Descriptors whose flags are read at most in one look (descriptors)."""
MAX_FILESYSTEMS = 8
"""Filesystems watched at most per job (filesystems)."""
PSEUDO_ROOTS = ("/proc", "/sys", "/dev")
"""Path prefixes of kernel filesystems, never a place a job fills."""
WRITE_FLAGS = os.O_WRONLY | os.O_RDWR
"""Open flags of a descriptor the job can write through."""


@dataclass(frozen=True, slots=True)
class Filesystem:
    """One filesystem: a path on it to ``statvfs`` (as seen here) and its mount point (as
    the job names it)."""

    path: str
    mount: str


def mount_point(path: str) -> str:
    """The top directory above ``path`` on the same filesystem (its mount point)."""
    current = os.path.realpath(path)
    device = os.stat(current).st_dev
    while current != "/":
        parent = os.path.dirname(current)
        if os.stat(parent).st_dev != device:
            break
        current = parent
    return current


def written_directories(pid: int, root: str) -> list[str]:
    """The directories of the regular files process ``pid`` has open for writing (at most
    ``MAX_DESCRIPTORS_READ`` descriptors looked at), as this process can reach them."""
    try:
        fds = os.listdir(f"/proc/{pid}/fd")[:MAX_DESCRIPTORS_READ]
    except OSError:
        return []
    found: set[str] = set()
    for fd in fds:
        try:
            link = os.readlink(f"/proc/{pid}/fd/{fd}")
            if not link.startswith("/") or link.startswith(PSEUDO_ROOTS):
                continue
            info = read_proc_file(f"/proc/{pid}/fdinfo/{fd}")
        except OSError:  # closed since the listing
            continue
        flags = next((line for line in info.splitlines() if line.startswith(b"flags:")), b"")
        if flags and int(flags.split()[1], 8) & WRITE_FLAGS:
            found.add(root + os.path.dirname(link.removesuffix(" (deleted)")))
    return sorted(found)


class DiskSource:
    """Size and use of each filesystem the job writes to (see the module)."""

    name = "disk"

    def __init__(self, target: Target, logdirs: list[Path]) -> None:
        self._target = target
        self._logdirs = [str(path) for path in logdirs]
        self._filesystems: dict[int, Filesystem] = {}  # by device number
        self._looked_at = -float("inf")

    def sample(self, now: float) -> list[Sample]:
        if now - self._looked_at >= WRITERS_REFRESH_SECONDS:
            self._looked_at = now
            self._find_filesystems()
        samples: list[Sample] = []
        for filesystem in self._filesystems.values():
            try:
                stats = os.statvfs(filesystem.path)
            except OSError:  # unmounted, or its directory removed: found again if written to
                continue
            size = stats.f_blocks * stats.f_frsize
            used = size - stats.f_bavail * stats.f_frsize
            labels = (("mount", filesystem.mount),)
            samples.append(Sample("disk_size_bytes", float(size), now, labels))
            samples.append(Sample("disk_used_bytes", float(used), now, labels))
        return samples

    def _find_filesystems(self) -> None:
        target = self._target
        candidates = [*self._logdirs, *written_directories(target.pid, target.root)]
        with contextlib.suppress(OSError):  # gone: its other sources say so
            candidates.append(target.root + os.readlink(f"/proc/{target.pid}/cwd"))
        for path in candidates:
            if len(self._filesystems) >= MAX_FILESYSTEMS:
                return
            self._add(path)

    def _add(self, path: str) -> None:
        """Watch the filesystem of ``path``, if it is a real one not watched yet."""
        try:
            device = os.stat(path).st_dev
            if device in self._filesystems or os.statvfs(path).f_blocks == 0:
                return
            mount = mount_point(path)
        except OSError:  # gone since it was named
            return
        root = self._target.root
        shown = (mount.removeprefix(root) or "/") if root else mount
        self._filesystems[device] = Filesystem(path, shown)

    def close(self) -> None:
        """Nothing to release: ``statvfs`` holds nothing open."""
