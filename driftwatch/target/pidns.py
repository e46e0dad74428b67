"""Naming a process so that it can be found from any PID namespace.

A process in a container knows itself by the PID of its own namespace, which the node sees
under another number. ``ProcessId`` names it by what every namespace agrees on: its PID
namespace (the inode of ``/proc/PID/ns/pid``, the same seen from anywhere), its PID in that
namespace (the last of ``NSpid`` in ``/proc/PID/status``) and its start time in clock ticks
after boot (field 22 of ``/proc/PID/stat``, equal in every PID namespace; only a time
namespace, which container runtimes do not use, would shift it), which tells a reused PID
from the original. ``find_process`` maps such a name to a PID in the caller's namespace.

Stdlib only: the hook imports it inside the training process.
"""

from __future__ import annotations

import os
from typing import NamedTuple

_NS_PREFIX = "pid:["


class ProcessId(NamedTuple):
    pid: int
    """In the process's own PID namespace."""
    start_ticks: int
    """Clock ticks after boot when it started (``/proc/PID/stat`` field 22)."""
    namespace: int
    """Inode of its PID namespace (``/proc/PID/ns/pid``)."""


def start_ticks(pid: int) -> int:
    """When process ``pid`` started, in clock ticks after boot; ``OSError`` if it is gone."""
    with open(f"/proc/{pid}/stat", "rb") as file:
        stat = file.read()
    # The command name, in parentheses, may hold spaces and parentheses itself.
    return int(stat[stat.rindex(b")") + 2 :].split()[19])


def pid_namespace(pid: int) -> int:
    """The inode of the PID namespace of process ``pid``; ``OSError`` if it is gone or closed
    to this process (reading it takes the same access as ``ptrace``)."""
    link = os.readlink(f"/proc/{pid}/ns/pid")
    if not link.startswith(_NS_PREFIX) or not link.endswith("]"):
        raise OSError(f"/proc/{pid}/ns/pid points to {link!r}, not to a PID namespace")
    return int(link[len(_NS_PREFIX) : -1])


def innermost_pid(pid: int) -> int:
    """The PID of process ``pid`` in its own namespace (the last of ``NSpid``)."""
    with open(f"/proc/{pid}/status", "rb") as file:
        for line in file:
            if line.startswith(b"NSpid:"):
                return int(line.split()[-1])
    return pid  # kernels before 4.1 have no NSpid, and no way to tell


def identify(pid: int) -> ProcessId:
    """The ``ProcessId`` of process ``pid`` of this namespace; ``OSError`` if it is gone."""
    return ProcessId(innermost_pid(pid), start_ticks(pid), pid_namespace(pid))


def _is(pid: int, process: ProcessId) -> bool:
    """Whether ``pid`` of this namespace is ``process``; False if it is gone or closed to us."""
    try:
        return (
            pid_namespace(pid) == process.namespace  # first: the cheapest to read
            and innermost_pid(pid) == process.pid
            and start_ticks(pid) == process.start_ticks
        )
    except OSError:
        return False


def find_process(process: ProcessId) -> int | None:
    """The PID in this namespace of the live ``process``; None if it has exited, or if it is
    out of sight (in a namespace this one does not contain, or closed to this user).

    Tries the same PID first (the process shares this namespace), then every process.
    """
    if _is(process.pid, process):
        return process.pid
    pids = (int(entry) for entry in os.listdir("/proc") if entry.isdigit())
    return next((pid for pid in pids if _is(pid, process)), None)
