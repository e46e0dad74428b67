"""The NVML device queries beyond memory: utilization, SM clock, clock-event (throttle)
reasons, temperature, power, PCIe throughput, the target's utilization samples and GPM's SM
activity; one reading of one GPU each.

A query that a GPU or its driver lacks (NVML: not supported, function not found, no
permission, invalid argument; GPM: not a supported device) is switched off for that GPU with
one warning and never called there again; one that the installed nvidia-ml-py lacks is
switched off for every GPU, with one warning. ``NvmlSource`` turns any other NVML error into
``SourceUnavailable``. This module receives the ``pynvml`` module from ``NvmlSource``: it is
imported only there.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from driftwatch.series import Labels, Sample

log = logging.getLogger("driftwatch.sources.nvml")

HERTZ_PER_MHZ = 1e6
"""NVML reports clocks in MHz."""
WATTS_PER_MILLIWATT = 1e-3
"""NVML reports power in milliwatts."""
BYTES_PER_KB = 1024
"""NVML reports PCIe throughput in KB/s, of 1024 bytes (as nvidia-smi and nvitop read it)."""
RATIO_PER_PERCENT = 0.01
"""NVML reports utilization and GPM SM activity in percent."""
GPM_MIN_SECONDS = 0.1
"""Shortest time between the two GPM samples of one reading that NVML accepts, in seconds."""

THROTTLE_REASONS: dict[str, tuple[str, ...]] = {
    "thermal": ("SwThermalSlowdown", "HwThermalSlowdown"),
    "power_cap": ("SwPowerCap",),
    "hw_slowdown": ("HwSlowdown", "HwPowerBrakeSlowdown"),
}
"""The clock-event reasons exported (the ``reason`` label), each with the NVML reasons it
covers (names after ``nvmlClocksEventReason``/``nvmlClocksThrottleReason``)."""

Reading = tuple[str, float, Labels]
"""One value a query read: its series, the value, and labels beyond the GPU's."""


class Lacking(Exception):
    """A query this GPU cannot answer, said without an NVML error (e.g. GPM unsupported)."""


@dataclass
class Gpu:
    """One GPU and what its queries remember between readings."""

    index: int
    handle: Any
    off: set[str] = field(default_factory=set)  # queries found missing on this GPU
    max_sm_clock: float | None = None  # static: read once
    last_seen_us: int = 0  # the newest process sample read, NVML's CPU timestamp in µs
    gpm_samples: list[Any] = field(default_factory=list)  # two, once GPM is set up
    gpm_request: Any = None
    gpm_taken_at: float | None = None  # when the previous GPM sample was taken

    @property
    def labels(self) -> Labels:
        return (("gpu", str(self.index)),)


@dataclass(frozen=True)
class Query:
    """One NVML query: what the log calls it, the bindings it needs, how it reads a GPU."""

    name: str
    needs: tuple[str, ...]
    read: Callable[[Queries, Gpu, float], list[Reading]]


class Queries:
    """The device queries of one initialised NVML, read GPU by GPU; ``pid`` is the target."""

    def __init__(self, nvml: Any, pid: int) -> None:
        self.nvml = nvml
        self.pid = pid
        self.lacking: tuple[type[BaseException], ...] = (
            Lacking,
            nvml.NVMLError_NotSupported,
            nvml.NVMLError_FunctionNotFound,
            nvml.NVMLError_NoPermission,
            nvml.NVMLError_InvalidArgument,
        )
        self.reasons_of = _reasons_function(nvml)
        self.reason_bits = _reason_bits(nvml)
        self.queries: list[Query] = []
        for query in QUERIES:
            missing = [name for name in query.needs if not hasattr(nvml, name)]
            if query.name == "clock-event reasons" and (
                self.reasons_of is None or len(self.reason_bits) < len(THROTTLE_REASONS)
            ):
                missing.append("nvmlDeviceGetCurrentClocksEventReasons")
            if missing:
                log.warning(
                    "this nvidia-ml-py has no %s: GPU %s is not monitored (install a newer "
                    "nvidia-ml-py)",
                    missing[0],
                    query.name,
                )
            else:
                self.queries.append(query)

    def read(self, gpu: Gpu, now: float) -> Iterator[Sample]:
        """Every reading of ``gpu`` its queries give; NVML errors other than a query the GPU
        lacks propagate."""
        for query in self.queries:
            if query.name in gpu.off:
                continue
            try:
                readings = query.read(self, gpu, now)
            except self.lacking as err:
                gpu.off.add(query.name)
                if query.name == "SM activity (GPM)":
                    self._free_gpm(gpu)
                log.warning(
                    "GPU %d cannot report %s (%s): it is not monitored on that GPU",
                    gpu.index,
                    query.name,
                    err,
                )
                continue
            for series, value, labels in readings:
                yield Sample(series, value, now, gpu.labels + labels)

    def close(self, gpus: list[Gpu]) -> None:
        """Free what the queries hold in NVML (GPM samples); before ``nvmlShutdown``."""
        for gpu in gpus:
            self._free_gpm(gpu)

    def _free_gpm(self, gpu: Gpu) -> None:
        samples, gpu.gpm_samples = gpu.gpm_samples, []
        for sample in samples:
            with contextlib.suppress(self.nvml.NVMLError):
                self.nvml.nvmlGpmSampleFree(sample)

    # The queries, in the order they are read.

    def utilization(self, gpu: Gpu, now: float) -> list[Reading]:
        rates = self.nvml.nvmlDeviceGetUtilizationRates(gpu.handle)
        return [
            ("gpu_utilization_ratio", rates.gpu * RATIO_PER_PERCENT, ()),
            ("gpu_memory_utilization_ratio", rates.memory * RATIO_PER_PERCENT, ()),
        ]

    def sm_clock(self, gpu: Gpu, now: float) -> list[Reading]:
        nvml = self.nvml
        clock = nvml.nvmlDeviceGetClockInfo(gpu.handle, nvml.NVML_CLOCK_SM)
        if gpu.max_sm_clock is None:
            gpu.max_sm_clock = float(nvml.nvmlDeviceGetMaxClockInfo(gpu.handle, nvml.NVML_CLOCK_SM))
        return [
            ("gpu_sm_clock_hertz", clock * HERTZ_PER_MHZ, ()),
            ("gpu_sm_clock_max_hertz", gpu.max_sm_clock * HERTZ_PER_MHZ, ()),
        ]

    def clock_events(self, gpu: Gpu, now: float) -> list[Reading]:
        assert self.reasons_of is not None  # else the query is not in the list
        active = int(self.reasons_of(gpu.handle))
        return [
            ("gpu_clock_throttled", float(bool(active & bits)), (("reason", reason),))
            for reason, bits in self.reason_bits.items()
        ]

    def temperature(self, gpu: Gpu, now: float) -> list[Reading]:
        nvml = self.nvml
        celsius = nvml.nvmlDeviceGetTemperature(gpu.handle, nvml.NVML_TEMPERATURE_GPU)
        return [("gpu_temperature_celsius", float(celsius), ())]

    def power(self, gpu: Gpu, now: float) -> list[Reading]:
        milliwatts = self.nvml.nvmlDeviceGetPowerUsage(gpu.handle)
        return [("gpu_power_watts", milliwatts * WATTS_PER_MILLIWATT, ())]

    def power_limit(self, gpu: Gpu, now: float) -> list[Reading]:
        milliwatts = self.nvml.nvmlDeviceGetEnforcedPowerLimit(gpu.handle)
        return [("gpu_power_limit_watts", milliwatts * WATTS_PER_MILLIWATT, ())]

    def pcie(self, gpu: Gpu, now: float) -> list[Reading]:
        nvml = self.nvml
        sent = nvml.nvmlDeviceGetPcieThroughput(gpu.handle, nvml.NVML_PCIE_UTIL_TX_BYTES)
        received = nvml.nvmlDeviceGetPcieThroughput(gpu.handle, nvml.NVML_PCIE_UTIL_RX_BYTES)
        return [
            ("gpu_pcie_tx_bytes_per_second", float(sent * BYTES_PER_KB), ()),
            ("gpu_pcie_rx_bytes_per_second", float(received * BYTES_PER_KB), ()),
        ]

    def process_utilization(self, gpu: Gpu, now: float) -> list[Reading]:
        """The target's mean utilization over the samples NVML took since the last read."""
        nvml = self.nvml
        try:
            samples = nvml.nvmlDeviceGetProcessUtilization(gpu.handle, gpu.last_seen_us)
        except nvml.NVMLError as err:
            # NotFound: no sample since then. pynvml raises NVMLError(NVML_SUCCESS) when the
            # first call finds none either. Both mean nothing ran: no error.
            if not (isinstance(err, nvml.NVMLError_NotFound) or err.value == 0):
                raise
            samples = []
        mine = [s for s in samples if s.pid == self.pid and s.timeStamp > gpu.last_seen_us]
        gpu.last_seen_us = max([gpu.last_seen_us, *(int(s.timeStamp) for s in samples)])
        sm = sum(s.smUtil for s in mine) / len(mine) if mine else 0.0
        memory = sum(s.memUtil for s in mine) / len(mine) if mine else 0.0
        return [
            ("gpu_process_sm_utilization_ratio", sm * RATIO_PER_PERCENT, ()),
            ("gpu_process_memory_utilization_ratio", memory * RATIO_PER_PERCENT, ()),
        ]

    def sm_activity(self, gpu: Gpu, now: float) -> list[Reading]:
        """GPM's SM activity and occupancy between the previous sample and one taken now."""
        nvml = self.nvml
        if not gpu.gpm_samples:
            if not nvml.nvmlGpmQueryDeviceSupport(gpu.handle).isSupportedDevice:
                raise Lacking("GPM is not supported on this GPU")
            request = nvml.c_nvmlGpmMetricsGet_t()
            request.version = nvml.NVML_GPM_METRICS_GET_VERSION
            request.numMetrics = 2
            request.metrics[0].metricId = nvml.NVML_GPM_METRIC_SM_UTIL
            request.metrics[1].metricId = nvml.NVML_GPM_METRIC_SM_OCCUPANCY
            gpu.gpm_request = request
            for _ in range(2):
                gpu.gpm_samples.append(nvml.nvmlGpmSampleAlloc())
        previous_at = gpu.gpm_taken_at
        if previous_at is not None and 0 <= now - previous_at < GPM_MIN_SECONDS:
            return []  # too soon after the previous sample: read at the next tick
        previous, current = gpu.gpm_samples
        nvml.nvmlGpmSampleGet(gpu.handle, current)
        gpu.gpm_samples.reverse()
        gpu.gpm_taken_at = now
        if previous_at is None or now < previous_at:
            return []  # the first sample (or the clock went back): no interval yet
        request = gpu.gpm_request
        request.sample1, request.sample2 = previous, current
        nvml.nvmlGpmMetricsGet(request)
        readings: list[Reading] = []
        for series, metric in zip(
            ("gpu_sm_active_ratio", "gpu_sm_occupancy_ratio"), request.metrics, strict=False
        ):
            if metric.nvmlReturn == nvml.NVML_SUCCESS:
                readings.append((series, float(metric.value) * RATIO_PER_PERCENT, ()))
        return readings


QUERIES = (
    Query("utilization", ("nvmlDeviceGetUtilizationRates",), Queries.utilization),
    Query(
        "SM clock",
        ("nvmlDeviceGetClockInfo", "nvmlDeviceGetMaxClockInfo", "NVML_CLOCK_SM"),
        Queries.sm_clock,
    ),
    Query("clock-event reasons", (), Queries.clock_events),
    Query("temperature", ("nvmlDeviceGetTemperature", "NVML_TEMPERATURE_GPU"), Queries.temperature),
    Query("power draw", ("nvmlDeviceGetPowerUsage",), Queries.power),
    Query("power limit", ("nvmlDeviceGetEnforcedPowerLimit",), Queries.power_limit),
    Query(
        "PCIe throughput",
        ("nvmlDeviceGetPcieThroughput", "NVML_PCIE_UTIL_TX_BYTES", "NVML_PCIE_UTIL_RX_BYTES"),
        Queries.pcie,
    ),
    Query(
        "per-process utilization",
        ("nvmlDeviceGetProcessUtilization", "NVMLError_NotFound"),
        Queries.process_utilization,
    ),
    Query(
        "SM activity (GPM)",
        (
            "nvmlGpmQueryDeviceSupport",
            "nvmlGpmSampleAlloc",
            "nvmlGpmSampleGet",
            "nvmlGpmSampleFree",
            "nvmlGpmMetricsGet",
            "c_nvmlGpmMetricsGet_t",
            "NVML_GPM_METRICS_GET_VERSION",
            "NVML_GPM_METRIC_SM_UTIL",
            "NVML_GPM_METRIC_SM_OCCUPANCY",
            "NVML_SUCCESS",
        ),
        Queries.sm_activity,
    ),
)
"""Every device query beyond memory, in the order each GPU is read."""


def _reasons_function(nvml: Any) -> Callable[[Any], int] | None:
    """The clock-event reasons query: newer nvidia-ml-py names it so, older only by its
    deprecated name (throttle reasons)."""
    for name in (
        "nvmlDeviceGetCurrentClocksEventReasons",
        "nvmlDeviceGetCurrentClocksThrottleReasons",
    ):
        function = getattr(nvml, name, None)
        if function is not None:
            return function  # type: ignore[no-any-return]
    return None


def _reason_bits(nvml: Any) -> dict[str, int]:
    """Each exported reason's NVML bit mask; a reason whose constants are missing is left out."""
    found = {}
    for reason, names in THROTTLE_REASONS.items():
        bits = [
            getattr(nvml, f"nvmlClocksEventReason{name}", None)
            or getattr(nvml, f"nvmlClocksThrottleReason{name}", None)
            for name in names
        ]
        if all(isinstance(bit, int) for bit in bits):
            mask = 0
            for bit in bits:
                mask |= int(bit)  # type: ignore[arg-type]
            found[reason] = mask
    return found
