"""The watched process, identified by ``(pid, create_time)`` so that PID reuse is detected."""

from __future__ import annotations

import functools
import math
import os
import re
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import psutil

from driftwatch.errors import TargetGone, TargetNotWatchable, TargetZombie
from driftwatch.target.access import denied, is_kernel_thread, no_such_process
from driftwatch.target.pidns import innermost_pid, start_ticks

_SECRET_WORD = (
    r"(?:pass(?:word|wd|phrase)?|secret|token|api[_-]?key|access[_-]?key|private[_-]?key"
    r"|credentials?|authorization)"
)
_SECRET_FLAG = re.compile(rf"^(-{{1,2}}[\w.-]*{_SECRET_WORD}[\w.-]*)(=|$)", re.IGNORECASE)
_SECRET_ASSIGNMENT = re.compile(rf"^([A-Za-z_][\w.]*{_SECRET_WORD}\w*)=", re.IGNORECASE)
"""``NAME=value`` as ``env`` and shells pass environment variables, e.g. ``AWS_SECRET=x``."""
_URL_USERINFO = re.compile(r"\b([a-z][a-z0-9+.-]*://)[^/\s@]+@", re.IGNORECASE)
_SECRET_QUERY = re.compile(rf"([?&][\w.-]*{_SECRET_WORD}[\w.-]*=)[^&#\s]*", re.IGNORECASE)
HIDDEN = "***"


def _redact_inline(arg: str) -> str:
    """``arg`` with credentials in URLs (``user:pass@``, ``?token=``) replaced."""
    arg = _URL_USERINFO.sub(rf"\1{HIDDEN}@", arg)
    return _SECRET_QUERY.sub(rf"\1{HIDDEN}", arg)


def redact_command(argv: list[str]) -> list[str]:
    """The command line with secret-looking values replaced by ``***``.

    Covers ``--password=x`` and ``--token x`` style flags (any flag naming a password,
    secret, token, API or access key, or credentials), ``NAME_SECRET=x`` environment
    assignments, and credentials in URLs (``scheme://user:pass@host``, ``?api_key=x``).
    """
    redacted: list[str] = []
    hide_next = False
    for arg in argv:
        if hide_next:
            redacted.append(HIDDEN)
            hide_next = False
            continue
        flag = _SECRET_FLAG.match(arg)
        assignment = _SECRET_ASSIGNMENT.match(arg)
        if flag and flag.group(2) == "=":
            redacted.append(f"{flag.group(1)}={HIDDEN}")
        elif flag:
            redacted.append(arg)
            hide_next = True
        elif assignment:
            redacted.append(f"{assignment.group(1)}={HIDDEN}")
        else:
            redacted.append(_redact_inline(arg))
    return redacted


def default_run_name(argv: list[str], process_name: str) -> str:
    """A short, stable name for the run: the training script's name, else the program's."""
    for arg in argv[1:]:
        if arg.endswith(".py"):
            return os.path.splitext(os.path.basename(arg))[0]
    if len(argv) >= 3 and argv[1] == "-m":
        return argv[2].rsplit(".", 1)[-1]
    return process_name


DELETED = " (deleted)"
"""What the kernel appends to the link of an open file that has been unlinked."""
LINKS_REREAD_SECONDS = 10.0
"""Seconds between two reads of every descriptor's link by ``open_paths`` (as often as the
event-file source walks the logdirs); in between only new descriptor numbers are read."""
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
"""Units of the times in ``/proc/PID/stat``, per second."""
PAGE_BYTES = os.sysconf("SC_PAGE_SIZE")
"""Bytes in a memory page (the unit of ``/proc/PID/statm``)."""
STOPPED_STATES = (b"T", b"t")
"""States of ``/proc/PID/stat`` of a stopped process: by a signal, by a tracer."""
PROC_READ_BYTES = 16384
"""Bytes asked for in one read of a small ``/proc`` file (``status``, the largest read each
tick, holds about 1.5 KB; ``stat`` at most 52 numbers and a 64-byte name)."""


def read_proc_file(path: str) -> bytes:
    """A small ``/proc`` file in one read, without a file object (a tick reads several per
    target, a process-table scan one per process); its ``OSError`` as raised."""
    fd = os.open(path, os.O_RDONLY)
    try:
        return os.read(fd, PROC_READ_BYTES)
    finally:
        os.close(fd)


@dataclass(frozen=True, slots=True)
class ProcStat:
    """What one read of ``/proc/PID/stat`` (and of ``statm``) says about a live target."""

    cpu_seconds: float
    """User + system CPU time, in seconds."""
    threads: int
    rss_bytes: float
    """Resident set size (NaN when not read), from ``statm`` as psutil's
    ``memory_info().rss`` (``stat``'s own field may leave out anonymous pages not yet summed
    from per-CPU counters)."""
    stopped: bool = False
    """Stopped (state ``T``: SIGSTOP, SIGTSTP; ``t``: held by a tracer): it runs nothing."""


def is_stopped(pid: int) -> bool:
    """Whether process ``pid`` is stopped now (``STOPPED_STATES``); False if it cannot be read."""
    try:
        stat = read_proc_file(f"/proc/{pid}/stat")
    except OSError:
        return False
    return stat[stat.rindex(b")") + 2 :][:1] in STOPPED_STATES


def exited(pid: int) -> TargetGone:
    """The error for a process that has exited, saying so when its PID already belongs to
    another process (a monitor that checked it alive may find the newcomer a moment later)."""
    detail = " (its PID now belongs to another process)" if psutil.pid_exists(pid) else ""
    return TargetGone(pid, f"process {pid} has exited{detail}")


@contextmanager
def translate_psutil(pid: int, what: str) -> Iterator[None]:
    """Turn psutil's exceptions about ``pid`` into driftwatch's."""
    try:
        yield
    except psutil.ZombieProcess as err:
        raise TargetZombie(
            pid, f"process {pid} has exited (zombie: its parent has not reaped it yet)"
        ) from err
    except psutil.NoSuchProcess as err:
        raise exited(pid) from err
    except psutil.AccessDenied as err:
        raise denied(pid, what) from err


@dataclass(frozen=True, slots=True)
class TargetInfo:
    pid: int
    create_time: float
    name: str
    command: tuple[str, ...]  # redacted
    username: str
    uid: int


def _refuse_kernel_thread(pid: int) -> None:
    """``TargetNotWatchable`` if ``pid`` is a kernel thread: it runs no program to watch."""
    try:
        stat = read_proc_file(f"/proc/{pid}/stat")
    except OSError:
        return  # gone: the checks that follow say so
    if is_kernel_thread(stat):
        name = stat[stat.index(b"(") + 1 : stat.rindex(b")")].decode(errors="replace")
        raise TargetNotWatchable(
            pid, f"process {pid} ({name}) is a kernel thread: it runs no program to watch"
        )


class Target:
    """A live process that driftwatch may read.

    Build one with ``Target.attach(pid)``: it checks the process exists, is not a zombie, and
    that driftwatch may read what the sources need, so those problems surface before
    monitoring starts instead of as a silent gap later.
    """

    def __init__(self, process: psutil.Process, info: TargetInfo, start_ticks: int) -> None:
        """``start_ticks``: when the process started, in clock ticks after boot (the
        ``starttime`` of ``/proc/PID/stat``, from which psutil derives ``create_time``)."""
        self.process = process
        self.info = info
        self._start_ticks = start_ticks
        self._stat_path = f"/proc/{info.pid}/stat"
        self._statm_path = f"/proc/{info.pid}/statm"
        self._links: dict[str, str] = {}  # what each descriptor's link read, by its number
        self._links_read_at = -math.inf  # when every link was last read (monotonic)
        self._open_paths: list[str] = []  # what open_paths last listed

    @property
    def pid(self) -> int:
        return self.info.pid

    @functools.cached_property
    def root(self) -> str:
        """``/proc/PID/root`` if the process lives in another mount namespace (a container)
        than driftwatch, else ``""``: its paths, prefixed with it, name its files here. Also
        ``""`` when that cannot be read: its files then fail to open, one by one."""
        try:
            theirs = os.stat(f"/proc/{self.pid}/ns/mnt").st_ino
            ours = os.stat("/proc/self/ns/mnt").st_ino
        except OSError:
            return ""
        return "" if theirs == ours else f"/proc/{self.pid}/root"

    @functools.cached_property
    def own_pid(self) -> int:
        """Its PID in its own PID namespace (a container's): the one its hook names its
        channel by."""
        try:
            return innermost_pid(self.pid)
        except OSError as err:
            raise exited(self.pid) from err

    @classmethod
    def attach(cls, pid: int) -> Target:
        if pid <= 0:
            raise TargetGone(pid, f"no process with PID {pid}")
        try:
            process = psutil.Process(pid)
        except psutil.NoSuchProcess as err:
            raise TargetGone(pid, no_such_process(pid)) from err
        _refuse_kernel_thread(pid)
        with translate_psutil(pid, "the process status"):
            if process.status() == psutil.STATUS_ZOMBIE:
                raise TargetZombie(
                    pid, f"process {pid} has exited (zombie: its parent has not reaped it yet)"
                )
            with process.oneshot():
                name = process.name()
                create_time = process.create_time()
                username = process.username()
                uid = process.uids().real
        with translate_psutil(pid, "the command line"):
            argv = process.cmdline()
        # What the process and event-file sources need; unreadable only for another user's
        # process without privileges, where failing now with the hint beats empty graphs.
        with translate_psutil(pid, "the I/O counters (/proc/PID/io)"):
            process.io_counters()
        # Read after psutil's create_time; the PID then still naming the process psutil read
        # means it named it in between too.
        try:
            ticks = start_ticks(pid)
        except OSError as err:
            raise exited(pid) from err
        with translate_psutil(pid, "the process status"):
            if not process.is_running():
                raise exited(pid)
        info = TargetInfo(pid, create_time, name, tuple(redact_command(argv)), username, uid)
        target = cls(process, info, ticks)
        target.open_paths()
        return target

    def check_alive(self) -> None:
        """Raise ``TargetGone`` if the process exited, became a zombie, or its PID was reused."""
        self.read_stat()

    def read_stat(self, rss: bool = True) -> ProcStat:
        """The process's CPU time, threads and resident memory, from one read each of
        ``/proc/PID/stat`` and ``statm`` (``rss`` false: ``statm`` is not read and
        ``rss_bytes`` is NaN); the first says whether it is still alive
        (``TargetGone`` if it exited or its PID now belongs to a process with another start
        time, ``TargetZombie`` if its parent has not reaped it yet)."""
        try:
            stat = read_proc_file(self._stat_path)
        except (FileNotFoundError, ProcessLookupError) as err:
            raise exited(self.pid) from err
        except PermissionError as err:
            raise denied(self.pid, "the process status (/proc/PID/stat)") from err
        # The command name, in parentheses, may hold spaces and parentheses itself; fields
        # from the state on (man 5 proc's 3rd): state, ..., utime 14, stime 15, threads 20,
        # starttime 22.
        fields = stat[stat.rindex(b")") + 2 :].split(maxsplit=20)
        if int(fields[19]) != self._start_ticks:
            raise exited(self.pid)
        if fields[0] == b"Z":
            raise TargetZombie(self.pid, f"process {self.pid} has exited")
        cpu_seconds = (int(fields[11]) + int(fields[12])) / CLOCK_TICKS
        stopped = fields[0] in STOPPED_STATES
        if not rss:
            return ProcStat(cpu_seconds, int(fields[17]), math.nan, stopped)
        try:
            resident = int(read_proc_file(self._statm_path).split(maxsplit=2)[1])
        except (FileNotFoundError, ProcessLookupError) as err:
            raise exited(self.pid) from err
        return ProcStat(cpu_seconds, int(fields[17]), resident * PAGE_BYTES, stopped)

    def environ(self) -> dict[str, str]:
        """The process's environment (needs the same access as its open files)."""
        with translate_psutil(self.pid, "the environment (/proc/PID/environ)"):
            return self.process.environ()

    def open_paths(self) -> list[str]:
        """Paths of the files the process has open (sockets, pipes and deleted files left out),
        as this process can open them: under ``/proc/PID/root`` for a process in another
        mount namespace (a container), whose own paths mean nothing here.

        Only reads the links in ``/proc/PID/fd``: psutil's ``open_files`` also reads every
        descriptor's ``fdinfo``, which cost more than the rest of a monitor's tick. The
        directory is listed only when the count of descriptors (its size, on Linux 6.2 and
        later) has changed since the previous call, and a link read only when its descriptor
        number is new; all of them are listed and read each ``LINKS_REREAD_SECONDS``: a file
        opened under the number of one closed between two calls is found then.
        """
        fd_dir = f"/proc/{self.pid}/fd"
        now = time.monotonic()
        reread = now - self._links_read_at >= LINKS_REREAD_SECONDS
        try:
            count = os.stat(fd_dir).st_size
            if count and count == len(self._links) and not reread:
                return self._open_paths
            fds = os.listdir(fd_dir)
        except FileNotFoundError as err:
            raise exited(self.pid) from err
        except PermissionError as err:
            raise denied(self.pid, "the open files (/proc/PID/fd)") from err
        known = self._links
        if reread:
            known, self._links_read_at = {}, now
        links: dict[str, str] = {}
        paths = []
        for fd in fds:
            path = known.get(fd)
            if path is None:
                try:
                    path = os.readlink(f"{fd_dir}/{fd}")
                except FileNotFoundError:
                    continue  # closed since the listing
                except PermissionError as err:
                    raise denied(self.pid, "the open files (/proc/PID/fd)") from err
            links[fd] = path
            if path.startswith("/") and not path.endswith(DELETED):
                paths.append(self.root + path)
        self._links = links
        self._open_paths = paths
        return paths
