"""How the daemon finds the processes to watch, and what it remembers between looks.

Each discovery

1. removes the channels of exited processes whose time has come;
2. lists the hook channels in the runtime directories (every user's when the daemon runs as
   root) and finds the process behind each new one; a channel whose writer has exited is
   removed ``sweep_after`` seconds later (another monitor may still be reading it);
3. every ``SCAN_EVERY_TICKS`` discoveries, scans the process table for command lines that a
   ``--match`` pattern finds; a match below a watched process (a data-loader worker forked
   from a matched job, with the job's command line) is part of that job, not a job of its
   own.

It yields what it found as ``Found``; the daemon decides what to do with each.
"""

from __future__ import annotations

import enum
import logging
import os
import time
from collections.abc import Callable, Container, Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import psutil

from driftwatch.channel.paths import (
    ChannelError,
    check_private_dir,
    list_channels,
    remove_channel,
    stamp,
)
from driftwatch.channel.ring import ChannelReader, read_meta, writer_alive
from driftwatch.daemon.config import Config
from driftwatch.errors import TargetAccessDenied, TargetGone
from driftwatch.target.access import is_kernel_thread
from driftwatch.target.pidns import find_process, start_ticks
from driftwatch.target.process import CLOCK_TICKS, Target, read_proc_file
from driftwatch.target.tree import descends_from

log = logging.getLogger(__name__)

SCAN_EVERY_TICKS = 5
"""Ticks between reads of the process table (for jobs only a pattern finds), and between
searches for channel directories (a user's first; those known are listed every tick)."""
REREAD_COMMANDS_EVERY_SCANS = 6
"""Scans of the process table between reads of every process's command line (in between,
only new processes' are read)."""
SWEEP_AFTER_SECONDS = 10.0
"""Seconds between finding a channel's process gone and removing the channel."""

Key = tuple[int, int]
"""A process: its PID and ``round(create_time * 100)``, both as this daemon sees them."""

ProcessScan = Callable[[], Iterable[tuple[int, float, str]]]
"""Lists ``(pid, create_time, command line)`` of the processes on the node."""


class Watching(Protocol):
    """A process the daemon watches, as discovery needs to know it."""

    @property
    def channel(self) -> Path | None:
        """The hook channel it was found by; None if a pattern found it."""
        ...


def process_key(pid: int, create_time: float) -> Key:
    """The ``Key`` of the process ``(pid, create_time)``."""
    return pid, stamp(create_time)


class ProcessTable:
    """Lists ``(pid, create_time, command line)`` of every process with a command line: the
    daemon's ``ProcessScan``.

    One read of ``/proc/PID/stat`` per process gives its start time and name; its command
    line is read only for a process that was not in the previous scan with both the same (a
    new process, or one that ``exec``'d another program), and for every process each
    ``REREAD_COMMANDS_EVERY_SCANS`` scans (a program that rewrites its own command line, or
    ``exec``'s one of the same name). ``create_time`` is psutil's: boot time plus start time.
    """

    def __init__(self) -> None:
        self._known: dict[int, tuple[bytes, str]] = {}
        """Each process of the previous scan: its name and start time (from ``stat``), and its
        command line."""
        self._scans = 0

    def __call__(self) -> list[tuple[int, float, str]]:
        reread = self._scans % REREAD_COMMANDS_EVERY_SCANS == 0
        self._scans += 1
        boot = psutil.boot_time()
        known: dict[int, tuple[bytes, str]] = {}
        table: list[tuple[int, float, str]] = []
        for entry in os.listdir("/proc"):
            if not entry.isdigit():
                continue
            pid = int(entry)
            try:
                stat = read_proc_file(f"/proc/{pid}/stat")
                close = stat.rindex(b")")
                ticks = stat[close + 2 :].split(maxsplit=20)[19]
                identity = stat[stat.index(b"(") + 1 : close] + b"\0" + ticks
                command = self._command(pid, identity, stat, reread)
            except (OSError, ValueError, IndexError):  # exited since the listing
                continue
            known[pid] = (identity, command)
            if command:  # kernel threads and zombies have none
                table.append((pid, float(ticks) / CLOCK_TICKS + boot, command))
        self._known = known
        return table

    def _command(self, pid: int, identity: bytes, stat: bytes, reread: bool) -> str:
        """The command line of ``pid``: remembered from the previous scan when the process
        is the same one, read anew otherwise. An empty one is remembered only for a kernel
        thread: a process caught in ``exec``, between taking its new name and setting up its
        new arguments, has none for a moment."""
        previous = self._known.get(pid)
        if previous is None or previous[0] != identity:
            return _command_line(pid)
        if not previous[1]:
            return "" if is_kernel_thread(stat) else _command_line(pid)
        return _command_line(pid) if reread else previous[1]


def _command_line(pid: int) -> str:
    """The command line of process ``pid``, its arguments joined by spaces (as psutil splits
    it); ``""`` for a kernel thread or a zombie."""
    with open(f"/proc/{pid}/cmdline", "rb") as file:
        text = os.fsdecode(file.read())
    if text.endswith(("\0", " ")):
        text = text[:-1]
    return text.replace("\0", " ")


def _own_lineage() -> set[int]:
    """This process and its ancestors: their command lines hold the daemon's own patterns."""
    me = psutil.Process()
    return {me.pid, *(parent.pid for parent in me.parents())}


@dataclass(frozen=True, slots=True)
class Found:
    """A process to watch, as discovery found it."""

    key: Key
    target: Target
    run: str | None
    """The run name its hook gave it, if any."""
    channel: Path | None
    """The hook channel it was found by; None if a pattern found it."""
    found_by: str
    """How it was found, for the log."""
    rank: str | None = None
    """The rank its hook gave it (``""``: none), if it has a hook."""


class Verdict(enum.Enum):
    """Why discovery passes over a channel file whose process is not watched."""

    REFUSED = "refused"
    """Not a channel, or its writer out of sight: logged once, looked at after a reload."""
    EXITED = "exited"
    """Its writer has exited: removed ``sweep_after`` seconds after that was found."""
    UNREMOVABLE = "unremovable"
    """Its writer has exited, but it could not be removed: logged once, then left alone."""


@dataclass(frozen=True, slots=True)
class _Passed:
    verdict: Verdict
    why: str = ""  # EXITED: what the removal logs
    since: float = 0.0  # EXITED: when the writer was found gone, on the monotonic clock


class Discovery:
    """Finds processes to watch (see the module) and keeps what it has decided about them.

    Its whole state:

    - ``_refused``: processes not to watch (access denied, a channel of another user, a
      monitor that failed): logged once, looked at again after a reload;
    - ``_waiting``: processes whose channel has no metadata yet (the hook writes it right
      after the channel): given one more discovery to name their run;
    - ``_writers``: the process behind each channel file looked at, so it is found once;
    - ``_passed``: the channel files passed over, with their ``Verdict``;
    - ``_unsafe_dirs``: channel directories skipped as unsafe, logged once while they stay so;
    - ``_ticks``: discoveries since the process table was last due to be scanned;
    - ``_channel_dirs``: the channel directories found at that time.

    ``directories`` says where to look for channels, ``scan`` lists the process table;
    ``sweep_after``: seconds before the channel of an exited process is removed.
    """

    def __init__(
        self,
        directories: Callable[[Config], list[Path]],
        scan: ProcessScan,
        sweep_after: float = SWEEP_AFTER_SECONDS,
    ) -> None:
        self._directories = directories
        self._scan = scan
        self._sweep_after = sweep_after
        self._own = _own_lineage()
        self._refused: set[Key] = set()
        self._waiting: set[Key] = set()
        self._writers: dict[Path, Key] = {}
        self._passed: dict[Path, _Passed] = {}
        self._unsafe_dirs: set[Path] = set()
        self._ticks = 0
        self._channel_dirs: list[Path] = []

    def discover(self, config: Config, watched: Mapping[Key, Watching]) -> Iterator[Found]:
        """The processes to watch that are new since the last discovery.

        ``watched``: the processes watched, read as discovery goes on: a process the caller
        starts watching when it is found is not found again.
        """
        self.sweep_due()
        due = self._ticks % SCAN_EVERY_TICKS == 0
        self._ticks += 1
        if due:  # globbing every user's runtime directories costs more than listing them
            self._channel_dirs = self._directories(config)
        yield from self._discover_channels(watched)  # first: a hook names its run
        if due:
            self._forget_exited()
            yield from self._scan_processes(config, {pid for pid, _ in watched})

    def refuse(self, key: Key, reason: str | None = None) -> None:
        """Do not watch the process ``key`` (until a reload); log ``reason``, if any."""
        self._refused.add(key)
        if reason is not None:
            log.warning("not watching pid %d: %s", key[0], reason)

    def exited(self, path: Path, why: str = "its process has exited") -> None:
        """Remove the channel of a process that has exited, ``sweep_after`` seconds after it
        is first found so: nobody will write it again, but another monitor of the same job
        (``driftwatch run``, a second daemon) may still be reading its last records, which
        need the metadata beside it."""
        self._passed.setdefault(path, _Passed(Verdict.EXITED, why, time.monotonic()))
        self.sweep_due()

    def sweep_due(self) -> None:
        """Remove the exited processes' channels whose time has come.

        One that cannot be removed (e.g. a read-only mount) is logged once and left alone.
        """
        now = time.monotonic()
        for path, passed in list(self._passed.items()):
            if passed.verdict is not Verdict.EXITED:
                continue
            if now - passed.since < self._sweep_after:
                continue
            del self._passed[path]
            if remove_channel(path):
                log.info("removed %s: %s", path, passed.why)
            else:
                self._passed[path] = _Passed(Verdict.UNREMOVABLE)

    def reset(self) -> None:
        """Look again at everything refused, and scan the process table next time (after a
        reload)."""
        self._refused.clear()
        self._passed = {p: v for p, v in self._passed.items() if v.verdict is not Verdict.REFUSED}
        self._unsafe_dirs.clear()
        self._ticks = 0

    # -- by channel -----------------------------------------------------------------------

    def _discover_channels(self, watched: Mapping[Key, Watching]) -> Iterator[Found]:
        seen = {w.channel for w in watched.values()} | self._passed.keys()
        for directory in self._channel_dirs:
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
                    found = self._adopt_channel(path, owner, watched)
                    if found is not None:
                        yield found

    def _adopt_channel(
        self, path: Path, directory_owner: int, watched: Container[Key]
    ) -> Found | None:
        """The process that writes a new channel, to watch; None if the channel's writer has
        exited (the channel is then removed), if it is not the process's own (its file and
        directory must be the process user's: refused, once), or if there is nothing new."""
        key = self._writers.get(path) or self._find_writer(path, directory_owner)
        if key is None or key in watched or key in self._refused:
            return None
        try:
            target = Target.attach(key[0])
        except TargetGone:
            self.exited(path)
            return None
        except TargetAccessDenied as err:
            self.refuse(key, str(err))
            return None
        if process_key(target.pid, target.info.create_time) != key:  # the PID was reused
            self.exited(path)
            return None
        if target.info.uid != directory_owner:  # the file's owner is the directory's
            self.refuse(
                key,
                f"refusing the channel {path}: it is in a directory of uid {directory_owner}, "
                f"but process {target.pid} runs as uid {target.info.uid}",
            )
            return None
        meta = read_meta(path)
        if "run" not in meta and key not in self._waiting:
            self._waiting.add(key)  # the hook writes it right after the channel
            return None
        self._waiting.discard(key)
        run, rank = meta.get("run"), meta.get("rank")
        named = run if isinstance(run, str) else None
        ranked = rank if isinstance(rank, str) else None
        return Found(key, target, named, path, f"its channel {path}", ranked)

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
                    self._refuse_channel(
                        path,
                        f"its process (pid {writer.pid} in PID namespace {writer.namespace}) "
                        "is not in sight: it needs the host's PID namespace (hostPID) and "
                        "ptrace access (CAP_SYS_PTRACE)",
                    )
                else:
                    self.exited(path)
                return None
            key = process_key(pid, psutil.Process(pid).create_time())
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
            self._refuse_channel(path, reason)
        else:
            self.exited(path, f"no process writes it, and it is unreadable ({reason})")

    def _refuse_channel(self, path: Path, reason: str) -> None:
        self._passed[path] = _Passed(Verdict.REFUSED)
        log.warning("not watching the channel %s: %s", path, reason)

    def _forget_exited(self) -> None:
        """Forget the processes refused or waited for that have exited since, and the
        channels removed since (by us or by someone else)."""
        self._refused = {key for key in self._refused if psutil.pid_exists(key[0])}
        self._waiting = {key for key in self._waiting if psutil.pid_exists(key[0])}
        self._writers = {path: key for path, key in self._writers.items() if os.path.lexists(path)}
        self._passed = {
            path: passed
            for path, passed in self._passed.items()
            if passed.verdict is Verdict.EXITED or os.path.lexists(path)
        }

    # -- by pattern -----------------------------------------------------------------------

    def _scan_processes(self, config: Config, watched_pids: set[int]) -> Iterator[Found]:
        if not config.rules:
            return
        jobs = set(watched_pids)  # a match below one of these is part of its job
        for pid, create_time, command in self._scan():
            key = process_key(pid, create_time)
            if pid in self._own or pid in watched_pids or key in self._refused:
                continue
            rule = config.rule_for(command)
            if rule is None or descends_from(pid, jobs):
                continue
            try:
                target = Target.attach(pid)
            except TargetGone:
                continue
            except TargetAccessDenied as err:
                self.refuse(key, str(err))
                continue
            jobs.add(pid)
            yield Found(key, target, None, None, f"the pattern {rule.pattern.pattern!r}")
