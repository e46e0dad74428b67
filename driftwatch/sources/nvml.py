"""NVML source: GPU memory of the target and of each GPU, via nvidia-ml-py (``pynvml``), and
the device queries of ``nvml_queries`` (utilization, clocks and their throttle reasons,
temperature, power, PCIe, the target's utilization, GPM's SM activity).

NVML reports host PIDs. Inside a container that does not share the host's PID namespace
(Kubernetes: no ``hostPID: true``), the target's PID as driftwatch sees it will not match,
and its per-process GPU memory and utilization read as 0 while the device figures stay right.
"""

from __future__ import annotations

import contextlib
import logging
from typing import Any

from driftwatch.errors import SourceUnavailable
from driftwatch.series import Sample
from driftwatch.sources.nvml_queries import Gpu, Queries

log = logging.getLogger(__name__)

_OFF = "GPU memory is not monitored, nor GPU utilization, clocks, power or PCIe"
_NOT_INSTALLED = f"nvidia-ml-py is not installed (pip install nvidia-ml-py): {_OFF}"
_DRIVER_TOO_OLD = (
    "the NVIDIA driver is older than this nvidia-ml-py supports "
    f"(install the nvidia-ml-py release matching the driver): {_OFF}"
)


def _reason(nvml: Any, err: Any, gpu: str = "a GPU") -> str:
    """One sentence saying what an ``NVMLError`` means for the user."""
    if isinstance(err, nvml.NVMLError_LibraryNotFound):
        what = "NVML library not found (no NVIDIA driver on this machine)"
    elif isinstance(err, nvml.NVMLError_DriverNotLoaded):
        what = "NVIDIA driver not loaded (no GPU, or its kernel module is not running)"
    elif isinstance(err, nvml.NVMLError_NoPermission):
        what = (
            "no permission to use NVML (run as a user who may open /dev/nvidia*; "
            "in a container, use the NVIDIA container runtime)"
        )
    elif isinstance(err, nvml.NVMLError_GpuIsLost):
        what = f"{gpu} has fallen off the bus (NVML: GPU is lost; it needs a reset or a reboot)"
    elif isinstance(err, nvml.NVMLError_LibRmVersionMismatch):
        what = (
            "the NVML library and the NVIDIA kernel driver differ in version "
            "(driver upgraded without a reboot)"
        )
    else:
        what = f"NVML failed on {gpu} ({err}, code {err.value})"
    return f"{what}: {_OFF}"


def _shutdown(nvml: Any) -> None:
    with contextlib.suppress(nvml.NVMLError):
        nvml.nvmlShutdown()


class NvmlSource:
    """Memory of each GPU and the part of it the target (by host PID) uses, and the readings
    of the device queries (``nvml_queries``).

    NVML is loaded and initialised on the first ``sample()`` and shut down by ``close()``.
    Every NVML failure raises ``SourceUnavailable``, except a GPU that cannot report
    per-process memory (some vGPU/MIG setups): it still reports device memory; and a query
    a GPU lacks: that query is off on that GPU, the others go on.
    """

    name = "nvml"

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self._nvml: Any = None  # the pynvml module while NVML is initialised
        self._gpus: list[Gpu] | None = None
        self._queries: Queries | None = None
        self._no_process_query: set[int] = set()  # GPUs already logged as unsupported

    def _open(self) -> list[Gpu]:
        try:
            import pynvml
        except ImportError as err:
            raise SourceUnavailable(_NOT_INSTALLED) from err
        try:
            pynvml.nvmlInit()
        except pynvml.NVMLError as err:
            raise SourceUnavailable(_reason(pynvml, err)) from err
        self._nvml = pynvml
        try:
            count = int(pynvml.nvmlDeviceGetCount())
            handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(count)]
        except pynvml.NVMLError as err:
            raise SourceUnavailable(_reason(pynvml, err)) from err
        if not handles:
            raise SourceUnavailable(f"no NVIDIA GPU found: {_OFF}")
        self._queries = Queries(pynvml, self.pid)
        return [Gpu(index, handle) for index, handle in enumerate(handles)]

    def sample(self, now: float) -> list[Sample]:
        if self._gpus is None:
            self._gpus = self._open()
        nvml, queries = self._nvml, self._queries
        assert queries is not None
        samples: list[Sample] = []
        for gpu in self._gpus:
            index, handle, labels = gpu.index, gpu.handle, gpu.labels
            try:
                memory = nvml.nvmlDeviceGetMemoryInfo(handle)
                used = self._process_memory(nvml, index, handle)
                samples += queries.read(gpu, now)
            except nvml.NVMLError as err:
                raise SourceUnavailable(_reason(nvml, err, f"GPU {index}")) from err
            except nvml.NVMLLibraryMismatchError as err:
                raise SourceUnavailable(_DRIVER_TOO_OLD) from err
            samples.append(Sample("gpu_memory_used_bytes", float(memory.used), now, labels))
            samples.append(Sample("gpu_memory_total_bytes", float(memory.total), now, labels))
            if used is not None:
                samples.append(Sample("gpu_process_memory_bytes", float(used), now, labels))
        return samples

    def _process_memory(self, nvml: Any, index: int, handle: Any) -> int | None:
        """The target's memory on one GPU; ``None`` when NVML cannot tell."""
        supported = False
        mine: list[int | None] = []
        for query in (
            nvml.nvmlDeviceGetComputeRunningProcesses,
            nvml.nvmlDeviceGetGraphicsRunningProcesses,
        ):
            try:
                processes = query(handle)
            except nvml.NVMLError_NotSupported:
                continue
            supported = True
            mine += [p.usedGpuMemory for p in processes if p.pid == self.pid]
        if not supported:
            if index not in self._no_process_query:
                self._no_process_query.add(index)
                log.warning(
                    "GPU %d cannot report per-process memory (not supported, e.g. vGPU or MIG): "
                    "only its device memory is monitored",
                    index,
                )
            return None
        # A process that is both a compute and a graphics client is listed twice with the
        # same figure; None means NVML does not know it (e.g. WDDM), which is not 0.
        known = [int(used) for used in mine if used is not None]
        if mine and not known:
            return None
        return max(known, default=0)

    def close(self) -> None:
        nvml, self._nvml = self._nvml, None
        gpus, self._gpus, queries, self._queries = self._gpus, None, self._queries, None
        if queries is not None and gpus is not None:
            queries.close(gpus)
        if nvml is not None:
            _shutdown(nvml)


def describe() -> tuple[bool, str]:
    """For ``driftwatch doctor``: whether GPU memory can be monitored here, and why (not)."""
    try:
        import pynvml
    except ImportError:
        return False, _NOT_INSTALLED
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as err:
        return False, _reason(pynvml, err)
    try:
        count = int(pynvml.nvmlDeviceGetCount())
        driver = str(pynvml.nvmlSystemGetDriverVersion())
        version = str(pynvml.nvmlSystemGetNVMLVersion())
    except pynvml.NVMLError as err:
        return False, _reason(pynvml, err)
    finally:
        _shutdown(pynvml)
    if count == 0:
        return False, f"no NVIDIA GPU found (driver {driver}, NVML {version}): {_OFF}"
    gpus = "1 GPU" if count == 1 else f"{count} GPUs"
    return True, f"{gpus}, driver {driver}, NVML {version}"
