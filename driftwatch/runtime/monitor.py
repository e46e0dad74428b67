"""One watched run: sources feed the store, detectors read it, sinks receive the snapshots.

The sampler thread is the only writer. After each tick it publishes an immutable
``Snapshot`` (``driftwatch.runtime.snapshot``): exporters read the latest one with a single
attribute load, so scrapes never block sampling and need no locks, and each ``Sink`` (the
history's recorder, the live view) receives it on the sampler thread. When the target
exits, the tick that finds it gone reads every other source to its end and judges the whole
run before it says so: what a job did in its last second is in the findings, the history
and the last snapshot. Sampling adapts (``Cadence``): fast while a target is young or a
signal moves fast.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Protocol, runtime_checkable

from driftwatch.detect import Engine
from driftwatch.detect.goodput import GoodputAccount
from driftwatch.errors import SourceUnavailable, TargetGone, UsageError
from driftwatch.findings import Diagnosis, Finding, worst_per_kind
from driftwatch.runtime.snapshot import Sink, Snapshot, SourceStatus
from driftwatch.runtime.store import SeriesHistory, Store
from driftwatch.series import SERIES, Export, LabelSetLimit, Sample, SeriesKey
from driftwatch.sources import Draining, Source
from driftwatch.target.process import TargetInfo

log = logging.getLogger(__name__)

RECENT_WINDOW = 50
"""Samples behind a ``RECENT_MEDIAN`` export: long enough to ignore one slow step."""
STOPPED = "monitoring stopped"
"""Why monitoring ended when driftwatch was told to stop, not the target."""

MIN_INTERVAL, MAX_INTERVAL = 0.05, 3600.0
"""The shortest and longest sampling interval one may configure, in seconds."""
FAST_INTERVAL = 0.5
"""Seconds between samples while a target is young or one of its signals moves fast."""
YOUNG_SECONDS = 300.0
"""A target is young for this many seconds after its process started."""
EVALUATION_SLACK = FAST_INTERVAL / 2
"""Seconds by which an evaluation may come before ``evaluate_every`` has passed (ticks an
interval apart are not exactly that apart on the sample clock)."""
SETTLED_EVALUATE_SECONDS = 10.0
"""Seconds between a settled target's evaluations, at least (``Cadence.evaluate_every``)."""
FAST_HOLD_SECONDS = 60.0
"""Sampling stays fast this many seconds after a signal last moved fast."""
FAST_EVENT_FILE_RATE = (1 << 30) / 3600
"""Event-file bytes per second that count as moving fast (1 GiB/h)."""
FAST_RESOURCE_LIMITS = {
    "rss_bytes": "memory_limit_bytes",
    "gpu_process_memory_bytes": "gpu_memory_total_bytes",
    "open_fds": "fd_limit",
    "threads": "threads_limit",
}
"""Series of resources the process may run out of (memory, descriptors, threads) watched for
fast moves, and the series of their limit."""
FAST_MIN_RISES = {"open_fds": 4.0, "threads": 4.0}
"""Counts' rises between two readings under which they are churn, never fast: a file
opened or a worker started alone would otherwise keep sampling fast under a low limit."""
FAST_FILE_SERIES = "event_file_bytes"
"""The event-file series watched for fast growth (all of a run's files, in bytes)."""
FAST_MEMORY_HORIZON = 3600.0
"""Seconds within which memory, descriptors or threads, at their latest rate, would reach
their limit: moving fast."""


class EvidenceAnnotator(Protocol):
    """Adds evidence to a tick's findings before they are announced (the captures';
    ``driftwatch.capture``)."""

    def annotate(self, now: float, findings: list[Finding], store: Store) -> list[Finding]:
        """The tick's ``findings``, with what it adds to their evidence."""
        ...

    def settle(self) -> None:
        """Wait for the evidence under way: monitoring ends."""
        ...


@runtime_checkable
class Posting(Protocol):
    """A source that also posts what its run measured, for other monitors to read (the
    other ranks of a distributed job: ``driftwatch.runtime.ranks``)."""

    name: str

    def post(self, snapshot: Snapshot) -> None:
        """After each tick: post from ``snapshot``; never raises."""


def check_interval(interval: float, what: str = "--interval") -> float:
    """``interval`` if it is a usable sampling interval in seconds, else ``UsageError``."""
    if not math.isfinite(interval) or not MIN_INTERVAL <= interval <= MAX_INTERVAL:
        raise UsageError(
            f"{what} {interval}: must be between {MIN_INTERVAL} and {MAX_INTERVAL:.0f} seconds"
        )
    return interval


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
        recorder: Sink | None = None,
        sinks: Sequence[Sink] = (),
        evaluate_every: float = 0.0,
        annotator: EvidenceAnnotator | None = None,
        rank: str = "",
    ) -> None:
        """``sinks`` receive each snapshot, then the last one with why monitoring ended;
        ``recorder`` (the history's) goes first, before them. ``evaluate_every``: seconds
        (sample time) between evaluations of the detectors, at most (the ``Cadence``'s, set
        by the caller before each tick); ticks in between publish the last evaluation's
        findings.
        ``annotator`` sees each tick's findings first and may add evidence to them; when
        monitoring ends, the last findings are annotated once more after it settles.
        ``rank``: the process's rank within its distributed job (``rank_from``)."""
        self.run = run
        self.rank = rank
        self.target = target
        self.store = store if store is not None else Store()
        self._sources = list(sources)
        self._posters = [s for s in self._sources if isinstance(s, Posting)]
        self._label_sets = LabelSetLimit()
        self._down: dict[str, str] = {}
        self._statuses = self._source_statuses()
        self._engine = engine if engine is not None else Engine([])
        self._clock = clock
        self._on_finding = on_finding
        self._sinks = ([] if recorder is None else [recorder]) + list(sinks)
        self._annotator = annotator
        self.reported: dict[str, Finding] = {}
        """Each kind's latest (worst) finding in this run, in the order the kinds were first
        reported; kept after it stops holding."""
        self._announced: dict[str, set[Diagnosis]] = {}
        self._medians: dict[SeriesKey, tuple[int, float]] = {}  # by sample count, exported
        # The exported series (key, history, exported as a recent median), as of a store of
        # ``_exported_len`` series: the table is looked up again only when a series comes.
        self._exported: list[tuple[SeriesKey, SeriesHistory, bool]] = []
        self._exported_len = -1
        self._ticks = 0
        self.evaluate_every = evaluate_every
        self._evaluated_at = -math.inf
        self.moving = FastSignals()
        """When a signal last moved fast, for the sampling ``Cadence``."""
        self.snapshot = Snapshot(run, target, clock(), 0, store=self.store, rank=rank)
        # A young process is watched from its start (its history is in the channel and
        # event files); an older one from now.
        started = self.snapshot.t
        if started - target.create_time < YOUNG_SECONDS:
            started = min(started, target.create_time)
        self.goodput = GoodputAccount(started)
        """Where the run's wall time went: stored as ``wall_seconds`` after each tick."""

    def tick(self) -> Snapshot:
        """Sample every source and evaluate the detectors.

        Raises ``TargetGone`` once the target is gone, after the last reading: every other
        source read to its end, the detectors' verdict on the whole run, the snapshot and
        the history updated.
        """
        now = self._clock()
        for source in self._sources:
            if source.name in self._down:
                continue
            try:
                self._read(source, source.sample, now)
            except TargetGone:
                self._conclude(gone_from=source)
                raise
        due = self._evaluated_at + self.evaluate_every - EVALUATION_SLACK
        if now >= due:
            self._evaluated_at = now
            findings = self._engine.evaluate(now)
        else:
            findings = list(self.snapshot.findings)
        self._publish(now, findings)
        return self.snapshot

    def _read(self, source: Source, read: Callable[[float], list[Sample]], now: float) -> None:
        """Feed what ``read`` returns to the store and the detectors; ``TargetGone`` passes."""
        try:
            samples = read(now)
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
            self.moving.observe(samples)
            self._engine.observe_all(samples)
            wanted = self.goodput.series
            for sample in samples:
                if sample.series in wanted:
                    self.goodput.observe(sample)

    def _conclude(self, gone_from: Source) -> None:
        """The target has exited (``gone_from`` found out): read what every other source
        still holds (one that needs the live process has nothing more), then judge the
        whole run."""
        now = self._clock()
        for source in self._sources:
            if source is gone_from or source.name in self._down:
                continue
            read = source.drain if isinstance(source, Draining) else source.sample
            try:
                self._read(source, read, now)
            except TargetGone:
                continue
        self._publish(now, self._engine.evaluate(now, final=True), final=True)

    def _publish(self, now: float, findings: list[Finding], final: bool = False) -> None:
        """Announce news among ``findings``, publish the snapshot and hand it to the sinks."""
        self.store.extend(self.goodput.samples(now, final=final))
        if self._annotator is not None:
            findings = self._annotator.annotate(now, findings, self.store)
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
            self._statuses,
            tuple(findings),
            dict(self._engine.scores),
            self.store,
            rank=self.rank,
        )
        for sink in self._sinks:
            sink.publish(self.snapshot)
        for poster in self._posters:
            if poster.name not in self._down:
                poster.post(self.snapshot)

    def _source_statuses(self) -> tuple[SourceStatus, ...]:
        """Each source's status, for the snapshots until one is disabled."""
        down = self._down
        return tuple(
            SourceStatus(s.name, s.name not in down, down.get(s.name, "")) for s in self._sources
        )

    def _disable(self, source: Source, reason: str) -> None:
        self._down[source.name] = reason
        self._statuses = self._source_statuses()
        log.warning("%s source disabled: %s", source.name, reason)
        source.close()

    def _exported_values(self) -> dict[SeriesKey, float]:
        values: dict[SeriesKey, float] = {}
        medians = self._medians
        if len(self.store) != self._exported_len:  # a series came: look the table up again
            self._exported = [
                (key, history, spec.export is Export.RECENT_MEDIAN)
                for key, history in self.store
                if (spec := SERIES.get(key[0])) is not None
            ]
            self._exported_len = len(self.store)
        for key, history, median in self._exported:
            if median:
                held = medians.get(key)  # computed again only once a sample came
                if held is not None and held[0] == history.count:
                    value = held[1]
                else:
                    value = history.recent_median(RECENT_WINDOW)
                    medians[key] = (history.count, value)
            else:
                latest = history.latest()
                value = latest[1] if latest else math.nan
            if math.isfinite(value):
                values[key] = value
        return values

    def close(self, ended: str = STOPPED) -> None:
        """Release the sources and tell the sinks why monitoring ended."""
        for source in self._sources:
            if source.name not in self._down:
                source.close()
        self._settle()
        for sink in self._sinks:
            sink.close(self.snapshot, ended)

    def _settle(self) -> None:
        """Wait for the evidence under way and name what landed in the last findings, so
        the history records the evidence that exists at the end."""
        if self._annotator is None:
            return
        self._annotator.settle()
        last = self.snapshot
        findings = self._annotator.annotate(last.t, list(last.findings), self.store)
        current = {finding.kind for finding in findings}
        ended = [f for kind, f in self.reported.items() if kind not in current]
        ended = self._annotator.annotate(last.t, ended, self.store) if ended else []
        self.snapshot = replace(last, findings=tuple(findings), ended_findings=tuple(ended))


def watch(
    monitor: Monitor,
    interval: float,
    stop: threading.Event,
    on_tick: Callable[[Snapshot], None] = lambda snapshot: None,
) -> str | None:
    """Sample ``monitor`` until the target is gone or ``stop`` is set, at the pace its
    ``Cadence`` sets for the configured ``interval``, its detectors judging it as often as
    that says.

    Returns why monitoring ended when the target went away, ``None`` when stopped.
    """
    cadence = Cadence(interval, monitor.target.create_time)
    pacer = Pacer()
    ended = STOPPED
    try:
        while not stop.is_set():
            monitor.evaluate_every = cadence.evaluate_every(monitor.snapshot.t, monitor.moving)
            try:
                on_tick(monitor.tick())
            except TargetGone as gone:
                ended = str(gone)
                return ended
            stop.wait(pacer.delay(cadence.interval(monitor.snapshot.t, monitor.moving)))
        return None
    finally:
        monitor.close(ended)


class FastSignals:
    """Notices a signal moving fast: memory, descriptors or threads that would reach their
    limit within ``FAST_MEMORY_HORIZON`` at their rate since the previous sample (urgent: an
    OOM kill, EMFILE or a thread that cannot start ends the run), or event files growing
    ``FAST_EVENT_FILE_RATE`` or more (a disk fills in hours). Only the newest two readings of
    a few series are kept."""

    def __init__(self) -> None:
        self.last_fast = -math.inf
        """Sample time at which a signal last moved fast."""
        self.last_urgent = -math.inf
        """Sample time at which memory last headed for its limit."""
        self._previous: dict[SeriesKey, tuple[float, float]] = {}
        self._limits: dict[SeriesKey, float] = {}

    def fast_at(self, now: float) -> bool:
        """Whether a signal moved fast within ``FAST_HOLD_SECONDS`` before ``now``: sample
        fast."""
        return now < self.last_fast + FAST_HOLD_SECONDS

    def urgent_at(self, now: float) -> bool:
        """Whether memory headed for its limit within ``FAST_HOLD_SECONDS`` before ``now``:
        judge it as often as a young target."""
        return now < self.last_urgent + FAST_HOLD_SECONDS

    def observe(self, samples: Sequence[Sample]) -> None:
        limits = FAST_RESOURCE_LIMITS.values()
        for sample in samples:
            if sample.series in limits:
                self._limits[(sample.series, sample.labels)] = sample.value
        for sample in samples:
            if sample.series in FAST_RESOURCE_LIMITS or sample.series == FAST_FILE_SERIES:
                self._check(sample)

    def _check(self, sample: Sample) -> None:
        key = (sample.series, sample.labels)
        previous = self._previous.get(key)
        self._previous[key] = (sample.t, sample.value)
        if previous is None or not sample.t > previous[0]:
            return
        rise = sample.value - previous[1]
        rate = rise / (sample.t - previous[0])
        if not rate > 0 or rise < FAST_MIN_RISES.get(sample.series, 0.0):
            return
        if sample.series == FAST_FILE_SERIES:
            if rate >= FAST_EVENT_FILE_RATE:
                self.last_fast = max(self.last_fast, sample.t)
            return
        limit_series = FAST_RESOURCE_LIMITS[sample.series]
        limit = self._limits.get(
            (limit_series, sample.labels), self._limits.get((limit_series, ()), math.nan)
        )
        if (limit - sample.value) / rate < FAST_MEMORY_HORIZON:
            self.last_fast = max(self.last_fast, sample.t)
            self.last_urgent = max(self.last_urgent, sample.t)


class Cadence:
    """How long to wait before the next sample: ``FAST_INTERVAL`` while the target is young
    (``YOUNG_SECONDS`` after its process started) or within ``FAST_HOLD_SECONDS`` of a
    signal moving fast; the configured ``interval`` otherwise (and always, when it is the
    shorter)."""

    def __init__(self, interval: float, started: float) -> None:
        self.configured = interval
        self._young_until = started + YOUNG_SECONDS

    def interval(self, now: float, moving: FastSignals) -> float:
        if now < self._young_until or moving.fast_at(now):
            return min(FAST_INTERVAL, self.configured)
        return self.configured

    def evaluate_every(self, now: float, moving: FastSignals) -> float:
        """Seconds between evaluations of the detectors: the configured interval while the
        target is young or its memory heads for its limit, ``SETTLED_EVALUATE_SECONDS`` (or
        the interval, if longer) otherwise: the drift a settled run is watched for takes
        minutes to hours."""
        if now < self._young_until or moving.urgent_at(now):
            return self.configured
        return max(self.configured, SETTLED_EVALUATE_SECONDS)


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
