"""Job source: the target's descendants (data-loader workers, pools, subprocesses) and the
memory they hold, counted once however much of it they share with the target after ``fork``.

Each worker's memory is its proportional set size (PSS, ``/proc/PID/smaps_rollup``: a page
shared by N processes counts 1/N in each), kept current between two readings by its RSS
(``/proc/PID/statm``, a few microseconds): memory = RSS now - (RSS - PSS) at its latest PSS
reading, since what a worker adds to itself is private. PSS costs a walk of the process's
page tables (milliseconds for a large process), so it is read when a worker is found and
then for one worker a tick, the one read longest ago, at most every ``PSS_REFRESH_SECONDS``.

Samples: ``job_processes`` (the target and its descendants) and ``zombie_processes`` (those
of them that exited and were never reaped: each holds a PID) always; once the job has had a
worker, ``workers_memory_bytes`` (their sum), ``workers_memory_limit_bytes`` (the memory
limit the target's cgroup or host gives the whole job, less the target's own RSS: what the
workers can grow into) and ``largest_worker_memory_bytes`` labelled with the largest
worker's PID and command line, so that a finding names the process.
"""

from __future__ import annotations

import math
import os
import re
from dataclasses import dataclass

from driftwatch.series import Sample
from driftwatch.sources.limits import memory_limit
from driftwatch.sources.process import LIMIT_REFRESH_SECONDS
from driftwatch.target.pidns import start_ticks
from driftwatch.target.process import Target, read_proc_file
from driftwatch.target.tree import Descendant, descendant_pids, describe, is_zombie

TREE_REFRESH_SECONDS = 2.0
"""Seconds between two walks of the target's descendants (new workers are found then)."""
PSS_REFRESH_SECONDS = 10.0
"""Seconds a worker's PSS reading is used before it is read again, at the soonest."""
PAGE_BYTES = os.sysconf("SC_PAGE_SIZE")
"""Bytes in a memory page (``statm`` counts pages)."""
PSS_LINE = re.compile(rb"^Pss:\s+(\d+) kB", re.MULTILINE)
"""The total PSS line of ``smaps_rollup`` (kB)."""


@dataclass(slots=True)
class _Worker:
    """One descendant and its memory: RSS now, and RSS less PSS at its latest PSS read."""

    process: Descendant
    rss: float = math.nan
    shared: float = math.nan  # RSS - PSS at the latest PSS read; NaN before one
    pss_read_at: float = -math.inf

    @property
    def memory(self) -> float:
        return max(0.0, self.rss - self.shared)


def rss_bytes(pid: int) -> float:
    """Resident memory of ``pid`` from ``/proc/PID/statm``; ``OSError`` once it is gone."""
    return float(read_proc_file(f"/proc/{pid}/statm").split()[1]) * PAGE_BYTES


def pss_bytes(pid: int) -> float:
    """Proportional set size of ``pid`` from ``/proc/PID/smaps_rollup`` (Linux 4.14 and
    later); ``OSError`` once it is gone or where the file is missing."""
    with open(f"/proc/{pid}/smaps_rollup", "rb") as file:
        found = PSS_LINE.search(file.read())
    if found is None:
        raise OSError(f"no Pss line in /proc/{pid}/smaps_rollup")
    return float(found.group(1)) * 1024


class JobSource:
    """The target's process tree and its workers' memory (see the module)."""

    name = "job"

    def __init__(self, target: Target) -> None:
        self._target = target
        self._workers: dict[int, _Worker] = {}  # by PID
        self._zombies = 0  # descendants that exited and were never reaped, at the last walk
        self._tree_read_at = -math.inf
        self._had_workers = False
        self._limit = math.nan
        self._limit_read_at = -math.inf

    def sample(self, now: float) -> list[Sample]:
        if now - self._tree_read_at >= TREE_REFRESH_SECONDS:
            self._walk_tree()
            self._tree_read_at = now
        self._read_rss()
        self._read_one_pss(now)
        samples = [
            Sample("job_processes", 1.0 + len(self._workers), now),
            Sample("zombie_processes", float(self._zombies), now),
        ]
        if self._workers:
            self._had_workers = True
        if self._had_workers:
            samples.extend(self._memory_samples(now))
        return samples

    def _walk_tree(self) -> None:
        """Find new descendants, forget those gone (a PID reused is a new worker)."""
        alive: dict[int, _Worker] = {}
        for pid in descendant_pids(self._target.pid):
            known = self._workers.get(pid)
            if known is not None and _still(known.process):
                alive[pid] = known
                continue
            process = describe(pid)
            if process is not None:
                alive[pid] = _Worker(process)
        self._workers = alive
        self._zombies = sum(_zombie(pid) for pid in alive)

    def _read_rss(self) -> None:
        for pid, worker in list(self._workers.items()):
            try:
                worker.rss = rss_bytes(pid)
            except (OSError, ValueError, IndexError):  # exited since the walk
                del self._workers[pid]

    def _read_one_pss(self, now: float) -> None:
        """PSS of every worker not read yet, else of the one read longest ago if that was
        ``PSS_REFRESH_SECONDS`` ago or more."""
        unread = [w for w in self._workers.values() if w.pss_read_at == -math.inf]
        if not unread and self._workers:
            oldest = min(self._workers.values(), key=lambda w: w.pss_read_at)
            if now - oldest.pss_read_at >= PSS_REFRESH_SECONDS:
                unread = [oldest]
        for worker in unread:
            try:
                pss = pss_bytes(worker.process.pid)
            except (OSError, ValueError):  # gone, or no smaps_rollup: RSS it is
                pss = worker.rss
            worker.shared = max(0.0, worker.rss - pss)
            worker.pss_read_at = now

    def _memory_samples(self, now: float) -> list[Sample]:
        workers = [w for w in self._workers.values() if math.isfinite(w.memory)]
        total = sum(w.memory for w in workers)
        samples = [Sample("workers_memory_bytes", total, now)]
        if now - self._limit_read_at >= LIMIT_REFRESH_SECONDS:
            self._limit = memory_limit(self._target.pid)
            self._limit_read_at = now
        try:
            own = rss_bytes(self._target.pid)
        except (OSError, ValueError, IndexError):  # the target's own source says it exited
            own = math.nan
        if math.isfinite(own) and math.isfinite(self._limit):
            samples.append(Sample("workers_memory_limit_bytes", self._limit - own, now))
        if workers:
            largest = max(workers, key=lambda w: w.memory)
            labels = (("pid", str(largest.process.pid)), ("command", largest.process.command))
            samples.append(Sample("largest_worker_memory_bytes", largest.memory, now, labels))
        return samples

    def close(self) -> None:
        """Nothing to release: every file is read and closed at once."""


def _zombie(pid: int) -> bool:
    try:
        return is_zombie(pid)
    except (OSError, ValueError):  # reaped since the walk
        return False


def _still(process: Descendant) -> bool:
    """Whether ``process``'s PID still belongs to it (not to a new process, or to none)."""
    try:
        return start_ticks(process.pid) == process.start_ticks
    except (OSError, ValueError, IndexError):
        return False
