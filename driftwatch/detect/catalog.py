"""The detectors driftwatch runs, in one place for the monitor, ``analyze`` and the bench."""

from __future__ import annotations

from driftwatch.detect import Detector, Engine
from driftwatch.detect.basic import NonFiniteDetector, StallDetector
from driftwatch.detect.growth import growth_detectors
from driftwatch.detect.memory import memory_detectors
from driftwatch.detect.steps import PeriodicStallDetector, SlowCallbackDetector, SlowdownDetector


def default_detectors() -> list[Detector]:
    return [
        SlowdownDetector(),
        PeriodicStallDetector(),
        SlowCallbackDetector(),
        *memory_detectors(),
        *growth_detectors(),
        NonFiniteDetector(),
        StallDetector(),
    ]


def default_engine() -> Engine:
    return Engine(default_detectors())
