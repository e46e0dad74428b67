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
PROCESSES = Amount("processes", human_count, count_rate)
"""Processes' amounts (zombies)."""
ZOMBIE_MIN_GROWTH = 8.0
"""Unreaped children a zombie leak adds at least over its window: more than a pool whose
workers exit together and are reaped a moment later leaves."""

HEAP_ADVICE = (
    "Take two heap snapshots some minutes apart (tracemalloc, memray) and compare, "
    "or run it under driftwatch run to let the hook tell tensors from Python state."
)
"""What to try for memory growth whose class the detector cannot tell."""
WORKER_ADVICE = (
    "A worker process keeps what it makes: a module-level cache, list or dict filled per "
    "batch in a keras.utils.PyDataset, a Sequence or a multiprocessing pool's function "
    "(each worker has its own copy and nothing frees it). Bound or drop the cache, or "
    "restart workers each epoch (PyDataset workers are; a Pool takes maxtasksperchild)."
)
"""What to try when the job's worker processes grow."""
ZOMBIE_ADVICE = (
    "A process starts children and never waits for them (subprocess.Popen without wait() "
    "or communicate(), os.fork without os.waitpid, a multiprocessing.Process never "
    "joined): each exited child keeps its PID until its parent reaps it, and the job fails "
    "to start threads or processes once the PIDs run out. Wait for or join every child, or "
    "set signal.signal(signal.SIGCHLD, signal.SIG_IGN) where their status is not needed."
)
"""What to try when unreaped children pile up."""
DISK_ADVICE = (
    "Something keeps writing to this filesystem and never removes anything: checkpoints "
    "kept every epoch (keep the newest few: tf.train.CheckpointManager(max_to_keep=3), "
    "ModelCheckpoint(save_best_only=True)), event files or logs never rotated, caches "
    "(dataset.cache(filename)) larger than planned. du -sh on the job's directories shows "
    "where the bytes go."
)
"""What to try when a filesystem the job writes to fills up."""
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
    "worker_memory": Resource(
        "workers_memory_bytes",
        "worker_memory_drift",
        "memory of the job's worker processes",
        "workers_memory_limit_bytes",
        limit_what="the job's memory limit less the main process's RSS",
        advice=WORKER_ADVICE,
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
    "disk": Resource(
        "disk_used_bytes",
        "disk_exhaustion",
        "used space of the filesystem at",
        "disk_size_bytes",
        steps_stated=False,
        limit_what="its size",
        advice=DISK_ADVICE,
    ),
    "zombies": Resource(
        "zombie_processes",
        "zombie_children",
        "count of unreaped child processes",
        "threads_limit",
        PROCESSES,
        replace(
            DEFAULT_THRESHOLDS,
            min_growth_amount=ZOMBIE_MIN_GROWTH,
            jump_growths=COUNT_JUMP_GROWTHS,
        ),
        steps_stated=False,
        limit_what="the tightest of pids.max, RLIMIT_NPROC and threads-max (PIDs)",
        advice=ZOMBIE_ADVICE,
    ),
}
"""Every resource the drift detector judges, by name."""
