"""``driftwatch daemon``: one node agent watching every hooked process and every match.

Each tick the daemon

1. discovers new targets (``driftwatch.daemon.discovery``): processes with a hook channel,
   and every ``SCAN_EVERY_TICKS`` ticks those whose command line a ``--match`` pattern finds;
2. ticks every monitor and drops those whose target has gone, with their series.

Between ticks, each monitor is sampled at its own ``Cadence``: every 0.5 s while its target
is young or a signal moves fast, every ``interval`` otherwise. Its detectors judge it every
``interval`` while it is young, every 10 s (or ``interval``, if longer) once it has settled,
and at every sample while a signal moves fast.

With a ``History``, each run is recorded into it, and ends there with why it was dropped
(or that the daemon stopped); a restarted daemon resumes the runs of the processes that
still live.

One thread ticks all monitors: a tick only reads ``/proc``, shared memory and the new bytes
of event files, so a node's targets fit in one interval, and nothing needs a lock. A
target's failure ends its own monitor only. Scrapes read the tuple of snapshots published
after each tick.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from driftwatch.capture.capturer import capturer_for
from driftwatch.channel.env import rank_from, run_name_from
from driftwatch.channel.paths import channel_dirs
from driftwatch.daemon.config import Config
from driftwatch.daemon.discovery import (
    SWEEP_AFTER_SECONDS,
    Discovery,
    Found,
    Key,
    ProcessScan,
    ProcessTable,
)
from driftwatch.detect.catalog import default_engine
from driftwatch.errors import TargetError, TargetGone, UsageError
from driftwatch.findings import Finding
from driftwatch.history.writer import History
from driftwatch.runtime.monitor import Cadence, Monitor, Pacer
from driftwatch.runtime.ranks import with_board
from driftwatch.runtime.snapshot import Snapshot
from driftwatch.sources import default_sources
from driftwatch.sources.host import NodePressure
from driftwatch.target.process import Target

log = logging.getLogger(__name__)

DUE_SLACK_SECONDS = 0.005
"""A target due this many seconds after a wake-up is sampled in it (one wake-up, not two)."""


@dataclass(slots=True)
class _Watched:
    monitor: Monitor
    command: str
    matched: bool  # found by a pattern, not by its channel
    channel: Path | None  # the hook channel it was found by
    cadence: Cadence
    due: float = -math.inf  # when it is next sampled, on the monotonic clock


class Daemon:
    """Discovers targets, keeps one ``Monitor`` each, and publishes their snapshots.

    ``load`` reads the configuration (called again on ``reload``); ``directories`` says
    where to look for channels; ``scan`` lists the process table (default: a
    ``ProcessTable``); ``clock`` stamps samples;
    ``on_finding`` gets each run's findings (its name, the finding, its rank or ""); ``history``,
    if any, records every run;
    ``sweep_after``: seconds before the channel of an exited process is removed.
    """

    def __init__(
        self,
        load: Callable[[], Config],
        *,
        directories: Callable[[Config], list[Path]] = lambda config: channel_dirs(
            config.channel_dirs
        ),
        scan: ProcessScan | None = None,
        clock: Callable[[], float] = time.time,
        on_finding: Callable[[str, Finding, str], None] = lambda run, finding, rank: None,
        history: History | None = None,
        sweep_after: float = SWEEP_AFTER_SECONDS,
    ) -> None:
        self._load = load
        self.config = load()
        self._discovery = Discovery(directories, scan or ProcessTable(), sweep_after)
        self._clock = clock
        self._on_finding = on_finding
        self._history = history
        self._watched: dict[Key, _Watched] = {}
        self._epoch = time.monotonic()  # the sampling grid's origin (``run`` sets it again)
        self._pressure = NodePressure()  # the node's: read once for all targets due together
        self._wake = threading.Event()
        self._stop_requested = False
        self._reload_requested = False
        self.snapshots: tuple[Snapshot, ...] = ()
        """The latest snapshot of every live run, replaced as a whole after each tick."""

    @property
    def runs(self) -> dict[str, int]:
        """The PID of each watched run, by its title (the run name, and the rank of a
        distributed job's process: ``mnist (worker:1)``)."""
        return {w.monitor.snapshot.title: w.monitor.target.pid for w in self._watched.values()}

    # -- one tick ---------------------------------------------------------------------------

    def tick(self) -> None:
        """Discover new targets, sample every target, drop the ended ones, publish."""
        self._discover()
        self._sample(due_only=False)

    def _discover(self) -> None:
        for found in self._discovery.discover(self.config, self._watched):
            self._start(found)

    def _sample(self, *, due_only: bool) -> None:
        """Sample the targets (only those whose cadence says it is time, if ``due_only``),
        drop the ended ones and publish the snapshots."""
        now = time.monotonic()
        for key, watched in list(self._watched.items()):
            if due_only and now < watched.due - DUE_SLACK_SECONDS:
                continue
            try:
                watched.monitor.tick()
            except TargetGone as gone:
                self._drop(key, str(gone))
                if watched.channel is not None:
                    self._discovery.exited(watched.channel)
                continue
            except Exception as err:  # one target's failure must not stop the others
                log.exception("monitoring %s failed", watched.monitor.run)
                self._discovery.refuse(key)
                self._drop(key, f"internal error: {err!r}")
                continue
            monitor = watched.monitor
            step = watched.cadence.interval(monitor.snapshot.t, monitor.moving)
            monitor.evaluate_every = watched.cadence.evaluate_every(
                monitor.snapshot.t, monitor.moving
            )
            scheduled = watched.due + step  # on schedule, unless it fell behind
            watched.due = self._on_grid(scheduled if scheduled > now else now + step, step, now)
        self.snapshots = tuple(w.monitor.snapshot for w in self._watched.values())

    def _on_grid(self, due: float, step: float, now: float) -> float:
        """``due`` moved to the nearest multiple of ``step`` from the loop's start, after
        ``now``: targets of one cadence are sampled in one wake-up, beside the discovery
        (the first interval of a new cadence is 0.5 to 1.5 times its step)."""
        grid = self._epoch + round((due - self._epoch) / step) * step
        return grid if grid > now else grid + step

    def _next_due(self) -> float:
        return min((w.due for w in self._watched.values()), default=math.inf)

    def _start(self, found: Found) -> None:
        """Watch the target found, as the run its hook named (default: ``_default_name``),
        with the logdirs of the pattern that finds its command line, if any."""
        key, target, run, channel = found.key, found.target, found.run, found.channel
        command = " ".join(target.info.command)
        rule = self.config.rule_for(command)
        try:
            rank = self._rank_of(target) if found.rank is None else found.rank
            name = self._unique_name(run or self._default_name(target), rank, target.pid)
            sources = default_sources(target, rule.logdirs if rule else (), channel, self._pressure)
            sources = with_board(sources, rank)
        except TargetGone:
            return
        except TargetError as err:
            self._discovery.refuse(key, str(err))
            return
        history = self._history
        capturer = None if history is None else capturer_for(history.path, target.info, sources)
        cadence = Cadence(self.config.interval, target.info.create_time)
        monitor = Monitor(
            name,
            target.info,
            sources,
            default_engine(),
            clock=self._clock,
            on_finding=lambda finding: self._report(monitor, finding),
            recorder=None if history is None else history.recorder(name, target.info),
            sinks=() if capturer is None else (capturer,),
            annotator=capturer,
            rank=rank,
        )
        self._watched[key] = _Watched(monitor, command, channel is None, channel, cadence)
        log.info("watching %s (pid %d), found by %s", name, target.pid, found.found_by)

    @staticmethod
    def _default_name(target: Target) -> str:
        """``$DRIFTWATCH_RUN`` of the process, else the script's name."""
        return run_name_from(target.environ(), list(target.info.command), target.info.name)

    @staticmethod
    def _rank_of(target: Target) -> str:
        """The process's rank in its distributed job (``rank_from`` its environment), for a
        process whose hook gave none; ``""`` when it has none, or its environment may not be
        read."""
        try:
            return rank_from(target.environ())
        except TargetError:
            return ""

    def _unique_name(self, name: str, rank: str, pid: int) -> str:
        """``name``, or ``name-PID`` if a live run of the same ``rank`` has it: the ranks of
        one job share their run name, and label values stay unique."""
        taken = {w.monitor.run for w in self._watched.values() if w.monitor.rank == rank}
        unique, suffix = name, 1
        while unique in taken:
            unique = f"{name}-{pid}" if suffix == 1 else f"{name}-{pid}-{suffix}"
            suffix += 1
        return unique

    def _report(self, monitor: Monitor, finding: Finding) -> None:
        """Log a finding of ``monitor``'s run (titled with its rank) and hand it on."""
        title = monitor.snapshot.title
        log.info("%s: [%s] %s: %s", title, finding.severity.value, finding.kind, finding.message)
        self._on_finding(monitor.run, finding, monitor.rank)

    def _drop(self, key: Key, reason: str) -> None:
        watched = self._watched.pop(key)
        watched.monitor.close(reason)
        log.info("stopped watching %s (pid %d): %s", watched.monitor.run, key[0], reason)

    # -- the loop -----------------------------------------------------------------------------

    def reload(self) -> None:
        """Re-read the configuration and re-scan; a bad configuration keeps the previous one.

        Targets that only a pattern found, and that no pattern finds now, are dropped; those
        refused before are tried again.
        """
        try:
            config = self._load()
        except UsageError as err:
            log.warning("configuration not reloaded, keeping the previous one: %s", err)
            return
        self.config = config
        for key, watched in list(self._watched.items()):
            if watched.matched and config.rule_for(watched.command) is None:
                self._drop(key, "no --match pattern finds it any more")
        self._discovery.reset()  # and scan the process table on the next tick
        for watched in self._watched.values():
            monitor = watched.monitor
            watched.cadence = Cadence(config.interval, monitor.target.create_time)
            monitor.evaluate_every = watched.cadence.evaluate_every(
                monitor.snapshot.t, monitor.moving
            )
        log.info(
            "configuration reloaded: %d patterns, interval %g s", len(config.rules), config.interval
        )

    def request_stop(self) -> None:
        """Make ``run`` return after the current tick (safe in a signal handler)."""
        self._stop_requested = True
        self._wake.set()

    def request_reload(self) -> None:
        """Make ``run`` reload before its next tick (safe in a signal handler)."""
        self._reload_requested = True
        self._wake.set()

    def run(self) -> None:
        """Discover targets every ``config.interval`` seconds and sample each at its own
        cadence (faster while it is young or moving fast) until ``request_stop``; then
        close all."""
        pacer = Pacer()
        next_discovery = self._epoch = time.monotonic()
        try:
            while True:
                self._wake.clear()
                if self._stop_requested:
                    return
                if self._reload_requested:
                    self._reload_requested = False
                    self.reload()
                if time.monotonic() >= next_discovery:
                    self._discover()
                    next_discovery = time.monotonic() + pacer.delay(self.config.interval)
                self._sample(due_only=True)
                wake_at = min(next_discovery, self._next_due())
                self._wake.wait(max(0.0, wake_at - time.monotonic()))
        finally:
            self.close()

    def close(self) -> None:
        """Stop watching everything (the runs' channels stay: their processes live on); their
        history ends with ``monitor.STOPPED``. The channels of processes that exited less than
        ``sweep_after`` ago stay too: another reader may still need their metadata (any
        daemon's discovery removes them later)."""
        for watched in self._watched.values():
            watched.monitor.close()
        self._watched.clear()
        self.snapshots = ()
        self._discovery.sweep_due()
