"""Memory drift of the job's worker processes (data-loader workers, pools, subprocesses),
judged on their summed memory (``workers_memory_bytes``, pages shared after ``fork`` counted
once) against what the job's limit leaves them, and naming the largest worker."""

from __future__ import annotations

from driftwatch.detect.memory.drift import ResourceDriftDetector
from driftwatch.detect.memory.resources import RESOURCES
from driftwatch.detect.memory.trends import MemoryThresholds, Trend
from driftwatch.series import Labels, Sample


class WorkerMemoryDetector(ResourceDriftDetector):
    """Drift of the workers' summed memory (the ``worker_memory`` row of ``RESOURCES``),
    with the largest worker (PID and command line) in its evidence: the process that grows."""

    def __init__(self, thresholds: MemoryThresholds | None = None) -> None:
        super().__init__(RESOURCES["worker_memory"], thresholds)
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
        advice = self.resource.advice
        evidence: dict[str, float | str] = {"worker_processes": max(0.0, self._processes - 1)}
        largest = dict(self._largest)
        if not largest:
            return advice, evidence
        evidence["largest_worker_pid"] = largest["pid"]
        evidence["largest_worker_command"] = largest["command"]
        return (
            f"The largest worker is pid {largest['pid']} ({largest['command']}). {advice}",
            evidence,
        )
