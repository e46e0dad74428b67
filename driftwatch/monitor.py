"""One watched run: sources feed the store, detectors read it, exporters read the snapshot.

The sampler thread is the only writer. After each tick it publishes an immutable
``Snapshot``; exporters and views read the latest one with a single attribute load, so
scrapes never block sampling and need no locks.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from driftwatch.detect import Engine
from driftwatch.errors import SourceUnavailable, TargetGone, UsageError
from driftwatch.findings import Diagnosis, Finding, worst_per_kind
from driftwatch.history import RunRecorder
from driftwatch.series import SERIES, Export, LabelSetLimit, SeriesKey
from driftwatch.sources import Source
from driftwatch.store import Store
from driftwatch.target import TargetInfo

log = logging.getLogger(__name__)

RECENT_WINDOW = 50
"""Samples behind a ``RECENT_MEDIAN`` export: long enough to ignore one slow step."""
STOPPED = "monitoring stopped"
"""Why monitoring ended when driftwatch was told to stop, not the target."""

MIN_INTERVAL, MAX_INTERVAL = 0.05, 3600.0


def check_interval(interval: float, what: str = "--interval") -> float:
    """``interval`` if it is a usable sampling interval in seconds, else ``UsageError``."""
    if not math.isfinite(interval) or not MIN_INTERVAL <= interval <= MAX_INTERVAL:
        raise UsageError(
            f"{what} {interval}: must be between {MIN_INTERVAL} and {MAX_INTERVAL:.0f} seconds"
        )
    return interval


@dataclass(frozen=True, slots=True)
class SourceStatus:
    name: str
    up: bool
    reason: str = ""  # why it is down


@dataclass(frozen=True, slots=True)
class Snapshot:
    """What the run looked like after one tick: everything an exporter or view may read."""

    run: str
    target: TargetInfo
    t: float
    ticks: int
    values: dict[SeriesKey, float] = field(default_factory=dict)
    sources: tuple[SourceStatus, ...] = ()
    findings: tuple[Finding, ...] = ()
    scores: dict[str, float] = field(default_factory=dict)


class Monitor:
    """Samples one target; ``tick()`` raises ``TargetGone`` once it is gone."""

    def __init__(
        self,
        run: str,
        target: TargetInfo,
        sources: Sequence[Source],
        engine: Engine | None = None,
        store: Store | None = None,
        clock: Callable[[], float] = time.time,
        on_finding: Callable[[Finding], None] = lambda finding: None,
        recorder: RunRecorder | None = None,
    ) -> None:
        self.run = run
        self.target = target
        self.store = store if store is not None else Store()
        self._sources = list(sources)
        self._label_sets = LabelSetLimit()
        self._down: dict[str, str] = {}
        self._engine = engine if engine is not None else Engine([])
        self._clock = clock
        self._on_finding = on_finding
        self._recorder = recorder
        self.reported: dict[str, Finding] = {}
        """Each kind's latest (worst) finding in this run, in the order the kinds were first
        reported; kept after it stops holding."""
        self._announced: dict[str, set[Diagnosis]] = {}
        self._ticks = 0
        self.snapshot = Snapshot(run, target, clock(), 0)

    def tick(self) -> Snapshot:
        now = self._clock()
        for source in self._sources:
            if source.name in self._down:
                continue
            try:
                samples = source.sample(now)
            except TargetGone:
                raise
            except SourceUnavailable as err:
                self._disable(source, str(err))
            except Exception as err:  # a bug in one source must not end monitoring
                log.exception("source %s failed", source.name)
                self._disable(source, f"internal error: {err!r}")
            else:
                samples = self._label_sets.admit(samples)
                self.store.extend(samples)
                for sample in samples:
                    self._engine.observe(sample)
        findings = self._engine.evaluate(now)
        for kind, finding in worst_per_kind(findings).items():
            self.reported[kind] = finding
            # Announced when first seen, and again when its severity or diagnosis becomes one
            # not told before (critical now; a leak's class known once TF memory has been
            # probed long enough): a finding on the edge of two severities is told once each.
            announced = self._announced.setdefault(kind, set())
            if finding.diagnosis not in announced:
                announced.add(finding.diagnosis)
                self._on_finding(finding)
        self._ticks += 1
        self.snapshot = Snapshot(
            self.run,
            self.target,
            now,
            self._ticks,
            self._exported_values(),
            tuple(
                SourceStatus(s.name, s.name not in self._down, self._down.get(s.name, ""))
                for s in self._sources
            ),
            tuple(findings),
            dict(self._engine.scores),
        )
        if self._recorder is not None:
            self._recorder.record(self.snapshot, self.store)
        return self.snapshot

    def _disable(self, source: Source, reason: str) -> None:
        self._down[source.name] = reason
        log.warning("%s source disabled: %s", source.name, reason)
        source.close()

    def _exported_values(self) -> dict[SeriesKey, float]:
        values: dict[SeriesKey, float] = {}
        for key, history in self.store:
            spec = SERIES.get(key[0])
            if spec is None:
                continue
            if spec.export is Export.RECENT_MEDIAN:
                value = history.recent_median(RECENT_WINDOW)
            else:
                latest = history.latest()
                value = latest[1] if latest else math.nan
            if math.isfinite(value):
                values[key] = value
        return values

    def close(self, ended: str = STOPPED) -> None:
        """Release the sources and hand the history the rest, with why monitoring ended."""
        for source in self._sources:
            if source.name not in self._down:
                source.close()
        if self._recorder is not None:
            self._recorder.finish(self.snapshot, self.store, ended)


def watch(
    monitor: Monitor,
    interval: float,
    stop: threading.Event,
    on_tick: Callable[[Snapshot], None] = lambda snapshot: None,
) -> str | None:
    """Tick every ``interval`` seconds until the target is gone or ``stop`` is set.

    Returns why monitoring ended when the target went away, ``None`` when stopped.
    """
    pacer = Pacer()
    ended = STOPPED
    try:
        while not stop.is_set():
            try:
                on_tick(monitor.tick())
            except TargetGone as gone:
                ended = str(gone)
                return ended
            stop.wait(pacer.delay(interval))
        return None
    finally:
        monitor.close(ended)


class Pacer:
    """Tick deadlines ``interval`` apart on the monotonic clock, so a slow tick does not shift
    later ones; after falling behind (suspended laptop, overloaded host) it starts afresh."""

    def __init__(self) -> None:
        self._deadline = time.monotonic()

    def delay(self, interval: float) -> float:
        """Seconds to wait until the next tick."""
        self._deadline += interval
        delay = self._deadline - time.monotonic()
        if delay < 0:
            self._deadline = time.monotonic()
            return 0.0
        return delay
