"""A fake ``pynvml`` (nvidia-ml-py) with named scenarios, for tests on machines without GPUs.

It mirrors what the NVML source relies on: ``NVMLError(code)`` builds the subclass for that
code (``NVMLError_GpuIsLost``, ...; the names and codes of the real module), every error has
``.value``, ``NVMLLibraryMismatchError`` is not an ``NVMLError``, and device calls made
before ``nvmlInit`` or after ``nvmlShutdown`` raise ``NVMLError_Uninitialized``.
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
class FakeGpu:
    total: int
    used: int
    compute: list[ProcessInfo] = field(default_factory=list)
    graphics: list[ProcessInfo] = field(default_factory=list)


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
    graphics client, as ``C+G`` in nvidia-smi), another process 2 GiB on GPU 1. The other
    scenarios start from it: ``gpu_lost``: GPU 1 falls off the bus after its first memory
    read; ``pid_vanished``: each process query lists the target only the first time.
    """

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
            FakeGpu(16 * GIB, 2 * GIB + GIB // 2, compute=[ProcessInfo(target_pid + 1, 2 * GIB)]),
        ]
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
        ):
            setattr(module, function.__name__, function)
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
        if self._read("memory", handle) > 1 and self.scenario == "gpu_lost" and handle.index == 1:
            raise error("GpuIsLost")
        gpu = self.gpus[handle.index]
        return MemoryInfo(gpu.total, gpu.total - gpu.used, gpu.used)

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
