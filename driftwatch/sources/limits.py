"""What the target may use before it runs out: memory, open descriptors and threads, from its
cgroup (v2 or v1), its resource limits (``/proc/PID/limits``) and the kernel's.

Every reader returns ``inf`` where no limit is set and never raises: a limit that cannot be
read is no limit known (the detectors then state growth without a time to exhaustion).
"""

from __future__ import annotations

import math
from pathlib import Path

import psutil

CGROUP_ROOT = Path("/sys/fs/cgroup")
UNLIMITED = 1 << 62  # cgroup v1 writes "no limit" as a huge page-rounded number
THREADS_MAX = Path("/proc/sys/kernel/threads-max")
"""The kernel's limit on threads, all processes together (a count)."""
LIMIT_NAMES = {"fd_limit": "Max open files", "nproc_limit": "Max processes"}
"""The rows of ``/proc/PID/limits`` read, by what they limit."""
NPROC_EXEMPT_CAPABILITIES = (21, 24)
"""CAP_SYS_ADMIN and CAP_SYS_RESOURCE: a process with either passes RLIMIT_NPROC, as does
one whose real user is root."""


def _cgroup_limit(directory: Path, name: str) -> float:
    """The smallest limit in the file ``name`` of ``directory`` or its ancestors; inf if
    none (``max``, a missing file, v1's huge "no limit")."""
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


def _cgroups(pid: int) -> list[tuple[str, str]]:
    """(controllers, path) of each line of ``/proc/PID/cgroup``; "" controllers: v2."""
    try:
        lines = Path(f"/proc/{pid}/cgroup").read_text().splitlines()
    except OSError:
        return []
    found = []
    for line in lines:
        _, controllers, path = line.split(":", 2)
        found.append((controllers, path.lstrip("/")))
    return found


def cgroup_limit(pid: int, controller: str, v2_file: str, v1_file: str) -> float:
    """The tightest limit of ``controller`` on the process's cgroup and its ancestors: the
    ``v2_file`` of the unified hierarchy and the ``v1_file`` of the controller's own."""
    limit = math.inf
    for controllers, path in _cgroups(pid):
        if controllers == "":
            limit = min(limit, _cgroup_limit(CGROUP_ROOT / path, v2_file))
        elif controller in controllers.split(","):
            limit = min(limit, _cgroup_limit(CGROUP_ROOT / controller / path, v1_file))
    return limit


def memory_limit(pid: int) -> float:
    """What the process may use: its cgroup's memory limit (v2 or v1), else host memory."""
    total = float(psutil.virtual_memory().total)
    return min(total, cgroup_limit(pid, "memory", "memory.max", "memory.limit_in_bytes"))


def soft_limits(pid: int) -> dict[str, float]:
    """The soft limits of ``LIMIT_NAMES`` in ``/proc/PID/limits`` (inf: unlimited or not
    readable)."""
    found = dict.fromkeys(LIMIT_NAMES, math.inf)
    try:
        lines = Path(f"/proc/{pid}/limits").read_text().splitlines()
    except OSError:
        return found
    for key, name in LIMIT_NAMES.items():
        for line in lines:
            if line.startswith(name):
                soft = line[len(name) :].split()[0]
                found[key] = float(soft) if soft.isdigit() else math.inf
    return found


def nproc_applies(pid: int) -> bool:
    """Whether the kernel holds the process to its RLIMIT_NPROC: not when its real user is
    root nor when it has ``NPROC_EXEMPT_CAPABILITIES`` (``/proc/PID/status``; unreadable:
    assume it does)."""
    try:
        lines = Path(f"/proc/{pid}/status").read_text().splitlines()
    except OSError:
        return True
    fields = dict(line.split(":", 1) for line in lines if ":" in line)
    try:
        real_uid = int(fields["Uid"].split()[0])
        capabilities = int(fields["CapEff"].strip(), 16)
    except (KeyError, ValueError, IndexError):
        return True
    exempt = any(capabilities >> bit & 1 for bit in NPROC_EXEMPT_CAPABILITIES)
    return real_uid != 0 and not exempt


def _threads_max() -> float:
    try:
        text = THREADS_MAX.read_text().strip()
    except OSError:
        return math.inf
    return float(text) if text.isdigit() else math.inf


def resource_limits(pid: int) -> dict[str, float]:
    """Each limit series the process source emits: memory (bytes), open descriptors (its
    soft ``RLIMIT_NOFILE``) and threads (the tightest of its cgroup's ``pids.max``, its
    soft ``RLIMIT_NPROC`` where the kernel holds it to it, and the kernel's
    ``threads-max``)."""
    soft = soft_limits(pid)
    pids = cgroup_limit(pid, "pids", "pids.max", "pids.max")
    nproc = soft["nproc_limit"] if nproc_applies(pid) else math.inf
    return {
        "memory_limit_bytes": memory_limit(pid),
        "fd_limit": soft["fd_limit"],
        "threads_limit": min(pids, nproc, _threads_max()),
    }
