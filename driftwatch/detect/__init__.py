"""Detectors read the store and state findings; they never do I/O and take time as an input."""

from __future__ import annotations

from typing import Protocol

from driftwatch.findings import Finding
from driftwatch.store import Store


class Detector(Protocol):
    def update(self, store: Store, now: float) -> list[Finding]:
        """The findings that hold at ``now``, given everything in ``store``."""
        ...
