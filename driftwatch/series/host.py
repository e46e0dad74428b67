"""Host contention: the target's cgroup ``cpu.stat`` and the node's ``/proc/pressure``
(driftwatch/sources/host.py)."""

from __future__ import annotations

from driftwatch.series.spec import MetricType, Scope, SeriesSpec

HOST: dict[str, SeriesSpec] = {
    "cgroup_cpu_periods": SeriesSpec(
        "driftwatch_cgroup_cpu_periods_total",
        "CPU bandwidth periods in which the target's cgroup (the nearest with a CPU quota) was "
        "runnable (cpu.stat).",
        MetricType.COUNTER,
    ),
    "cgroup_cpu_throttled_periods": SeriesSpec(
        "driftwatch_cgroup_cpu_throttled_periods_total",
        "Periods in which the target's cgroup used up its CPU quota and was throttled.",
        MetricType.COUNTER,
    ),
    "cgroup_cpu_throttled_seconds": SeriesSpec(
        "driftwatch_cgroup_cpu_throttled_seconds_total",
        "Time the target's cgroup spent throttled by its CPU quota.",
        MetricType.COUNTER,
    ),
    "pressure_some_seconds": SeriesSpec(
        "driftwatch_node_pressure_some_seconds_total",
        "Time in which some task on the node was stalled waiting for the resource "
        "(/proc/pressure: cpu, io, memory).",
        MetricType.COUNTER,
        scope=Scope.NODE,
        label_names=("resource",),
    ),
    "pressure_full_seconds": SeriesSpec(
        "driftwatch_node_pressure_full_seconds_total",
        "Time in which every non-idle task on the node was stalled on the resource at once "
        "(/proc/pressure: io, memory).",
        MetricType.COUNTER,
        scope=Scope.NODE,
        label_names=("resource",),
    ),
}
