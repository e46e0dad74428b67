"""The detectors driftwatch runs, in one place for the monitor, ``analyze`` and the bench."""

from __future__ import annotations

from collections.abc import Callable

from driftwatch.detect import Detector, Engine
from driftwatch.detect.basic import NonFiniteDetector, StallDetector
from driftwatch.detect.causes.ranker import CauseRanker
from driftwatch.detect.gpu_utilization import LowGpuUtilizationDetector
from driftwatch.detect.growth import growth_detectors
from driftwatch.detect.input_bound import InputBoundDetector
from driftwatch.detect.memory.drift import AllocatorMemoryDetector, ResourceDriftDetector
from driftwatch.detect.memory.host import HostMemoryDetector
from driftwatch.detect.memory.resources import RESOURCES
from driftwatch.detect.memory.workers import WorkerMemoryDetector
from driftwatch.detect.periodic_stalls import PeriodicStallDetector
from driftwatch.detect.ranks import StragglerDetector
from driftwatch.detect.slow_callbacks import SlowCallbackDetector
from driftwatch.detect.slowdown.live import SlowdownDetector

RESOURCE_DETECTORS: dict[str, Callable[[], Detector]] = {
    "host_memory": HostMemoryDetector,
    "tf_memory": AllocatorMemoryDetector,
    "worker_memory": WorkerMemoryDetector,
}
"""Rows of ``RESOURCES`` judged by a detector that tells more (a leak's class, a device's
limit); every other row by ``ResourceDriftDetector`` itself."""


def resource_detectors() -> list[Detector]:
    """One drift detector per resource a job can run out of: memory (host RSS, the worker
    processes', TensorFlow allocator, GPU process memory), open descriptors, threads."""
    detectors: list[Detector] = []
    for name, resource in RESOURCES.items():
        special = RESOURCE_DETECTORS.get(name)
        detectors.append(special() if special is not None else ResourceDriftDetector(resource))
    return detectors


def default_detectors() -> list[Detector]:
    return [
        SlowdownDetector(),
        PeriodicStallDetector(),
        SlowCallbackDetector(),
        *resource_detectors(),
        *growth_detectors(),
        NonFiniteDetector(),
        StallDetector(),
        InputBoundDetector(),
        StragglerDetector(),
        LowGpuUtilizationDetector(),
    ]


def default_engine() -> Engine:
    """The default detectors, their slowdowns and stalls given ranked causes."""
    return Engine(default_detectors(), CauseRanker())
