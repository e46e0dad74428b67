"""A fake ``pynvml`` (nvidia-ml-py) with named scenarios, for tests on machines without GPUs.

It mirrors what the NVML source relies on: ``NVMLError(code)`` builds the subclass for that
code (``NVMLError_GpuIsLost``, ...; the names and codes of the real module), every error has
``.value``, ``NVMLLibraryMismatchError`` is not an ``NVMLError``, and device calls made
before ``nvmlInit`` or after ``nvmlShutdown`` raise ``NVMLError_Uninitialized``. The device
queries take the real module's arguments and constants (``NVML_CLOCK_SM``, ...), return its
units (MHz, mW, KB/s, percent) and field names, and check them; GPM samples must be
allocated, and are counted until freed. ``tests/test_nvml.py`` compares the names, values and
signatures with the installed nvidia-ml-py.
"""

from __future__ import annotations

import sys
import types
from collections import Counter
from dataclasses import dataclass, field
from typing import ClassVar, Literal

import pytest

GIB = 1 << 30

Scenario = Literal[
    "ok",
    "lib_not_found",
    "driver_not_loaded",
    "no_permission",
    "gpu_lost",
    "pid_vanished",
    "process_query_not_supported",
    "memory_not_available",
    "driver_too_old",
    "throttling",
    "queries_not_supported",
    "old_bindings",
    "utilization_drop",
]

# Every NVML_ERROR_* code of nvidia-ml-py, by the name of the class it generates for it.
ERROR_CODES = {
    "Uninitialized": 1,
    "InvalidArgument": 2,
    "NotSupported": 3,
    "NoPermission": 4,
    "AlreadyInitialized": 5,
    "NotFound": 6,
    "InsufficientSize": 7,
    "InsufficientPower": 8,
    "DriverNotLoaded": 9,
    "Timeout": 10,
    "IrqIssue": 11,
    "LibraryNotFound": 12,
    "FunctionNotFound": 13,
    "CorruptedInforom": 14,
    "GpuIsLost": 15,
    "ResetRequired": 16,
    "OperatingSystem": 17,
    "LibRmVersionMismatch": 18,
    "InUse": 19,
    "Memory": 20,
    "NoData": 21,
    "VgpuEccNotSupported": 22,
    "InsufficientResources": 23,
    "FreqNotSupported": 24,
    "ArgumentVersionMismatch": 25,
    "Deprecated": 26,
    "NotReady": 27,
    "GpuNotFound": 28,
    "InvalidState": 29,
    "ResetTypeNotSupported": 30,
    "Unknown": 999,
}
_STRINGS = {
    3: "Not Supported",
    4: "Insufficient Permissions",
    9: "Driver Not Loaded",
    12: "NVML Shared Library Not Found",
    15: "GPU is lost",
}


class NVMLError(Exception):
    """Like pynvml's: ``NVMLError(code)`` is an instance of the subclass for ``code``."""

    by_code: ClassVar[dict[int, type[NVMLError]]] = {}
    code: ClassVar[int] = 999

    def __new__(cls, value: int | None = None) -> NVMLError:
        klass: type[NVMLError] = cls
        if cls is NVMLError and value in NVMLError.by_code:
            klass = NVMLError.by_code[value]
        return Exception.__new__(klass)

    def __init__(self, value: int | None = None) -> None:
        super().__init__()
        self.value = type(self).code if value is None else value

    def __str__(self) -> str:
        return _STRINGS.get(self.value, f"NVML Error with code {self.value}")


for _name, _code in ERROR_CODES.items():
    NVMLError.by_code[_code] = type(f"NVMLError_{_name}", (NVMLError,), {"code": _code})


def error(name: str) -> NVMLError:
    """An instance of ``NVMLError_<name>``, e.g. ``error("GpuIsLost")``."""
    return NVMLError(ERROR_CODES[name])


# The real module's constants the device queries use (values of nvidia-ml-py 13.615).
CONSTANTS = {
    "NVML_SUCCESS": 0,
    "NVML_CLOCK_SM": 1,
    "NVML_TEMPERATURE_GPU": 0,
    "NVML_PCIE_UTIL_TX_BYTES": 0,
    "NVML_PCIE_UTIL_RX_BYTES": 1,
    "NVML_GPM_METRICS_GET_VERSION": 1,
    "NVML_GPM_METRIC_SM_UTIL": 2,
    "NVML_GPM_METRIC_SM_OCCUPANCY": 3,
}
REASONS = {
    "GpuIdle": 0x1,
    "SwPowerCap": 0x4,
    "HwSlowdown": 0x8,
    "SwThermalSlowdown": 0x20,
    "HwThermalSlowdown": 0x40,
    "HwPowerBrakeSlowdown": 0x80,
}
"""Clock-event reason bits, as ``nvmlClocksEventReason<name>`` (and the older
``nvmlClocksThrottleReason<name>``)."""
GPM_FUNCTIONS = (
    "nvmlGpmQueryDeviceSupport",
    "nvmlGpmSampleAlloc",
    "nvmlGpmSampleGet",
    "nvmlGpmSampleFree",
    "nvmlGpmMetricsGet",
)


class NVMLLibraryMismatchError(Exception):
    """Raised by pynvml's unversioned calls when the driver lacks the function they use."""


@dataclass
class ProcessInfo:
    pid: int
    usedGpuMemory: int | None  # pynvml's field names
    gpuInstanceId: int = 0xFFFFFFFF
    computeInstanceId: int = 0xFFFFFFFF


@dataclass
class MemoryInfo:
    total: int
    free: int
    used: int


@dataclass
class Utilization:  # c_nvmlUtilization_t
    gpu: int
    memory: int


@dataclass
class ProcessUtilizationSample:  # c_nvmlProcessUtilizationSample_t
    pid: int
    timeStamp: int  # CPU time in µs
    smUtil: int
    memUtil: int
    encUtil: int = 0
    decUtil: int = 0


@dataclass
class GpmSupport:  # c_nvmlGpmSupport_t
    version: int
    isSupportedDevice: int


@dataclass
class GpmSample:
    """What ``nvmlGpmSampleAlloc`` hands out: filled by ``nvmlGpmSampleGet``."""

    taken: int | None = None  # the reading of its GPU it holds (1 for the first)
    gpu: int | None = None  # the GPU it was taken on
    freed: bool = False


@dataclass
class GpmMetric:  # c_nvmlGpmMetric_t
    metricId: int = 0
    nvmlReturn: int = 0
    value: float = 0.0


class GpmMetricsGet:
    """Like ``c_nvmlGpmMetricsGet_t``: version, numMetrics, sample1, sample2, metrics[]."""

    def __init__(self) -> None:
        self.version = 0
        self.numMetrics = 0
        self.sample1: GpmSample | None = None
        self.sample2: GpmSample | None = None
        self.metrics = [GpmMetric() for _ in range(8)]


@dataclass
class FakeGpu:
    total: int
    used: int
    compute: list[ProcessInfo] = field(default_factory=list)
    graphics: list[ProcessInfo] = field(default_factory=list)
    utilization: int = 90  # percent
    memory_utilization: int = 40  # percent
    sm_clock: int = 1980  # MHz
    sm_clock_max: int = 1980  # MHz
    reasons: int = 0  # clock-event reason bits
    temperature: int = 65  # °C
    power: int = 250_000  # mW
    power_limit: int = 400_000  # mW
    pcie_tx: int = 20_000  # KB/s
    pcie_rx: int = 500_000  # KB/s
    process_sm: dict[int, int] = field(default_factory=dict)  # percent, by pid
    process_memory: dict[int, int] = field(default_factory=dict)  # percent, by pid
    gpm: bool = True  # GPM supported (Hopper and later)
    sm_active: float = 80.0  # GPM percent
    sm_occupancy: float = 50.0  # GPM percent
    lacks: set[str] = field(default_factory=set)  # its queries that raise NotSupported


@dataclass(frozen=True)
class Handle:
    index: int


_INIT_FAILURES = {
    "lib_not_found": "LibraryNotFound",
    "driver_not_loaded": "DriverNotLoaded",
    "no_permission": "NoPermission",
}


class FakeNvml:
    """One fake NVML: ``module`` is what ``import pynvml`` returns; ``calls`` logs its use.

    ``ok``: two 16 GiB GPUs; the target uses 1 GiB on GPU 0 (listed as both a compute and a
    graphics client, as ``C+G`` in nvidia-smi), another process 2 GiB on GPU 1. GPU 0 is
    busy (90 % utilization, the target's kernels 85 %), at its full SM clock, 65 °C, 250 of
    400 W; GPU 1 runs the other process at 30 %, 1410 of 1980 MHz, capped by power
    (``SwPowerCap``). Both support GPM. The other scenarios start from it:

    - ``gpu_lost``: GPU 1 falls off the bus after its first memory read;
    - ``pid_vanished``: each process query lists the target only the first time;
    - ``throttling``: from the ``change_from``-th reading of GPU 0 on (a reading starts with
      its memory query), NVML reports thermal slowdown there, the SM clock falls 200 MHz a
      reading down to 1200 MHz and the temperature is 90 °C;
    - ``utilization_drop``: from the ``change_from``-th reading on, GPU 0's utilization
      falls to 20 % and the target's to 15 %, while its memory stays the same;
    - ``queries_not_supported``: GPU 1 lacks PCIe throughput and per-process utilization
      (NotSupported) and GPM (``isSupportedDevice`` 0);
    - ``old_bindings``: an nvidia-ml-py from before clock-event reasons and GPM: only the
      throttle-reason names, no ``nvmlGpm*``.
    """

    change_from = 3
    """The reading of GPU 0 from which ``throttling`` and ``utilization_drop`` show."""

    def __init__(self, scenario: Scenario, target_pid: int) -> None:
        self.scenario = scenario
        self.pid = target_pid
        target_memory = None if scenario == "memory_not_available" else GIB
        self.gpus = [
            FakeGpu(
                16 * GIB,
                GIB + GIB // 2,
                compute=[ProcessInfo(target_pid, target_memory)],
                graphics=[ProcessInfo(target_pid, target_memory)],
            ),
            FakeGpu(
                16 * GIB,
                2 * GIB + GIB // 2,
                compute=[ProcessInfo(target_pid + 1, 2 * GIB)],
                utilization=30,
                memory_utilization=10,
                sm_clock=1410,
                reasons=REASONS["SwPowerCap"],
                temperature=50,
                power=120_000,
                pcie_tx=1_000,
                pcie_rx=2_000,
                process_sm={target_pid + 1: 30},
                process_memory={target_pid + 1: 10},
                sm_active=25.0,
                sm_occupancy=12.5,
            ),
        ]
        self.gpus[0].process_sm = {target_pid: 85}
        self.gpus[0].process_memory = {target_pid: 38}
        if scenario == "queries_not_supported":
            self.gpus[1].lacks = {"nvmlDeviceGetPcieThroughput", "nvmlDeviceGetProcessUtilization"}
            self.gpus[1].gpm = False
        self.gpm_allocated = 0  # GPM samples allocated and not freed
        self.driver = "550.54.15"
        self.nvml_version = "12.550.54.15"
        self.calls: list[str] = []
        self.initialised = 0  # NVML's reference count
        self._reads: Counter[tuple[str, int]] = Counter()
        module = types.ModuleType("pynvml")
        module.__dict__.update(
            NVMLError=NVMLError, NVMLLibraryMismatchError=NVMLLibraryMismatchError
        )
        for name, code in ERROR_CODES.items():
            setattr(module, f"NVMLError_{name}", NVMLError.by_code[code])
        module.__dict__.update(CONSTANTS)
        for function in (
            self.nvmlInit,
            self.nvmlShutdown,
            self.nvmlDeviceGetCount,
            self.nvmlDeviceGetHandleByIndex,
            self.nvmlDeviceGetMemoryInfo,
            self.nvmlDeviceGetComputeRunningProcesses,
            self.nvmlDeviceGetGraphicsRunningProcesses,
            self.nvmlSystemGetDriverVersion,
            self.nvmlSystemGetNVMLVersion,
            self.nvmlDeviceGetUtilizationRates,
            self.nvmlDeviceGetClockInfo,
            self.nvmlDeviceGetMaxClockInfo,
            self.nvmlDeviceGetCurrentClocksThrottleReasons,
            self.nvmlDeviceGetCurrentClocksEventReasons,
            self.nvmlDeviceGetTemperature,
            self.nvmlDeviceGetPowerUsage,
            self.nvmlDeviceGetEnforcedPowerLimit,
            self.nvmlDeviceGetPcieThroughput,
            self.nvmlDeviceGetProcessUtilization,
            self.nvmlGpmQueryDeviceSupport,
            self.nvmlGpmSampleAlloc,
            self.nvmlGpmSampleGet,
            self.nvmlGpmSampleFree,
            self.nvmlGpmMetricsGet,
        ):
            setattr(module, function.__name__, function)
        module.__dict__["c_nvmlGpmMetricsGet_t"] = GpmMetricsGet
        for name, bit in REASONS.items():
            setattr(module, f"nvmlClocksThrottleReason{name}", bit)
            setattr(module, f"nvmlClocksEventReason{name}", bit)
        if scenario == "old_bindings":
            del module.__dict__["nvmlDeviceGetCurrentClocksEventReasons"]
            del module.__dict__["c_nvmlGpmMetricsGet_t"]
            for name in [*GPM_FUNCTIONS, *(f"nvmlClocksEventReason{r}" for r in REASONS)]:
                delattr(module, name)
        self.module = module

    def _call(self, name: str) -> None:
        self.calls.append(name)
        if not self.initialised:
            raise error("Uninitialized")

    def nvmlInit(self) -> None:
        self.calls.append("nvmlInit")
        if self.scenario in _INIT_FAILURES:
            raise NVMLError(ERROR_CODES[_INIT_FAILURES[self.scenario]])
        self.initialised += 1

    def nvmlShutdown(self) -> None:
        self._call("nvmlShutdown")
        self.initialised -= 1

    def nvmlDeviceGetCount(self) -> int:
        self._call("nvmlDeviceGetCount")
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> Handle:
        self._call("nvmlDeviceGetHandleByIndex")
        if not 0 <= index < len(self.gpus):
            raise error("InvalidArgument")
        return Handle(index)

    def nvmlDeviceGetMemoryInfo(self, handle: Handle) -> MemoryInfo:
        self._call("nvmlDeviceGetMemoryInfo")
        self._read("memory", handle)
        gpu = self._device("nvmlDeviceGetMemoryInfo", handle)
        return MemoryInfo(gpu.total, gpu.total - gpu.used, gpu.used)

    def nvmlDeviceGetUtilizationRates(self, handle: Handle) -> Utilization:
        gpu = self._device("nvmlDeviceGetUtilizationRates", handle)
        if self._changed("utilization_drop", handle):
            return Utilization(20, gpu.memory_utilization)
        return Utilization(gpu.utilization, gpu.memory_utilization)

    def nvmlDeviceGetClockInfo(self, handle: Handle, type: int) -> int:
        gpu = self._device("nvmlDeviceGetClockInfo", handle)
        self._check(type == CONSTANTS["NVML_CLOCK_SM"], "only the SM clock is faked")
        if self._changed("throttling", handle):
            readings = self._reads["memory", handle.index] - self.change_from + 1
            return max(gpu.sm_clock - 200 * readings, 1200)
        return gpu.sm_clock

    def nvmlDeviceGetMaxClockInfo(self, handle: Handle, type: int) -> int:
        gpu = self._device("nvmlDeviceGetMaxClockInfo", handle)
        self._check(type == CONSTANTS["NVML_CLOCK_SM"], "only the SM clock is faked")
        return gpu.sm_clock_max

    def nvmlDeviceGetCurrentClocksEventReasons(self, handle: Handle) -> int:
        gpu = self._device("nvmlDeviceGetCurrentClocksEventReasons", handle)
        if self._changed("throttling", handle):
            return gpu.reasons | REASONS["SwThermalSlowdown"]
        return gpu.reasons

    def nvmlDeviceGetCurrentClocksThrottleReasons(self, handle: Handle) -> int:
        self.calls.append("nvmlDeviceGetCurrentClocksThrottleReasons")
        return self.nvmlDeviceGetCurrentClocksEventReasons(handle)

    def nvmlDeviceGetTemperature(self, handle: Handle, sensor: int) -> int:
        gpu = self._device("nvmlDeviceGetTemperature", handle)
        self._check(sensor == CONSTANTS["NVML_TEMPERATURE_GPU"], "only the GPU sensor is faked")
        return 90 if self._changed("throttling", handle) else gpu.temperature

    def nvmlDeviceGetPowerUsage(self, handle: Handle) -> int:
        return self._device("nvmlDeviceGetPowerUsage", handle).power

    def nvmlDeviceGetEnforcedPowerLimit(self, handle: Handle) -> int:
        return self._device("nvmlDeviceGetEnforcedPowerLimit", handle).power_limit

    def nvmlDeviceGetPcieThroughput(self, device: Handle, counter: int) -> int:
        gpu = self._device("nvmlDeviceGetPcieThroughput", device)
        tx, rx = CONSTANTS["NVML_PCIE_UTIL_TX_BYTES"], CONSTANTS["NVML_PCIE_UTIL_RX_BYTES"]
        self._check(counter in (tx, rx), "no such PCIe counter")
        return gpu.pcie_tx if counter == tx else gpu.pcie_rx

    def nvmlDeviceGetProcessUtilization(
        self, handle: Handle, timeStamp: int
    ) -> list[ProcessUtilizationSample]:
        """One sample per process and reading of the GPU, a second apart; those newer than
        ``timeStamp``, or ``NotFound`` when none is (as NVML)."""
        gpu = self._device("nvmlDeviceGetProcessUtilization", handle)
        readings = self._reads["memory", handle.index]
        drop = self._changed("utilization_drop", handle)
        samples = [
            ProcessUtilizationSample(
                pid, 1_700_000_000_000_000 + readings * 1_000_000, 15 if drop else sm, memory
            )
            for pid, sm in gpu.process_sm.items()
            for memory in [gpu.process_memory.get(pid, 0)]
        ]
        newer = [s for s in samples if s.timeStamp > timeStamp]
        if not newer:
            raise error("NotFound")
        return newer

    def nvmlGpmQueryDeviceSupport(self, device: Handle) -> GpmSupport:
        gpu = self._device("nvmlGpmQueryDeviceSupport", device)
        return GpmSupport(1, int(gpu.gpm))

    def nvmlGpmSampleAlloc(self) -> GpmSample:
        self._call("nvmlGpmSampleAlloc")
        self.gpm_allocated += 1
        return GpmSample()

    def nvmlGpmSampleFree(self, gpmSample: GpmSample) -> None:
        self._call("nvmlGpmSampleFree")
        self._check(not gpmSample.freed, "GPM sample freed twice")
        gpmSample.freed = True
        self.gpm_allocated -= 1

    def nvmlGpmSampleGet(self, device: Handle, gpmSample: GpmSample) -> GpmSample:
        gpu = self._device("nvmlGpmSampleGet", device)
        self._check(not gpmSample.freed, "GPM sample used after it was freed")
        if not gpu.gpm:
            raise error("NotSupported")
        gpmSample.taken, gpmSample.gpu = self._reads["memory", device.index], device.index
        return gpmSample

    def nvmlGpmMetricsGet(self, metricsGet: GpmMetricsGet) -> GpmMetricsGet:
        self._call("nvmlGpmMetricsGet")
        first, second = metricsGet.sample1, metricsGet.sample2
        self._check(metricsGet.version == CONSTANTS["NVML_GPM_METRICS_GET_VERSION"], "version")
        self._check(
            first is not None and second is not None and first.taken is not None,
            "GPM metrics need two samples taken",
        )
        assert first is not None
        assert second is not None
        assert first.taken is not None
        self._check(second.taken is not None and first.taken < second.taken, "samples' order")
        self._check(first.gpu == second.gpu and first.gpu is not None, "samples of one GPU")
        gpu = self.gpus[int(first.gpu or 0)]
        values = {
            CONSTANTS["NVML_GPM_METRIC_SM_UTIL"]: gpu.sm_active,
            CONSTANTS["NVML_GPM_METRIC_SM_OCCUPANCY"]: gpu.sm_occupancy,
        }
        for metric in metricsGet.metrics[: metricsGet.numMetrics]:
            if metric.metricId in values:
                metric.nvmlReturn, metric.value = 0, values[metric.metricId]
            else:
                metric.nvmlReturn = ERROR_CODES["NotSupported"]
        return metricsGet

    def nvmlDeviceGetComputeRunningProcesses(self, handle: Handle) -> list[ProcessInfo]:
        self._call("nvmlDeviceGetComputeRunningProcesses")
        return self._processes("compute", handle, self.gpus[handle.index].compute)

    def nvmlDeviceGetGraphicsRunningProcesses(self, handle: Handle) -> list[ProcessInfo]:
        self._call("nvmlDeviceGetGraphicsRunningProcesses")
        return self._processes("graphics", handle, self.gpus[handle.index].graphics)

    def nvmlSystemGetDriverVersion(self) -> str:
        self._call("nvmlSystemGetDriverVersion")
        return self.driver

    def nvmlSystemGetNVMLVersion(self) -> str:
        self._call("nvmlSystemGetNVMLVersion")
        return self.nvml_version

    def _device(self, function: str, handle: Handle) -> FakeGpu:
        """The GPU a device query reads, after the checks every query makes."""
        self._call(function)
        if not 0 <= handle.index < len(self.gpus):
            raise error("InvalidArgument")
        if self.scenario == "gpu_lost" and handle.index == 1 and self._reads["memory", 1] > 1:
            raise error("GpuIsLost")
        gpu = self.gpus[handle.index]
        if function in gpu.lacks:
            raise error("NotSupported")
        return gpu

    def _changed(self, scenario: str, handle: Handle) -> bool:
        """Whether ``scenario``'s change shows on this GPU now (GPU 0, from ``change_from``)."""
        return (
            self.scenario == scenario
            and handle.index == 0
            and self._reads["memory", 0] >= self.change_from
        )

    @staticmethod
    def _check(condition: bool, what: str) -> None:
        """A call the real library would refuse fails the test, loudly."""
        if not condition:
            raise AssertionError(f"the fake NVML was called wrongly: {what}")

    def _read(self, what: str, handle: Handle) -> int:
        """How many times ``what`` has been read on this GPU, this read included."""
        self._reads[what, handle.index] += 1
        return self._reads[what, handle.index]

    def _processes(self, kind: str, handle: Handle, listed: list[ProcessInfo]) -> list[ProcessInfo]:
        if self.scenario == "process_query_not_supported":
            raise error("NotSupported")
        if self.scenario == "driver_too_old":
            raise NVMLLibraryMismatchError("Unversioned function called and the pyNVML version ...")
        if self._read(kind, handle) > 1 and self.scenario == "pid_vanished":
            listed = [p for p in listed if p.pid != self.pid]
        return list(listed)


def install(monkeypatch: pytest.MonkeyPatch, scenario: Scenario, target_pid: int) -> FakeNvml:
    """Make ``import pynvml`` return a fresh fake playing ``scenario``."""
    fake = FakeNvml(scenario, target_pid)
    monkeypatch.setitem(sys.modules, "pynvml", fake.module)
    return fake


def uninstall(monkeypatch: pytest.MonkeyPatch) -> None:
    """Make ``import pynvml`` raise ``ImportError``, as when nvidia-ml-py is not installed."""
    monkeypatch.setitem(sys.modules, "pynvml", None)
