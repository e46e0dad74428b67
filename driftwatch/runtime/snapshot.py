"""What the monitor publishes after each tick, and the protocol of those who receive it.

A ``Snapshot`` is immutable: exporters read the newest one from any thread with a single
attribute load. Sinks (the history's recorder, the live view) receive each one on the
sampler thread, in order; where they need more than the latest values (rates, downsampled
tiers) they read the run's histories through ``Snapshot.store``, a read-only view of the
monitor's store as it stands while that snapshot is the newest.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Protocol

from driftwatch.findings import Finding
from driftwatch.runtime.store import SeriesView, StoreView
from driftwatch.series import SeriesKey
from driftwatch.target.process import TargetInfo


class _NoHistory:
    """A store view with no series: the histories of a snapshot built without a monitor."""

    def get(self, key: SeriesKey) -> SeriesView | None:
        return None

    def __iter__(self) -> Iterator[tuple[SeriesKey, SeriesView]]:
        return iter(())


NO_HISTORY: StoreView = _NoHistory()
"""The store view of a snapshot given none."""


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
    store: StoreView = field(default=NO_HISTORY, compare=False, repr=False)
    """The run's histories, read-only; read them on the sampler thread (as sinks do), while
    this snapshot is the newest: the monitor goes on writing them."""
    ended_findings: tuple[Finding, ...] = ()
    """Set on the snapshot that closes the sinks only: the last version of each finding
    that ended during the run, with the evidence that landed for it since (a profiler trace
    the hook finished after the slowdown that asked for it was over)."""
    rank: str = ""
    """The process's rank within a distributed job (``worker:1``); ``""`` for one process."""

    @property
    def title(self) -> str:
        """The run's name, with its rank in a distributed job: ``mnist (worker:1)``."""
        return f"{self.run} ({self.rank})" if self.rank else self.run


class Sink(Protocol):
    """Receives a run's snapshots from its monitor, on the sampler thread."""

    def publish(self, snapshot: Snapshot) -> None:
        """One tick's snapshot; must not block the sampler for long."""

    def close(self, snapshot: Snapshot, ended: str) -> None:
        """Monitoring has ended (why: ``ended``); ``snapshot`` is the last one."""
