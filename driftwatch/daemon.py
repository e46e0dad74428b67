"""``driftwatch daemon``: one node agent watching every hooked process and every match.

Each tick the daemon

1. lists the hook channels in the runtime directories (every user's when it runs as root),
   starts watching the processes behind new ones and removes the channels of processes that
   have exited;
2. every ``SCAN_EVERY_TICKS`` ticks, scans the process table for command lines that a
   ``--match`` pattern finds;
3. ticks every monitor and drops those whose target has gone, with their series.

Between ticks, each monitor is sampled at its own ``Cadence``: every 0.5 s while its target
is young or a signal moves fast, every ``interval`` otherwise.

With a ``History``, each run is recorded into it, and ends there with why it was dropped
(or that the daemon stopped); a restarted daemon resumes the runs of the processes that
still live.

One thread ticks all monitors: a tick only reads ``/proc``, shared memory and the new bytes
of event files, so a node's targets fit in one interval, and nothing needs a lock. A
target's failure ends its own monitor only. Scrapes read the tuple of snapshots published
after each tick.
"""

from __future__ import annotations

import glob
import logging
import math
import os
import re
import signal
import threading
import time
import tomllib
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import Any

import psutil

from driftwatch.channel import (
    SHARED_DIR_ENV,
    ChannelError,
    ChannelReader,
    check_private_dir,
    list_channels,
    read_meta,
    remove_channel,
    writer_alive,
)
from driftwatch.detect.catalog import default_engine
from driftwatch.errors import TargetAccessDenied, TargetError, TargetGone, UsageError
from driftwatch.findings import Finding
from driftwatch.history.writer import History
from driftwatch.hook.autolog import RUN_ENV
from driftwatch.monitor import Cadence, Monitor, Pacer, check_interval
from driftwatch.pidns import find_process, start_ticks
from driftwatch.snapshot import Snapshot
from driftwatch.sources import default_sources
from driftwatch.target import Target, default_run_name

log = logging.getLogger(__name__)

DEFAULT_INTERVAL = 2.0
SCAN_EVERY_TICKS = 5
SWEEP_AFTER_SECONDS = 10.0
"""Seconds between finding a channel's process gone and removing the channel."""
"""The process table is read every this many ticks: a node has hundreds of processes, and a
job that only a pattern finds can wait a few seconds more to be noticed."""

Key = tuple[int, int]
"""A process: its PID and ``round(create_time * 100)``, both as this daemon sees them."""

ProcessScan = Callable[[], Iterable[tuple[int, float, str]]]
"""Lists ``(pid, create_time, command line)`` of the processes on the node."""


def _key(pid: int, create_time: float) -> Key:
    return pid, round(create_time * 100)


@dataclass(frozen=True, slots=True)
class Rule:
    """Watch processes whose command line ``pattern`` finds, with these TensorBoard logdirs."""

    pattern: re.Pattern[str]
    logdirs: tuple[Path, ...] = ()


@dataclass(frozen=True, slots=True)
class Config:
    """What the daemon does; re-read from its sources on ``SIGHUP``."""

    interval: float = DEFAULT_INTERVAL
    rules: tuple[Rule, ...] = ()
    channel_dirs: tuple[Path, ...] = ()
    """Directories with hook channels beyond the usual per-user ones."""

    def rule_for(self, command: str) -> Rule | None:
        """The first rule whose pattern finds ``command``."""
        return next((rule for rule in self.rules if rule.pattern.search(command)), None)


def _compile(pattern: str, where: str) -> re.Pattern[str]:
    try:
        return re.compile(pattern)
    except re.error as err:
        raise UsageError(f"{where}: bad regular expression {pattern!r}: {err}") from err


def _paths(value: object, where: str) -> tuple[Path, ...]:
    if not isinstance(value, list) or not all(isinstance(item, str) for item in value):
        raise UsageError(f"{where}: expected a list of paths")
    return tuple(Path(item) for item in value)


def _check_keys(table: dict[str, Any], allowed: set[str], where: str) -> None:
    unknown = sorted(set(table) - allowed)
    if unknown:
        raise UsageError(
            f"{where}: unknown key {unknown[0]!r} (expected {', '.join(sorted(allowed))})"
        )


def _read_config_file(path: Path) -> Config:
    """Parse the TOML configuration file (see the README); ``UsageError`` saying what is wrong."""
    try:
        with path.open("rb") as file:
            table = tomllib.load(file)
    except OSError as err:
        raise UsageError(f"--config {path}: cannot read it: {err.strerror}") from err
    except tomllib.TOMLDecodeError as err:
        raise UsageError(f"--config {path}: not valid TOML: {err}") from err
    _check_keys(table, {"interval", "channel_dirs", "match"}, str(path))
    interval = table.get("interval", DEFAULT_INTERVAL)
    if not isinstance(interval, (int, float)) or isinstance(interval, bool):
        raise UsageError(f"{path}: interval must be a number of seconds")
    matches = table.get("match", [])
    if not isinstance(matches, list) or not all(isinstance(m, dict) for m in matches):
        raise UsageError(f"{path}: match must be an array of tables ([[match]])")
    rules = []
    for number, match in enumerate(matches, 1):
        where = f"{path}: match #{number}"
        _check_keys(match, {"pattern", "logdirs"}, where)
        if not isinstance(match.get("pattern"), str):
            raise UsageError(f"{where}: needs a pattern (a regular expression)")
        rules.append(
            Rule(_compile(match["pattern"], where), _paths(match.get("logdirs", []), where))
        )
    return Config(
        check_interval(float(interval), f"{path}: interval"),
        tuple(rules),
        _paths(table.get("channel_dirs", []), f"{path}: channel_dirs"),
    )


def load_config(
    path: Path | None, matches: Sequence[str] = (), interval: float | None = None
) -> Config:
    """The configuration file at ``path`` (if any) plus the command line's options.

    ``--match`` patterns add to the file's rules; ``--interval`` overrides the file's.
    """
    config = _read_config_file(path) if path is not None else Config()
    rules = tuple(Rule(_compile(m, "--match")) for m in matches) + config.rules
    return Config(
        config.interval if interval is None else check_interval(interval),
        rules,
        config.channel_dirs,
    )


def channel_dirs(extra: Sequence[Path], environ: dict[str, str] | None = None) -> list[Path]:
    """Where hooked processes keep their channels: ``extra``, ``$DRIFTWATCH_RUNTIME_DIR``,
    every user's directory in ``$DRIFTWATCH_SHARED_DIR``, and every user's default runtime
    directories (``/tmp/driftwatch-UID``, ``/run/user/UID/driftwatch``)."""
    environ = dict(os.environ) if environ is None else environ
    found = [*extra]
    if environ.get("DRIFTWATCH_RUNTIME_DIR"):
        found.append(Path(environ["DRIFTWATCH_RUNTIME_DIR"]))
    if environ.get(SHARED_DIR_ENV):
        shared = glob.escape(environ[SHARED_DIR_ENV])
        found += map(Path, sorted(glob.glob(f"{shared}/[0-9]*")))
    found += map(Path, sorted(glob.glob("/tmp/driftwatch-[0-9]*")))
    found += map(Path, sorted(glob.glob("/run/user/[0-9]*/driftwatch")))
    return list(dict.fromkeys(found))


def scan_processes() -> Iterator[tuple[int, float, str]]:
    """``(pid, create_time, command line)`` of every process with a command line."""
    for process in psutil.process_iter(["cmdline", "create_time"]):
        cmdline, create_time = process.info["cmdline"], process.info["create_time"]
        if cmdline and create_time is not None:  # kernel threads have none; None: denied
            yield process.pid, create_time, " ".join(cmdline)


def _own_lineage() -> set[int]:
    """This process and its ancestors: their command lines hold the daemon's own patterns."""
    me = psutil.Process()
    return {me.pid, *(parent.pid for parent in me.parents())}


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
    where to look for channels; ``scan`` lists the process table; ``clock`` stamps samples;
    ``on_finding`` gets each run's findings; ``history``, if any, records every run;
    ``sweep_after``: seconds before the channel of an exited process is removed.
    """

    def __init__(
        self,
        load: Callable[[], Config],
        *,
        directories: Callable[[Config], list[Path]] = lambda config: channel_dirs(
            config.channel_dirs
        ),
        scan: ProcessScan = scan_processes,
        clock: Callable[[], float] = time.time,
        on_finding: Callable[[str, Finding], None] = lambda run, finding: None,
        history: History | None = None,
        sweep_after: float = SWEEP_AFTER_SECONDS,
    ) -> None:
        self._load = load
        self.config = load()
        self._directories = directories
        self._scan = scan
        self._clock = clock
        self._on_finding = on_finding
        self._history = history
        self._own = _own_lineage()
        self._watched: dict[Key, _Watched] = {}
        self._skipped: set[Key] = set()  # refused or unreadable: logged once, not retried
        self._unsafe_dirs: set[Path] = set()  # logged once while they stay unsafe
        self._waiting: set[Key] = set()  # channels whose metadata was not written yet
        self._writers: dict[Path, Key] = {}  # the process that writes each channel seen
        self._refused: set[Path] = set()  # not channels, or of processes out of sight
        self._litter: set[Path] = set()  # channels of exited processes we cannot remove
        self._exited: dict[Path, tuple[float, str]] = {}  # to remove: since when, and why
        self._sweep_after = sweep_after
        self._ticks = 0
        self._wake = threading.Event()
        self._stop_requested = False
        self._reload_requested = False
        self.snapshots: tuple[Snapshot, ...] = ()
        """The latest snapshot of every live run, replaced as a whole after each tick."""

    @property
    def runs(self) -> dict[str, int]:
        """The PID of each watched run, by run name."""
        return {w.monitor.run: w.monitor.target.pid for w in self._watched.values()}

    # -- one tick ---------------------------------------------------------------------------

    def tick(self) -> None:
        """Discover new targets, sample every target, drop the ended ones, publish."""
        self._discover()
        self._sample(due_only=False)

    def _discover(self) -> None:
        self._sweep_due()
        self._discover_channels()  # first: a hooked process is named by its hook
        if self._ticks % SCAN_EVERY_TICKS == 0:
            self._forget_exited()
            self._scan_processes()
        self._ticks += 1

    def _sample(self, *, due_only: bool) -> None:
        """Sample the targets (only those whose cadence says it is time, if ``due_only``),
        drop the ended ones and publish the snapshots."""
        now = time.monotonic()
        for key, watched in list(self._watched.items()):
            if due_only and now < watched.due:
                continue
            try:
                watched.monitor.tick()
            except TargetGone as gone:
                self._drop(key, str(gone))
                if watched.channel is not None:
                    self._sweep(watched.channel)
                continue
            except Exception as err:  # one target's failure must not stop the others
                log.exception("monitoring %s failed", watched.monitor.run)
                self._skipped.add(key)
                self._drop(key, f"internal error: {err!r}")
                continue
            monitor = watched.monitor
            step = watched.cadence.interval(monitor.snapshot.t, monitor.moving)
            scheduled = watched.due + step  # on schedule, unless it fell behind
            watched.due = scheduled if scheduled > now else now + step
        self.snapshots = tuple(w.monitor.snapshot for w in self._watched.values())

    def _next_due(self) -> float:
        return min((w.due for w in self._watched.values()), default=math.inf)

    def _discover_channels(self) -> None:
        seen = {w.channel for w in self._watched.values()} | self._refused | self._litter
        seen |= self._exited.keys()
        for directory in self._directories(self.config):
            # Other users' directories are closed to a daemon without root or
            # CAP_DAC_READ_SEARCH: that is expected, not worth a line.
            if not os.access(directory, os.R_OK | os.X_OK, effective_ids=True):
                continue
            try:
                owner = check_private_dir(directory)
                channels = list_channels(directory)
            except ChannelError as err:
                if directory not in self._unsafe_dirs:
                    self._unsafe_dirs.add(directory)
                    log.warning("skipping the channel directory %s: %s", directory, err)
                continue
            self._unsafe_dirs.discard(directory)
            for _pid, _create_time, path in channels:
                if path not in seen:
                    self._adopt_channel(path, owner)

    def _adopt_channel(self, path: Path, directory_owner: int) -> None:
        """Start watching the process that writes a new channel, or remove the channel if its
        writer has exited, or refuse it (once) if it is not the process's own (its file and
        directory must be the process user's)."""
        key = self._writers.get(path) or self._find_writer(path, directory_owner)
        if key is None or key in self._watched or key in self._skipped:
            return
        try:
            target = Target.attach(key[0])
        except TargetGone:
            self._sweep(path)
            return
        except TargetAccessDenied as err:
            self._skip(key, str(err))
            return
        if _key(target.pid, target.info.create_time) != key:  # the PID was reused since
            self._sweep(path)
            return
        if target.info.uid != directory_owner:  # the file's owner is the directory's
            self._skip(
                key,
                f"refusing the channel {path}: it is in a directory of uid {directory_owner}, "
                f"but process {target.pid} runs as uid {target.info.uid}",
            )
            return
        meta = read_meta(path)
        if "run" not in meta and key not in self._waiting:
            self._waiting.add(key)  # the hook writes it right after the channel
            return
        self._waiting.discard(key)
        run = meta.get("run")
        self._start(key, target, run if isinstance(run, str) else None, path, f"its channel {path}")

    def _find_writer(self, path: Path, directory_owner: int) -> Key | None:
        """The process that writes the channel ``path``, as this daemon sees it (its PID
        differs when it runs in a container), remembered; None if there is none to watch: the
        channel is then removed if its writer has exited, or refused if it is not a channel
        or its writer is out of sight."""
        try:
            reader = ChannelReader.open(path, directory_owner)
            writer = reader.process
            reader.close()
            pid = find_process(writer)
            if pid is None:
                if writer_alive(path):
                    self._refuse(
                        path,
                        f"its process (pid {writer.pid} in PID namespace {writer.namespace}) "
                        "is not in sight: it needs the host's PID namespace (hostPID) and "
                        "ptrace access (CAP_SYS_PTRACE)",
                    )
                else:
                    self._sweep(path)
                return None
            key = _key(pid, psutil.Process(pid).create_time())
            if start_ticks(pid) != writer.start_ticks:  # the writer exited since it was found
                return None
        except ChannelError as err:
            self._unreadable(path, str(err))
            return None
        except (psutil.Error, OSError):  # exited since it was found; looked at again next tick
            return None
        self._writers[path] = key
        return key

    def _unreadable(self, path: Path, reason: str) -> None:
        """A channel this daemon cannot read (an older format, a stray file): removed if no
        process holds it as its writer, as an older driftwatch's hook leaves it on exit;
        else refused, once."""
        try:
            written = writer_alive(path)
        except ChannelError:
            written = True  # cannot tell: leave it
        if not os.path.lexists(path):  # removed since it was listed
            return
        if written:
            self._refuse(path, reason)
        else:
            self._sweep(path, f"no process writes it, and it is unreadable ({reason})")

    def _refuse(self, path: Path, reason: str) -> None:
        self._refused.add(path)
        log.warning("not watching the channel %s: %s", path, reason)

    def _forget_exited(self) -> None:
        """Forget the processes refused or waited for that have exited since, and the
        channels removed since (by us or by someone else)."""
        self._skipped = {key for key in self._skipped if psutil.pid_exists(key[0])}
        self._waiting = {key for key in self._waiting if psutil.pid_exists(key[0])}
        self._writers = {path: key for path, key in self._writers.items() if os.path.lexists(path)}
        self._refused = {path for path in self._refused if os.path.lexists(path)}
        self._litter = {path for path in self._litter if os.path.lexists(path)}

    def _scan_processes(self) -> None:
        if not self.config.rules:
            return
        watched_pids = {pid for pid, _ in self._watched}
        for pid, create_time, command in self._scan():
            key = _key(pid, create_time)
            if pid in self._own or pid in watched_pids or key in self._skipped:
                continue
            rule = self.config.rule_for(command)
            if rule is None:
                continue
            try:
                target = Target.attach(pid)
            except TargetGone:
                continue
            except TargetAccessDenied as err:
                self._skip(key, str(err))
                continue
            self._start(key, target, None, None, f"the pattern {rule.pattern.pattern!r}")

    def _start(
        self, key: Key, target: Target, run: str | None, channel: Path | None, found_by: str
    ) -> None:
        """Watch ``target`` as ``run`` (default: ``_default_name``), with the logdirs of the
        pattern that finds its command line, if any."""
        command = " ".join(target.info.command)
        rule = self.config.rule_for(command)
        try:
            name = self._unique_name(run or self._default_name(target), target.pid)
            sources = default_sources(target, rule.logdirs if rule else (), channel)
        except TargetGone:
            return
        except TargetError as err:
            self._skip(key, str(err))
            return
        monitor = Monitor(
            name,
            target.info,
            sources,
            default_engine(),
            clock=self._clock,
            on_finding=lambda finding: self._report(name, finding),
            recorder=None if self._history is None else self._history.recorder(name, target.info),
        )
        cadence = Cadence(self.config.interval, target.info.create_time)
        self._watched[key] = _Watched(monitor, command, channel is None, channel, cadence)
        log.info("watching %s (pid %d), found by %s", name, target.pid, found_by)

    @staticmethod
    def _default_name(target: Target) -> str:
        """``$DRIFTWATCH_RUN`` of the process, else the script's name."""
        run = target.environ().get(RUN_ENV)
        return run or default_run_name(list(target.info.command), target.info.name)

    def _unique_name(self, name: str, pid: int) -> str:
        """``name``, or ``name-PID`` if a live run has it: label values stay unique."""
        taken = {w.monitor.run for w in self._watched.values()}
        unique, suffix = name, 1
        while unique in taken:
            unique = f"{name}-{pid}" if suffix == 1 else f"{name}-{pid}-{suffix}"
            suffix += 1
        return unique

    def _report(self, run: str, finding: Finding) -> None:
        log.info("%s: [%s] %s: %s", run, finding.severity.value, finding.kind, finding.message)
        self._on_finding(run, finding)

    def _drop(self, key: Key, reason: str) -> None:
        watched = self._watched.pop(key)
        watched.monitor.close(reason)
        log.info("stopped watching %s (pid %d): %s", watched.monitor.run, key[0], reason)

    def _sweep(self, path: Path, why: str = "its process has exited") -> None:
        """Remove the channel of a process that has exited, ``sweep_after`` seconds after it
        is first found so: nobody will write it again, but another monitor of the same job
        (``driftwatch run``, a second daemon) may still be reading its last records, which
        need the metadata beside it."""
        self._exited.setdefault(path, (time.monotonic(), why))
        self._sweep_due()

    def _sweep_due(self, everything: bool = False) -> None:
        """Remove the exited processes' channels whose time has come (``everything``: all).

        One that cannot be removed (e.g. a read-only mount) is logged once and left alone.
        """
        now = time.monotonic()
        for path, (since, why) in list(self._exited.items()):
            if not everything and now - since < self._sweep_after:
                continue
            del self._exited[path]
            if remove_channel(path):
                log.info("removed %s: %s", path, why)
            else:
                self._litter.add(path)

    def _skip(self, key: Key, reason: str) -> None:
        self._skipped.add(key)
        log.warning("not watching pid %d: %s", key[0], reason)

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
        self._skipped.clear()
        self._refused.clear()
        self._unsafe_dirs.clear()
        self._ticks = 0  # scan the process table on the next tick
        for watched in self._watched.values():
            watched.cadence = Cadence(config.interval, watched.monitor.target.create_time)
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
        next_discovery = time.monotonic()
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
        history ends with ``monitor.STOPPED``."""
        for watched in self._watched.values():
            watched.monitor.close()
        self._watched.clear()
        self.snapshots = ()
        self._sweep_due(everything=True)


@contextmanager
def handling_signals(daemon: Daemon) -> Iterator[list[int]]:
    """``SIGHUP`` reloads the daemon, ``SIGINT`` and ``SIGTERM`` stop it; yields the list of
    stop signals received."""
    received: list[int] = []

    def stop(signum: int, frame: FrameType | None) -> None:
        received.append(signum)
        daemon.request_stop()

    def reload(signum: int, frame: FrameType | None) -> None:
        daemon.request_reload()

    handlers = {signal.SIGINT: stop, signal.SIGTERM: stop, signal.SIGHUP: reload}
    previous = {sig: signal.signal(sig, handler) for sig, handler in handlers.items()}
    try:
        yield received
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)
