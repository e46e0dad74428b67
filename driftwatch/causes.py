"""The likely causes a slowdown or stall finding names: a fixed set, as ``KINDS`` is of kinds;
and the classes of a host-memory leak.

``CAUSES`` is the table (a name, a title, what it means, the fix); ``RankedCause`` is one
cause as a finding carries it, with its score and the numbers that moved; ``USUAL_CAUSES``
is what a slowdown says instead when no measured signal moved with it. The ranking itself
lives in ``driftwatch.detect.causes.ranker``; how co-moving is judged: docs/causes.md, "Co-moving".
``LEAK_CLASSES`` is the table of leak classes (a name, a title, what the signals show, the
fix), told apart by ``driftwatch.detect.memory.host``; ``UNKNOWN_LEAK_CLASS`` says why a
class cannot be told yet.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field


@dataclass(frozen=True, slots=True)
class CauseSpec:
    """What a cause is called, what its signals say and what to try."""

    title: str
    means: str
    fix: str


CAUSES: dict[str, CauseSpec] = {
    "gpu_thermal": CauseSpec(
        "GPU clocks throttled by heat",
        "NVML reports thermal slowdown and the SM clock fell below what it was",
        "check the GPU's cooling and airflow, the node's fans and inlet temperature",
    ),
    "gpu_power_cap": CauseSpec(
        "GPU clocks held down by the power cap",
        "NVML reports the power cap holding the clocks and the SM clock fell",
        "check the board's power limit (nvidia-smi -q -d POWER) and the node's power budget",
    ),
    "gpu_hw_slowdown": CauseSpec(
        "GPU hardware slowdown",
        "NVML reports a hardware slowdown (power brake, overheating) holding the clocks",
        "check the node's power supply and the GPU's health (nvidia-smi -q, dmesg)",
    ),
    "host_cpu_contention": CauseSpec(
        "Host CPU contention",
        "the node's CPU pressure rose while the job got less CPU time per second",
        "find the other busy processes on the node (top); pin or move the job or them",
    ),
    "cgroup_cpu_throttled": CauseSpec(
        "CPU quota throttling",
        "the job's cgroup used up its CPU quota more often",
        "raise the container's CPU limit or use fewer threads (tf.config.threading)",
    ),
    "input_wait": CauseSpec(
        "Waiting for input",
        "a larger share of each step waits for the input pipeline",
        "prefetch, map with num_parallel_calls=tf.data.AUTOTUNE, cache, read faster storage",
    ),
    "collective_wait": CauseSpec(
        "Waiting for the other ranks",
        "a larger share of each step waits in the collectives (all-reduce) for the other "
        "ranks of the job, or for the network between them",
        "find the rank the others wait for (the lowest driftwatch_collective_wait_ratio of the "
        "run; its own findings name its cause); if every rank waits alike, the network",
    ),
    "process_stopped": CauseSpec(
        "Process stopped",
        "the process was stopped (SIGSTOP, SIGTSTP or a tracer) and ran nothing",
        "resume it (kill -CONT PID) or find what stopped it (a shell's Ctrl-Z, a debugger)",
    ),
    "host_time": CauseSpec(
        "Callbacks and host work between steps",
        "a larger share of each step is spent outside the train step",
        "profile the callbacks; log, save and evaluate less often; avoid per-step host syncs",
    ),
    "retracing": CauseSpec(
        "tf.function retracing",
        "the train function is traced again more often",
        "pass tensors, not Python values; give tf.function an input_signature",
    ),
    "memory_near_limit": CauseSpec(
        "Memory near its limit",
        "resident memory came close to the limit (swapping, reclaim)",
        "find what grows (driftwatch's memory findings); a smaller batch or cache",
    ),
    "allocator_fragmentation": CauseSpec(
        "TF allocator fragmentation",
        "the allocator's peak rose far above what it holds",
        "keep shapes fixed (padding, bucketing); TF_GPU_ALLOCATOR=cuda_malloc_async on GPUs",
    ),
    "event_file_volume": CauseSpec(
        "Event-file volume",
        "the job writes its TensorBoard event files faster",
        "log summaries, images and histograms less often (update_freq, histogram_freq)",
    ),
    "upload_volume": CauseSpec(
        "Upload volume",
        "the job writes more to sockets and pipes (uploads, remote logging)",
        "upload less often or asynchronously; check what a remote logger sends per step",
    ),
    "storage_reads": CauseSpec(
        "Storage reads",
        "the job reads more from storage, or the node waits longer on I/O",
        "cache the dataset (tf.data cache, local disk), check the disk or network store",
    ),
}
"""Every cause a slowdown or stall can be given, in the order ties are ranked."""

USUAL_CAUSES: dict[str, str] = {
    "gradual_slowdown": (
        "Its usual causes: an input pipeline or cache that degrades, growing Python-side state "
        "per step (lists, metrics, summaries), retracing, memory pressure or thermal "
        "throttling. Compare a py-spy or TF Profiler trace of the slow steps with one from "
        "before they slowed."
    ),
    "abrupt_slowdown": (
        "Look at what changed then: a new data shard or augmentation, a learning-rate or "
        "mixed-precision switch, another job on the same device or host, a throttled disk or "
        "network."
    ),
}
"""The usual causes a slowdown's message lists, by its kind, after saying that no measured
signal moved with it."""


@dataclass(frozen=True, slots=True)
class LeakClassSpec:
    """What a leak class is called, what its signals show and what to try; its advice, as a
    finding says it, is the two joined."""

    title: str
    means: str
    fix: str

    @property
    def advice(self) -> str:
        return f"{self.means}: {self.fix}"


LEAK_CLASSES: dict[str, LeakClassSpec] = {
    "tensors_kept_alive": LeakClassSpec(
        "Tensors kept alive",
        "TensorFlow's own allocator grows with it",
        "tensors are being kept alive, e.g. outputs or losses appended to a Python list, or a "
        "tf.Variable/metric that accumulates, or whole models kept alive (models built in a "
        "loop: keras.backend.clear_session() between them). Keep Python floats (loss.numpy()) "
        "instead of tensors.",
    ),
    "retracing": LeakClassSpec(
        "tf.function retracing",
        "TensorFlow allocator memory is flat while the train function keeps being retraced",
        "each trace keeps a new graph alive. Pass tensors, not Python numbers, to tf.function "
        "(tf.constant(lr)), or give it an input_signature; use reduce_retracing=True for "
        "varying shapes.",
    ),
    "framework_state": LeakClassSpec(
        "Python or framework state",
        "TensorFlow allocator memory and tracing are flat",
        "Python or framework state grows, e.g. models or layers built in a loop without "
        "keras.backend.clear_session(), histories or caches that keep growing, or allocator "
        "fragmentation (try TCMALLOC or jemalloc).",
    ),
}
"""Every class a host-memory leak can be given, in the order they are tried: RSS and the TF
allocator rise together; RSS rises while tracing does; RSS rises alone."""

UNKNOWN_LEAK_CLASS: dict[str, str] = {
    "not_probed_yet": (
        "TensorFlow's allocator has not been probed over this window yet: the likely class "
        "follows once it has."
    ),
    "no_allocator_statistics": (
        "TensorFlow's allocator keeps no statistics here (its CPU allocator does not by "
        "default; driftwatch run --cpu-allocator-stats turns them on), so tensors cannot be "
        "told from Python state: compare two tracemalloc snapshots."
    ),
    "no_hook": (
        "Without the in-process hook driftwatch cannot tell tensors from Python state: run "
        "the job under driftwatch run, or compare two tracemalloc snapshots."
    ),
}
"""The advice of a leak classed ``unknown``, by why its class cannot be told."""


@dataclass(frozen=True, slots=True)
class RankedCause:
    """One likely cause of a finding: its ``score`` (1 or more: the signal clearly moved;
    higher ranks first) and its ``numbers`` before and after (or during stalls and between
    them); ``detail`` says where (a GPU, a device), if anywhere."""

    cause: str
    score: float
    numbers: Mapping[str, float] = field(default_factory=dict)
    detail: str = ""

    def __post_init__(self) -> None:
        if self.cause not in CAUSES:
            raise ValueError(f"{self.cause!r} is no cause: give it a row in CAUSES")

    def to_dict(self) -> dict[str, object]:
        """As JSON holds it: the finding's ``evidence["causes"]``."""
        data: dict[str, object] = {
            "cause": self.cause,
            "score": round(self.score, 3),
            "numbers": dict(self.numbers),
        }
        if self.detail:
            data["detail"] = self.detail
        return data


def cause_line(cause: RankedCause) -> str:
    """One cause as a report lists it: its title, where, its numbers and the fix."""
    spec = CAUSES[cause.cause]
    where = f" on {cause.detail}" if cause.detail else ""
    return f"{spec.title}{where} (score {cause.score:.1f}: {numbers_said(cause)}); {spec.fix}"


def numbers_said(cause: RankedCause) -> str:
    """A cause's numbers as ``name before -> after`` pairs, in the units their names end in."""
    parts = []
    for key, value in cause.numbers.items():
        if not key.endswith("_before"):
            continue
        name = key.removesuffix("_before")
        after = cause.numbers.get(f"{name}_after", math.nan)
        parts.append(f"{name.replace('_', ' ')} {_unit(name, value)} -> {_unit(name, after)}")
    return ", ".join(parts)


def _unit(name: str, value: float) -> str:
    if not math.isfinite(value):
        return "-"
    if name.endswith("_hertz"):
        return f"{value / 1e6:.0f} MHz"
    if name.endswith("_bytes_per_second"):
        return f"{value / 2**20:.2f} MiB/s"
    if name.endswith(("_share", "_ratio")):
        return f"{value:.0%}"
    if name.endswith("_seconds"):
        return f"{value * 1e3:.1f} ms" if value < 1 else f"{value:.2f} s"
    return f"{value:.3g}"
