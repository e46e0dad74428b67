"""The resources a job can run out of, as one table: each row names the series of its level
and of its limit, the kind of finding its growth is reported as, how its amounts read and
what counts as material growth. One detector (``ResourceDriftDetector``) judges every row:
memory in bytes, open descriptors and threads as counts (docs/resources.md).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

from driftwatch.detect.memory.trends import DEFAULT_THRESHOLDS, MemoryThresholds
from driftwatch.units import count_rate, human_bytes, human_count

FD_MIN_GROWTH = 16.0
"""Descriptors a descriptor leak adds at least over its window: more than a data loader or
a writer opens at once (a rise within seconds adds 4 times this, read by read)."""
THREAD_MIN_GROWTH = 32.0
"""Threads a thread leak adds at least over its window: more than a pool that warms up
within seconds starts (a rise within seconds adds 4 times this, read by read)."""
COUNT_JUMP_GROWTHS = 0.25
"""A count's level jump: more than this many times its minimum growth (4 descriptors, 8
threads), so that a pool or a loader's files, opened at once, is a step and not a trend."""


def bytes_per_hour(slope: float) -> str:
    """Memory growth, in bytes a second, as read: ``1.2 GiB/h``."""
    return f"{human_bytes(slope * 3600)}/h"


@dataclass(frozen=True, slots=True)
class Amount:
    """How a resource's amounts read in messages, and the unit its evidence fields name."""

    unit: str  # in evidence fields: level_<unit>, limit_<unit>, slope_<unit>_per_hour
    text: Callable[[float], str]  # an amount: "1.2 GiB", "4,552"
    rate: Callable[[float], str]  # growth, given per second: "1.2 GiB/h", "300/s"


BYTES = Amount("bytes", human_bytes, bytes_per_hour)
"""Memory's amounts."""
DESCRIPTORS = Amount("fds", human_count, count_rate)
"""Open descriptors' amounts."""
THREADS = Amount("threads", human_count, count_rate)
"""Threads' amounts."""

HEAP_ADVICE = (
    "Take two heap snapshots some minutes apart (tracemalloc, memray) and compare, "
    "or run it under driftwatch run to let the hook tell tensors from Python state."
)
"""What to try for memory growth whose class the detector cannot tell."""
FD_ADVICE = (
    "Something opens files, sockets or pipes and never closes them (a log file opened per "
    "batch, tf.summary.create_file_writer called per epoch, a requests session per call): "
    "ls -l /proc/PID/fd shows what they point to. Open once and reuse, or close them (with "
    "open(...) as f:, writer.close()); raising ulimit -n only delays the failure."
)
"""What to try for a descriptor leak."""
THREAD_ADVICE = (
    "Something starts threads that never end (a threading.Thread per batch or epoch, a "
    "ThreadPoolExecutor created per call and never shut down): py-spy dump --pid PID shows "
    "where they wait. Join the threads you start, or submit work to one pool created once."
)
"""What to try for a thread leak."""


@dataclass(frozen=True, slots=True)
class Resource:
    """A resource a job can run out of, as the drift detector judges it."""

    signal: str  # the series of its level
    kind: str  # the kind of finding its growth is reported as (``KINDS``)
    what: str  # what its messages call it: "host memory (RSS)"
    limit_series: str | None  # the series of its limit; None: no limit known
    amount: Amount = BYTES
    thresholds: MemoryThresholds = DEFAULT_THRESHOLDS
    steps_stated: bool = True  # a one-off level jump is stated (as ``memory_step``)
    limit_what: str = ""  # what its limit is, in its messages: "soft RLIMIT_NOFILE"
    advice: str = HEAP_ADVICE


RESOURCES: dict[str, Resource] = {
    "host_memory": Resource(
        "rss_bytes", "host_memory_drift", "host memory (RSS)", "memory_limit_bytes"
    ),
    "tf_memory": Resource(
        "tf_allocator_current_bytes",
        "tf_memory_drift",
        "TensorFlow allocator memory",
        "memory_limit_bytes",
    ),
    "gpu_memory": Resource(
        "gpu_process_memory_bytes",
        "gpu_memory_drift",
        "GPU memory of the process",
        "gpu_memory_total_bytes",
    ),
    "descriptors": Resource(
        "open_fds",
        "fd_exhaustion",
        "open descriptor count",
        "fd_limit",
        DESCRIPTORS,
        replace(
            DEFAULT_THRESHOLDS, min_growth_amount=FD_MIN_GROWTH, jump_growths=COUNT_JUMP_GROWTHS
        ),
        steps_stated=False,
        limit_what="the soft RLIMIT_NOFILE, ulimit -n",
        advice=FD_ADVICE,
    ),
    "threads": Resource(
        "threads",
        "thread_exhaustion",
        "thread count",
        "threads_limit",
        THREADS,
        replace(
            DEFAULT_THRESHOLDS,
            min_growth_amount=THREAD_MIN_GROWTH,
            jump_growths=COUNT_JUMP_GROWTHS,
        ),
        steps_stated=False,
        limit_what="the tightest of pids.max, RLIMIT_NPROC and threads-max",
        advice=THREAD_ADVICE,
    ),
}
"""Every resource the drift detector judges, by name."""
