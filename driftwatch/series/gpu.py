"""NVML: GPU memory, utilization, clocks, power and PCIe of each GPU and of the target on it
(driftwatch/sources/nvml.py, nvml_queries.py)."""

from __future__ import annotations

from driftwatch.series.spec import Scope, SeriesSpec

GPU: dict[str, SeriesSpec] = {
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
}
