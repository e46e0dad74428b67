"""Memory drift of the job's worker processes (data-loader workers, pools, subprocesses),
judged on their summed memory (``workers_memory_bytes``, pages shared after ``fork`` counted
once) against what the job's limit leaves them, and naming the largest worker."""

from __future__ import annotations

from driftwatch.detect.memory.drift import MemoryDriftDetector
from driftwatch.detect.memory.trends import DEFAULT_THRESHOLDS, MemoryThresholds, Trend
from driftwatch.series import Labels, Sample

WORKER_ADVICE = (
    "A worker process keeps what it makes: a module-level cache, list or dict filled per "
    "batch in a keras.utils.PyDataset, a Sequence or a multiprocessing pool's function "
    "(each worker has its own copy and nothing frees it). Bound or drop the cache, or "
    "restart workers each epoch (PyDataset workers are; a Pool takes maxtasksperchild)."
)
"""What to try when the workers' memory grows, as the finding says it."""


class WorkerMemoryDetector(MemoryDriftDetector):
    """Drift of the workers' summed memory, with the largest worker (PID and command line)
    in its evidence: the process that grows."""

    def __init__(self, thresholds: MemoryThresholds = DEFAULT_THRESHOLDS) -> None:
        super().__init__(
            "workers_memory_bytes",
            "worker_memory_drift",
            "memory of the job's worker processes",
            "workers_memory_limit_bytes",
            thresholds,
        )
        self.series = self.series | {"largest_worker_memory_bytes", "job_processes"}
        self._largest: Labels = ()
        self._processes = 0.0

    def observe(self, sample: Sample) -> None:
        if sample.series == "largest_worker_memory_bytes":
            self._largest = sample.labels
        elif sample.series == "job_processes":
            self._processes = sample.value
        else:
            super().observe(sample)

    def explain(self, trend: Trend) -> tuple[str, dict[str, float | str]]:
        evidence: dict[str, float | str] = {"worker_processes": max(0.0, self._processes - 1)}
        largest = dict(self._largest)
        if not largest:
            return WORKER_ADVICE, evidence
        evidence["largest_worker_pid"] = largest["pid"]
        evidence["largest_worker_command"] = largest["command"]
        named = f"The largest worker is pid {largest['pid']} ({largest['command']}). "
        return named + WORKER_ADVICE, evidence
