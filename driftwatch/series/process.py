"""The target process's own series, read from /proc by psutil (driftwatch/sources/process.py)."""

from __future__ import annotations

from driftwatch.series.spec import MetricType, SeriesSpec

PROCESS: dict[str, SeriesSpec] = {
    "rss_bytes": SeriesSpec(
        "driftwatch_process_resident_memory_bytes", "Resident set size of the target."
    ),
    "cpu_seconds": SeriesSpec(
        "driftwatch_process_cpu_seconds_total",
        "User and system CPU time of the target.",
        MetricType.COUNTER,
    ),
    "memory_limit_bytes": SeriesSpec(
        "driftwatch_process_memory_limit_bytes",
        "Memory the target may use: its cgroup's limit, else the host's total memory.",
    ),
    "threads": SeriesSpec("driftwatch_process_threads", "Threads in the target."),
    "process_stopped": SeriesSpec(
        "driftwatch_process_stopped",
        "1 while the target is stopped (SIGSTOP, SIGTSTP or a tracer: state T or t in "
        "/proc/PID/stat), else 0: it runs nothing.",
    ),
    "open_fds": SeriesSpec("driftwatch_process_open_fds", "Open file descriptors of the target."),
    "fd_limit": SeriesSpec(
        "driftwatch_process_max_fds",
        "Descriptors the target may open: its soft RLIMIT_NOFILE (Max open files).",
    ),
    "threads_limit": SeriesSpec(
        "driftwatch_process_threads_limit",
        "Threads the target may run: the tightest of its cgroup's pids.max, its soft "
        "RLIMIT_NPROC (not for root, which passes it) and the kernel's threads-max.",
    ),
    "read_bytes": SeriesSpec(
        "driftwatch_process_read_bytes_total",
        "Bytes the target caused to be read from storage.",
        MetricType.COUNTER,
    ),
    "write_bytes": SeriesSpec(
        "driftwatch_process_write_bytes_total",
        "Bytes the target caused to be written to storage.",
        MetricType.COUNTER,
    ),
    "read_syscall_bytes": SeriesSpec(
        "driftwatch_process_read_syscall_bytes_total",
        "Bytes the target passed through read-like system calls (files, sockets, pipes).",
        MetricType.COUNTER,
    ),
    "write_syscall_bytes": SeriesSpec(
        "driftwatch_process_write_syscall_bytes_total",
        "Bytes the target passed through write-like system calls (files, sockets, pipes).",
        MetricType.COUNTER,
    ),
    "nondisk_write_bytes": SeriesSpec(
        "driftwatch_process_nondisk_write_bytes",
        "Bytes written by the target that did not go to local storage (uploads, pipes): "
        "write-syscall bytes minus storage write bytes.",
    ),
    "rss_anon_bytes": SeriesSpec(
        "driftwatch_process_resident_memory_anon_bytes",
        "Resident anonymous memory of the target (heap, stacks: RssAnon in /proc/PID/status).",
    ),
    "rss_file_bytes": SeriesSpec(
        "driftwatch_process_resident_memory_file_bytes",
        "Resident file-backed memory of the target (mapped libraries and files: RssFile).",
    ),
    "rss_shmem_bytes": SeriesSpec(
        "driftwatch_process_resident_memory_shmem_bytes",
        "Resident shared memory of the target (RssShmem).",
    ),
}
