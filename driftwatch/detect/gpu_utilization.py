"""Sustained low GPU utilization while training steps progress: a GPU the run holds memory on
that mostly idles. Reasoning: docs/gpu.md, "Low GPU utilization".
"""

from __future__ import annotations

import math

from driftwatch.detect import Evaluation
from driftwatch.detect.windows import WindowMeans
from driftwatch.findings import KINDS, Finding
from driftwatch.series import Labels, Sample

LOW_UTILIZATION_RATIO = 0.3
"""Mean utilization of every judged window below which a GPU counts as mostly idle (0-1)."""
WINDOW_SECONDS = 60.0
"""Width of the windows whose mean utilization is judged (seconds)."""
LOW_WINDOWS = 5
"""Consecutive low windows needed: utilization low for this many minutes."""
PROGRESS_SECONDS = 120.0
"""A training step must have been seen this recently for the run to count as training (s)."""

PROCESS = "gpu_process_sm_utilization_ratio"
DEVICE = "gpu_utilization_ratio"


class _Gpu:
    """One GPU's windows of the target's own utilization and of the whole device's."""

    __slots__ = ("device", "process", "used")

    def __init__(self) -> None:
        self.process = WindowMeans(WINDOW_SECONDS, LOW_WINDOWS)
        self.device = WindowMeans(WINDOW_SECONDS, LOW_WINDOWS)
        self.used = False  # the target holds memory on it

    def judged(self) -> tuple[str, WindowMeans]:
        """The target's own samples where NVML gives them, else the device's."""
        return ("process", self.process) if self.process.means else ("device", self.device)


class LowGpuUtilizationDetector:
    """Each GPU the target holds memory on whose utilization (the target's own samples where
    NVML has them, else the device's) stayed under ``LOW_UTILIZATION_RATIO`` in each of the
    newest ``LOW_WINDOWS`` one-minute windows, while training steps kept coming."""

    name = "low_gpu_utilization"
    series = frozenset({PROCESS, DEVICE, "gpu_process_memory_bytes", "train_step"})

    def __init__(self) -> None:
        self._gpus: dict[Labels, _Gpu] = {}
        self._step = math.nan  # the newest train step seen
        self._progress_t = math.nan  # when it last advanced

    def observe(self, sample: Sample) -> None:
        value = sample.value
        if not math.isfinite(value):
            return
        if sample.series == "train_step":
            if not value <= self._step:  # advanced, or the first seen
                self._step, self._progress_t = value, sample.t
            return
        gpu = self._gpus.get(sample.labels)
        if gpu is None:
            if len(self._gpus) >= 64:  # more GPUs than a node holds: malformed labels
                return
            gpu = self._gpus[sample.labels] = _Gpu()
        if sample.series == "gpu_process_memory_bytes":
            gpu.used = gpu.used or value > 0
        elif sample.series == PROCESS:
            gpu.process.add(sample.t, value)
        else:
            gpu.device.add(sample.t, value)

    def evaluate(self, now: float) -> Evaluation:
        training = math.isfinite(self._progress_t) and now - self._progress_t <= PROGRESS_SECONDS
        score = 0.0
        findings: list[Finding] = []
        for labels, gpu in self._gpus.items():
            source, windows = gpu.judged()
            if not gpu.used or len(windows.means) < LOW_WINDOWS:
                continue
            highest = max(mean for _, mean in windows.means)
            mean = sum(mean for _, mean in windows.means) / LOW_WINDOWS
            gpu_score = LOW_UTILIZATION_RATIO / max(highest, 1e-3)
            if not training:
                gpu_score = min(gpu_score, 0.99)
            score = max(score, gpu_score)
            if gpu_score < 1:
                continue
            findings.append(self._finding(labels, source, mean, windows.means[0][0]))
        return Evaluation(score, tuple(findings))

    @staticmethod
    def _finding(labels: Labels, source: str, mean: float, since: float) -> Finding:
        where = " ".join(v for _, v in labels) or "?"
        whose = "the run's kernels ran" if source == "process" else "kernels ran"
        minutes = LOW_WINDOWS * WINDOW_SECONDS / 60
        message = (
            f"on GPU {where}, {whose} only {mean:.0%} of the time over the last "
            f"{minutes:g} minutes while training steps kept coming: the GPU mostly waits, for "
            "the input pipeline, host work or synchronisation. If the run is input-bound "
            "(its input_bound finding, or driftwatch_input_wait_ratio), prefetch "
            "(dataset.prefetch(tf.data.AUTOTUNE)), map in parallel (num_parallel_calls="
            "tf.data.AUTOTUNE) and cache (dataset.cache()); otherwise use a larger batch and "
            "avoid host syncs in the loop (.numpy() or float(loss) every step)."
        )
        evidence: dict[str, float | str] = {
            "gpu": where,
            "utilization": mean,
            "utilization_of": source,
            "window_seconds": LOW_WINDOWS * WINDOW_SECONDS,
        }
        kind = "low_gpu_utilization"
        return Finding(kind, KINDS[kind].severity, since, message, evidence)
