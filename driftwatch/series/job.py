"""The series of the job beyond its main process: its process tree and its workers' memory
(driftwatch/sources/job.py), and the filesystems it writes to (driftwatch/sources/disk.py)."""

from __future__ import annotations

from driftwatch.series.spec import SeriesSpec

JOB: dict[str, SeriesSpec] = {
    "job_processes": SeriesSpec(
        "driftwatch_job_processes", "Processes of the job: the target and its descendants."
    ),
    "zombie_processes": SeriesSpec(
        "driftwatch_job_zombie_processes",
        "Descendants of the target that exited and were never reaped (each holds a PID).",
    ),
    "workers_memory_bytes": SeriesSpec(
        "driftwatch_job_workers_memory_bytes",
        "Memory of the target's descendants (data-loader workers, pools, subprocesses): the "
        "sum of their proportional set sizes, pages shared after fork counted once.",
    ),
    "workers_memory_limit_bytes": SeriesSpec(
        "driftwatch_job_workers_memory_limit_bytes",
        "Memory the workers can grow into: the job's cgroup or host limit less the target's RSS.",
    ),
    "largest_worker_memory_bytes": SeriesSpec(
        "driftwatch_job_largest_worker_memory_bytes",
        "Memory of the job's largest worker process, by its PID and command line.",
        label_names=("pid", "command"),
    ),
    "disk_used_bytes": SeriesSpec(
        "driftwatch_disk_used_bytes",
        "Bytes used on a filesystem the job writes to (its logdirs, working directory, files "
        "open for writing), as an unprivileged writer sees it: full when it reaches the size.",
        label_names=("mount",),
    ),
    "disk_size_bytes": SeriesSpec(
        "driftwatch_disk_size_bytes",
        "Size of a filesystem the job writes to.",
        label_names=("mount",),
    ),
}
