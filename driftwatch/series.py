"""The series driftwatch knows: one table drives sampling, storage, export and the samples file.

A ``Sample`` names its series by the table's key (``rss_bytes``, ``step_seconds``, ...), the
same names a recorded samples file and ``driftwatch analyze`` use. The exporter derives every
Prometheus metric from this table; adding a signal means adding a row here and a source that
emits it. ``WATCHED`` lists the signals a person looks at: the live view's rows, the summary
at the end of monitoring and the panels of ``driftwatch report``.
"""

from __future__ import annotations

import enum
import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

log = logging.getLogger(__name__)

Labels = tuple[tuple[str, str], ...]
"""Extra identity of a series beyond the run, e.g. ``(("gpu", "0"),)``; sorted by name."""

MAX_LABEL_SETS = 32
"""Label sets one series may have in a run (GPUs, TF devices): more are dropped."""
MAX_LABEL_VALUE_CHARS = 128
"""Label values from outside input (the hook's metadata) are cut to this length."""


RUNTIME_LABELS = ("keras", "python", "tensorflow")
"""The versions ``runtime_info`` carries, as label names (sorted, like every ``Labels``)."""


class Kind(enum.Enum):
    GAUGE = "gauge"
    COUNTER = "counter"


class Scope(enum.Enum):
    """Whether a series belongs to the watched run or to the node (e.g. a whole GPU)."""

    RUN = "run"
    NODE = "node"


class Export(enum.Enum):
    """Which value of a series the exporter shows."""

    LAST = "last"
    RECENT_MEDIAN = "recent_median"  # noisy per-event values: the median of the recent window


@dataclass(frozen=True, slots=True)
class SeriesSpec:
    metric: str
    help: str
    kind: Kind = Kind.GAUGE
    scope: Scope = Scope.RUN
    export: Export = Export.LAST
    label_names: tuple[str, ...] = ()


SERIES: dict[str, SeriesSpec] = {
    # process (psutil)
    "rss_bytes": SeriesSpec(
        "driftwatch_process_resident_memory_bytes", "Resident set size of the target."
    ),
    "cpu_seconds": SeriesSpec(
        "driftwatch_process_cpu_seconds_total",
        "User and system CPU time of the target.",
        Kind.COUNTER,
    ),
    "memory_limit_bytes": SeriesSpec(
        "driftwatch_process_memory_limit_bytes",
        "Memory the target may use: its cgroup's limit, else the host's total memory.",
    ),
    "threads": SeriesSpec("driftwatch_process_threads", "Threads in the target."),
    "open_fds": SeriesSpec("driftwatch_process_open_fds", "Open file descriptors of the target."),
    "read_bytes": SeriesSpec(
        "driftwatch_process_read_bytes_total",
        "Bytes the target caused to be read from storage.",
        Kind.COUNTER,
    ),
    "write_bytes": SeriesSpec(
        "driftwatch_process_write_bytes_total",
        "Bytes the target caused to be written to storage.",
        Kind.COUNTER,
    ),
    "read_syscall_bytes": SeriesSpec(
        "driftwatch_process_read_syscall_bytes_total",
        "Bytes the target passed through read-like system calls (files, sockets, pipes).",
        Kind.COUNTER,
    ),
    "write_syscall_bytes": SeriesSpec(
        "driftwatch_process_write_syscall_bytes_total",
        "Bytes the target passed through write-like system calls (files, sockets, pipes).",
        Kind.COUNTER,
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
    # host contention: the target's cgroup cpu.stat, the node's /proc/pressure
    "cgroup_cpu_periods": SeriesSpec(
        "driftwatch_cgroup_cpu_periods_total",
        "CPU bandwidth periods in which the target's cgroup (the nearest with a CPU quota) was "
        "runnable (cpu.stat).",
        Kind.COUNTER,
    ),
    "cgroup_cpu_throttled_periods": SeriesSpec(
        "driftwatch_cgroup_cpu_throttled_periods_total",
        "Periods in which the target's cgroup used up its CPU quota and was throttled.",
        Kind.COUNTER,
    ),
    "cgroup_cpu_throttled_seconds": SeriesSpec(
        "driftwatch_cgroup_cpu_throttled_seconds_total",
        "Time the target's cgroup spent throttled by its CPU quota.",
        Kind.COUNTER,
    ),
    "pressure_some_seconds": SeriesSpec(
        "driftwatch_node_pressure_some_seconds_total",
        "Time in which some task on the node was stalled waiting for the resource "
        "(/proc/pressure: cpu, io, memory).",
        Kind.COUNTER,
        scope=Scope.NODE,
        label_names=("resource",),
    ),
    "pressure_full_seconds": SeriesSpec(
        "driftwatch_node_pressure_full_seconds_total",
        "Time in which every non-idle task on the node was stalled on the resource at once "
        "(/proc/pressure: io, memory).",
        Kind.COUNTER,
        scope=Scope.NODE,
        label_names=("resource",),
    ),
    # NVML
    "gpu_process_memory_bytes": SeriesSpec(
        "driftwatch_gpu_process_memory_bytes",
        "GPU memory used by the target, per GPU.",
        label_names=("gpu",),
    ),
    "gpu_memory_used_bytes": SeriesSpec(
        "driftwatch_gpu_memory_used_bytes",
        "GPU memory used on the device by all processes.",
        scope=Scope.NODE,
        label_names=("gpu",),
    ),
    "gpu_memory_total_bytes": SeriesSpec(
        "driftwatch_gpu_memory_total_bytes",
        "Total memory of the GPU.",
        scope=Scope.NODE,
        label_names=("gpu",),
    ),
    # NVML: utilization, clocks, power and PCIe of each GPU (driftwatch/sources/nvml_queries.py)
    "gpu_utilization_ratio": SeriesSpec(
        "driftwatch_gpu_utilization_ratio",
        "Share of NVML's last sample period (1/6 s to 1 s, by GPU) in which a kernel ran on the "
        "GPU.",
        scope=Scope.NODE,
        label_names=("gpu",),
    ),
    "gpu_memory_utilization_ratio": SeriesSpec(
        "driftwatch_gpu_memory_utilization_ratio",
        "Share of NVML's last sample period in which the GPU's memory was read or written.",
        scope=Scope.NODE,
        label_names=("gpu",),
    ),
    "gpu_sm_clock_hertz": SeriesSpec(
        "driftwatch_gpu_sm_clock_hertz",
        "Current clock of the GPU's streaming multiprocessors (SM).",
        scope=Scope.NODE,
        label_names=("gpu",),
    ),
    "gpu_sm_clock_max_hertz": SeriesSpec(
        "driftwatch_gpu_sm_clock_max_hertz",
        "Highest SM clock the GPU can run at.",
        scope=Scope.NODE,
        label_names=("gpu",),
    ),
    "gpu_clock_throttled": SeriesSpec(
        "driftwatch_gpu_clock_throttled",
        "1 while NVML reports this reason holding the GPU's clocks down (thermal, power_cap, "
        "hw_slowdown), else 0.",
        scope=Scope.NODE,
        label_names=("gpu", "reason"),
    ),
    "gpu_temperature_celsius": SeriesSpec(
        "driftwatch_gpu_temperature_celsius",
        "Temperature of the GPU die.",
        scope=Scope.NODE,
        label_names=("gpu",),
    ),
    "gpu_power_watts": SeriesSpec(
        "driftwatch_gpu_power_usage_watts",
        "Power the GPU board draws.",
        scope=Scope.NODE,
        label_names=("gpu",),
    ),
    "gpu_power_limit_watts": SeriesSpec(
        "driftwatch_gpu_power_limit_watts",
        "Power limit the GPU enforces (beyond it, clocks are held down: power_cap).",
        scope=Scope.NODE,
        label_names=("gpu",),
    ),
    "gpu_pcie_tx_bytes_per_second": SeriesSpec(
        "driftwatch_gpu_pcie_tx_bytes_per_second",
        "Bytes per second the GPU sent over PCIe (to the host or peers), over NVML's last 20 ms.",
        scope=Scope.NODE,
        label_names=("gpu",),
    ),
    "gpu_pcie_rx_bytes_per_second": SeriesSpec(
        "driftwatch_gpu_pcie_rx_bytes_per_second",
        "Bytes per second the GPU received over PCIe (from the host or peers), over NVML's "
        "last 20 ms.",
        scope=Scope.NODE,
        label_names=("gpu",),
    ),
    "gpu_sm_active_ratio": SeriesSpec(
        "driftwatch_gpu_sm_active_ratio",
        "Share of the GPU's SMs that were busy between two samples (GPM: Hopper and later).",
        scope=Scope.NODE,
        label_names=("gpu",),
    ),
    "gpu_sm_occupancy_ratio": SeriesSpec(
        "driftwatch_gpu_sm_occupancy_ratio",
        "Warps active on the GPU's SMs against the most they can hold, between two samples "
        "(GPM: Hopper and later).",
        scope=Scope.NODE,
        label_names=("gpu",),
    ),
    "gpu_process_sm_utilization_ratio": SeriesSpec(
        "driftwatch_gpu_process_sm_utilization_ratio",
        "Share of time the target's kernels ran on the GPU since the previous sample (NVML "
        "process samples; 0 when NVML has none of the target).",
        label_names=("gpu",),
    ),
    "gpu_process_memory_utilization_ratio": SeriesSpec(
        "driftwatch_gpu_process_memory_utilization_ratio",
        "Share of time the target read or wrote the GPU's memory since the previous sample "
        "(NVML process samples; 0 when NVML has none of the target).",
        label_names=("gpu",),
    ),
    # TensorBoard event files
    "event_files": SeriesSpec("driftwatch_event_files", "TensorBoard event files of the run."),
    "event_file_bytes": SeriesSpec(
        "driftwatch_event_file_bytes", "Total size of the run's TensorBoard event files."
    ),
    "event_file_largest_bytes": SeriesSpec(
        "driftwatch_event_file_largest_bytes",
        "Size of the run's largest single TensorBoard event file.",
    ),
    "event_file_unread_bytes": SeriesSpec(
        "driftwatch_event_file_unread_bytes",
        "Bytes of the run's event files a tick left unread: 0 unless reading falls behind.",
    ),
    "train_step": SeriesSpec("driftwatch_train_step", "Latest training step seen."),
    "step_timestamp": SeriesSpec(
        "driftwatch_last_step_timestamp_seconds",
        "Wall-clock time at which the latest training step was logged.",
    ),
    "step_seconds": SeriesSpec(
        "driftwatch_step_duration_seconds",
        "Median wall-clock time per training step over the recent window.",
        export=Export.RECENT_MEDIAN,
    ),
    # the in-process hook
    "runtime_info": SeriesSpec(
        "driftwatch_runtime_info",
        "Versions the target runs, from its hook: Python, TensorFlow and Keras (empty: not "
        "imported); always 1.",
        label_names=RUNTIME_LABELS,
    ),
    "step_gap_seconds": SeriesSpec(
        "driftwatch_step_gap_seconds",
        "Median seconds per step spent outside the train step (callbacks, input, host work).",
        export=Export.RECENT_MEDIAN,
    ),
    "epoch_seconds": SeriesSpec(
        "driftwatch_epoch_duration_seconds", "Wall-clock duration of the latest epoch."
    ),
    "validation_seconds": SeriesSpec(
        "driftwatch_validation_duration_seconds",
        "Wall-clock time the latest epoch spent in validation.",
    ),
    "tf_allocator_current_bytes": SeriesSpec(
        "driftwatch_tf_allocator_current_bytes",
        "Memory TensorFlow's allocator has in use on a device.",
        label_names=("device",),
    ),
    "tf_allocator_peak_bytes": SeriesSpec(
        "driftwatch_tf_allocator_peak_bytes",
        "Peak memory TensorFlow's allocator has had in use on a device.",
        label_names=("device",),
    ),
    "tracing_count": SeriesSpec(
        "driftwatch_tf_function_traces_total",
        "Times TensorFlow traced the watched train functions again after driftwatch first "
        "read them (retracing when it keeps rising).",
        Kind.COUNTER,
    ),
    "retracing_warnings_total": SeriesSpec(
        "driftwatch_tf_retracing_warnings_total",
        "TensorFlow retracing warnings the job printed (driftwatch run only).",
        Kind.COUNTER,
    ),
    "hook_nonfinite_total": SeriesSpec(
        "driftwatch_hook_nonfinite_values_total",
        "Non-finite (NaN or infinite) losses, metrics or weights the hook has seen.",
        Kind.COUNTER,
    ),
    "hook_records_lost_total": SeriesSpec(
        "driftwatch_hook_records_lost_total",
        "Hook records overwritten before driftwatch read them (the reader fell behind).",
        Kind.COUNTER,
    ),
    "nonfinite_total": SeriesSpec(
        "driftwatch_nonfinite_values_total",
        "Non-finite (NaN or infinite) scalar values seen in the run's logs.",
        Kind.COUNTER,
    ),
}


@dataclass(frozen=True, slots=True)
class Watched:
    """A signal a person looks at, and what each place that shows it calls it (``None``: not
    shown there). Braces name the series' labels: ``GPU {gpu} memory``."""

    view: str | None = None  # its rows in the live view and the plain progress line
    summary: str | None = None  # its line in the summary printed when monitoring ends
    panel: str | None = None  # the title of its panels in ``driftwatch report``
    panel_rank: int = 0  # where its panels come among the report's, first to last
    also: tuple[str, ...] = ()  # the other series its readings use (limits, totals, peaks)


WATCHED: dict[str, Watched] = {
    "rss_bytes": Watched(
        view="RSS",
        summary="RSS",
        panel="Memory: RSS",
        panel_rank=1,
        also=("memory_limit_bytes",),
    ),
    "cpu_seconds": Watched(view="CPU"),
    "threads": Watched(view="threads / fds", also=("open_fds",)),
    "gpu_process_memory_bytes": Watched(
        view="GPU {gpu} memory",
        panel="Memory: GPU {gpu}",
        panel_rank=3,
        also=("gpu_memory_total_bytes",),
    ),
    "event_file_bytes": Watched(
        view="event files",
        summary="event files",
        panel="Event files",
        panel_rank=4,
        also=("event_files", "event_file_largest_bytes"),
    ),
    "step_seconds": Watched(
        view="step", summary="steps", panel="Step time", panel_rank=0, also=("train_step",)
    ),
    "step_gap_seconds": Watched(view="outside the step", also=("step_seconds",)),
    "tf_allocator_current_bytes": Watched(
        view="TF memory {device}",
        panel="Memory: TF {device}",
        panel_rank=2,
        also=("tf_allocator_peak_bytes",),
    ),
    "tracing_count": Watched(view="tf.function", also=("retracing_warnings_total",)),
    "nonfinite_total": Watched(view="non-finite values", also=("hook_nonfinite_total",)),
    "nondisk_write_bytes": Watched(panel="Uploads and other non-disk writes", panel_rank=5),
}
"""The signals a person looks at, keyed by the series each is about, in the live view's order."""


@dataclass(frozen=True, slots=True)
class Sample:
    """One observation of one series at a wall-clock time (unix seconds)."""

    series: str
    value: float
    t: float
    labels: Labels = ()


SeriesKey = tuple[str, Labels]


def key_of(sample: Sample) -> SeriesKey:
    return (sample.series, sample.labels)


def checked_labels(series: str, labels: Mapping[object, object]) -> Labels | None:
    """The labels of a ``series`` named by outside input, in table form; None when the table
    has no such series or it takes other label names. Values are cut to a bounded length."""
    spec = SERIES.get(series)
    if spec is None or sorted(map(str, labels)) != sorted(spec.label_names):
        return None
    return tuple(sorted((str(k), str(v)[:MAX_LABEL_VALUE_CHARS]) for k, v in labels.items()))


class LabelSetLimit:
    """Admits at most ``limit`` label sets per series, the first ones seen.

    Bounds the memory of the store and the detectors and the exported cardinality, whatever
    a source sends; each series that reaches the limit is logged once.
    """

    def __init__(self, limit: int = MAX_LABEL_SETS) -> None:
        self._limit = limit
        self._seen: dict[str, set[Labels]] = {}
        self._full: set[str] = set()

    def admit(self, samples: Iterable[Sample]) -> list[Sample]:
        admitted = []
        for sample in samples:
            seen = self._seen.setdefault(sample.series, set())
            if sample.labels not in seen:
                if len(seen) >= self._limit:
                    if sample.series not in self._full:
                        self._full.add(sample.series)
                        log.warning(
                            "%s has %d label sets already; samples with new labels are dropped",
                            sample.series,
                            self._limit,
                        )
                    continue
                seen.add(sample.labels)
            admitted.append(sample)
        return admitted
