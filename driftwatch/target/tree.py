"""The watched process's descendants: data-loader workers, pools and other children.

Found from ``/proc/PID/task/TID/children`` (each thread lists the children it forked),
walked down from the target, so no scan of every process on the host is needed. Each
descendant is identified by its PID and start time (a PID reused by a new process is a new
process), with its command line read once, redacted as the target's is.
"""

from __future__ import annotations

import os
from collections import deque
from dataclasses import dataclass

from driftwatch.target.pidns import start_ticks
from driftwatch.target.process import read_proc_file, redact_command

MAX_DEPTH = 64
"""Parents followed up from a process at most (processes)."""
MAX_DESCENDANTS = 1024
"""Descendants listed at most (processes): a fork bomb is not walked to its end."""
COMMAND_CHARACTERS = 160
"""Characters of a descendant's command line kept to name it (characters)."""


@dataclass(frozen=True, slots=True)
class Descendant:
    """One process below the target: its PID, start time (clock ticks after boot) and
    command line, redacted and shortened."""

    pid: int
    start_ticks: int
    command: str


def children(pid: int) -> list[int]:
    """The PIDs process ``pid``'s threads forked that are still alive; none once it is gone
    or closed to this process."""
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return []
    found: list[int] = []
    for task in tasks:
        try:
            found.extend(
                int(child) for child in read_proc_file(f"/proc/{pid}/task/{task}/children").split()
            )
        except OSError:  # the thread ended between the listing and the read
            continue
    return found


def is_zombie(pid: int) -> bool:
    """Whether process ``pid`` has exited and was never reaped by its parent; ``OSError``
    once it is gone."""
    stat = read_proc_file(f"/proc/{pid}/stat")
    return stat[stat.rindex(b")") + 2 : stat.rindex(b")") + 3] == b"Z"


def parent_pid(pid: int) -> int:
    """The parent of process ``pid`` (0 for the first process); ``OSError`` once it is gone."""
    stat = read_proc_file(f"/proc/{pid}/stat")
    return int(stat[stat.rindex(b")") + 2 :].split(maxsplit=2)[1])


def descends_from(pid: int, ancestors: set[int]) -> bool:
    """Whether one of ``ancestors`` is a parent, grandparent, ... of process ``pid``."""
    for _ in range(MAX_DEPTH):
        try:
            pid = parent_pid(pid)
        except (OSError, ValueError, IndexError):
            return False
        if pid in ancestors:
            return True
        if pid <= 1:
            return False
    return False


def descendant_pids(pid: int) -> list[int]:
    """Every process below ``pid``, parents before their children, at most
    ``MAX_DESCENDANTS``."""
    found: list[int] = []
    pending = deque(children(pid))
    while pending and len(found) < MAX_DESCENDANTS:
        child = pending.popleft()
        found.append(child)
        pending.extend(children(child))
    return found


def describe(pid: int) -> Descendant | None:
    """Process ``pid`` as a ``Descendant``; None once it is gone."""
    try:
        ticks = start_ticks(pid)
        argv = read_proc_file(f"/proc/{pid}/cmdline").decode(errors="replace").split("\0")
    except (OSError, ValueError, IndexError):
        return None
    command = " ".join(redact_command([arg for arg in argv if arg]))
    return Descendant(pid, ticks, command[:COMMAND_CHARACTERS])
