"""Detectors: pure state machines fed samples in time order, asked what holds at ``now``.

They never do I/O and never read a clock of their own, so the same engine runs live (the
monitor feeds each tick's samples), offline (``driftwatch analyze`` replays a recording) and
in the detection benchmark at an accelerated clock. Each keeps bounded state (aggregates,
not raw samples) and costs O(1) amortised per sample.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

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


@runtime_checkable
class Concluding(Protocol):
    """A detector with a verdict on a run that has ended, beyond what holds live."""

    def conclude(self, now: float) -> Evaluation:
        """What holds of the whole run, ended at ``now``: growth no live window could judge
        yet (too few windows in a short run) is judged here, over all the run's data."""
        ...


class Annotator(Protocol):
    """Adds to the findings of an evaluation what other signals say (their likely causes);
    it never adds a finding."""

    series: frozenset[str]
    """The series whose samples it wants."""

    def observe(self, sample: Sample) -> None: ...

    def annotate(
        self, findings: list[Finding], now: float, *, final: bool = False
    ) -> list[Finding]:
        """``findings`` with evidence added; ``final``: the run has ended, use all of it."""


class Engine:
    """Routes samples to the detectors that want them and gathers their evaluations,
    annotated by ``annotator`` (the ranked causes of slowdowns and stalls) if given."""

    def __init__(self, detectors: Sequence[Detector], annotator: Annotator | None = None) -> None:
        self._detectors = list(detectors)
        self._annotator = annotator
        routes: dict[str, list[Callable[[Sample], None]]] = {}
        parts: list[Detector | Annotator] = [*self._detectors]
        if annotator is not None:
            parts.append(annotator)
        for part in parts:
            for series in part.series:
                routes.setdefault(series, []).append(part.observe)
        # Bound methods, looked up once: observe runs for every sample of a long recording.
        self._routes = {series: tuple(observers) for series, observers in routes.items()}
        self.scores: dict[str, float] = {d.name: 0.0 for d in self._detectors}

    def observe(self, sample: Sample) -> None:
        for observe in self._routes.get(sample.series, ()):
            observe(sample)

    def observe_all(self, samples: Sequence[Sample]) -> None:
        """``observe`` each of ``samples``, in order."""
        routes = self._routes
        for sample in samples:
            for observe in routes.get(sample.series, ()):
                observe(sample)

    def evaluate(self, now: float, *, final: bool = False) -> list[Finding]:
        """What holds at ``now``; ``final``: the run has ended, judge all of it."""
        findings: list[Finding] = []
        for detector in self._detectors:
            if final and isinstance(detector, Concluding):
                evaluation = detector.conclude(now)
            else:
                evaluation = detector.evaluate(now)
            self.scores[detector.name] = evaluation.score
            findings.extend(evaluation.findings)
        if self._annotator is not None and findings:
            return self._annotator.annotate(findings, now, final=final)
        return findings
