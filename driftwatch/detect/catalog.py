"""The detectors driftwatch runs, in one place for the monitor, ``analyze`` and the bench."""

from __future__ import annotations

from driftwatch.detect import Detector, Engine
from driftwatch.detect.basic import NonFiniteDetector, StallDetector
from driftwatch.detect.causes.ranker import CauseRanker
from driftwatch.detect.gpu_utilization import LowGpuUtilizationDetector
from driftwatch.detect.growth import growth_detectors
from driftwatch.detect.input_bound import InputBoundDetector
from driftwatch.detect.memory.drift import AllocatorMemoryDetector, MemoryDriftDetector
from driftwatch.detect.memory.host import HostMemoryDetector
from driftwatch.detect.memory.workers import WorkerMemoryDetector
from driftwatch.detect.periodic_stalls import PeriodicStallDetector
from driftwatch.detect.slow_callbacks import SlowCallbackDetector
from driftwatch.detect.slowdown.live import SlowdownDetector


def memory_detectors() -> list[Detector]:
    """Host RSS, worker processes', TensorFlow allocator and GPU process memory drift
    detectors."""
    return [
        HostMemoryDetector(),
        WorkerMemoryDetector(),
        AllocatorMemoryDetector(),
        MemoryDriftDetector(
            "gpu_process_memory_bytes",
            "gpu_memory_drift",
            "GPU memory of the process",
            "gpu_memory_total_bytes",
        ),
    ]


def default_detectors() -> list[Detector]:
    return [
        SlowdownDetector(),
        PeriodicStallDetector(),
        SlowCallbackDetector(),
        *memory_detectors(),
        *growth_detectors(),
        NonFiniteDetector(),
        StallDetector(),
        InputBoundDetector(),
        LowGpuUtilizationDetector(),
    ]


def default_engine() -> Engine:
    """The default detectors, their slowdowns and stalls given ranked causes."""
    return Engine(default_detectors(), CauseRanker())
