"""Detectors: pure state machines fed samples in time order, asked what holds at ``now``.

They never do I/O and never read a clock of their own, so the same engine runs live (the
monitor feeds each tick's samples), offline (``driftwatch analyze`` replays a recording) and
in the detection benchmark at an accelerated clock. Each keeps bounded state (aggregates,
not raw samples) and costs O(1) amortised per sample.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

from driftwatch.findings import Finding
from driftwatch.series import Sample


@dataclass(frozen=True, slots=True)
class Evaluation:
    """A detector's continuous score (1.0 is its threshold) and the findings that hold."""

    score: float
    findings: tuple[Finding, ...] = ()


class Detector(Protocol):
    name: str
    """Label of the detector's score gauge."""
    series: frozenset[str]
    """The series whose samples it wants."""

    def observe(self, sample: Sample) -> None: ...

    def evaluate(self, now: float) -> Evaluation: ...


class Engine:
    """Routes samples to the detectors that want them and gathers their evaluations."""

    def __init__(self, detectors: Sequence[Detector]) -> None:
        self._detectors = list(detectors)
        routes: dict[str, list[Callable[[Sample], None]]] = {}
        for detector in self._detectors:
            for series in detector.series:
                routes.setdefault(series, []).append(detector.observe)
        # Bound methods, looked up once: observe runs for every sample of a long recording.
        self._routes = {series: tuple(observers) for series, observers in routes.items()}
        self.scores: dict[str, float] = {d.name: 0.0 for d in self._detectors}

    def observe(self, sample: Sample) -> None:
        for observe in self._routes.get(sample.series, ()):
            observe(sample)

    def evaluate(self, now: float) -> list[Finding]:
        findings: list[Finding] = []
        for detector in self._detectors:
            evaluation = detector.evaluate(now)
            self.scores[detector.name] = evaluation.score
            findings.extend(evaluation.findings)
        return findings
