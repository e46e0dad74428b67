"""Where channels live and what they are called: the one place that derives a channel's path.

Files live in a private directory (``runtime_dir()``, mode 0700, refused if anyone else can
get in, or if it sits in a directory anyone may write to without the sticky bit) and are
named ``<pid>-<round(create_time * 100)>.dwc`` with ``create_time`` as psutil
reports it, so a monitor that knows ``(pid, create_time)`` of its target finds the right file
and a reused PID never matches an old one. Next to each, ``<same stem>.json`` holds the
writer's metadata, replaced atomically as a whole; ``<same stem>.request`` the monitor's
request for a profiler trace, and ``<same stem>.traces/`` the traces the hook wrote
(``driftwatch.channel.requests``).

The writer finds its directory with ``runtime_dir()`` and names its file with
``channel_path``; a monitor finds a target's file with ``process_channel``, and a node agent
lists every user's directories with ``channel_dirs``.
"""

from __future__ import annotations

import contextlib
import glob
import logging
import os
import re
import shutil
import stat
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path

from driftwatch.channel.env import RUNTIME_DIR_ENV, SHARED_DIR_ENV
from driftwatch.errors import DriftwatchError

log = logging.getLogger(__name__)

SUFFIX = ".dwc"
META_SUFFIX = ".json"
REQUEST_SUFFIX = ".request"
"""The monitor's capture request beside a channel (``<same stem>.request``, JSON)."""
TRACES_SUFFIX = ".traces"
"""The directory beside a channel where the hook writes the profiler traces it was asked for."""

_NAME = re.compile(r"^(\d+)-(\d+)" + re.escape(SUFFIX) + "$")


class ChannelError(DriftwatchError):
    """A channel file or its directory cannot be used (missing, unsafe, not a channel)."""


def stamp(create_time: float) -> int:
    """A process's ``create_time`` (unix seconds) as its channel's name carries it, in
    hundredths of a second."""
    return round(create_time * 100)


def runtime_dir(environ: Mapping[str, str] | None = None, uid: int | None = None) -> Path:
    """Where a process keeps its channel: ``$DRIFTWATCH_RUNTIME_DIR``,
    ``$DRIFTWATCH_SHARED_DIR/UID``, ``$XDG_RUNTIME_DIR/driftwatch`` or ``/tmp/driftwatch-UID``.

    ``DRIFTWATCH_SHARED_DIR`` names a directory that every user may create their own
    directory in, as in ``/tmp`` (mode 1777, or root's when every job runs as root): the one
    that containers share with a node agent (see ``deploy/kubernetes``). By default for this
    process; a monitor passes its target's environment and user.
    """
    environ = os.environ if environ is None else environ
    uid = os.getuid() if uid is None else uid
    explicit = environ.get(RUNTIME_DIR_ENV)
    if explicit:
        return Path(explicit)
    shared = environ.get(SHARED_DIR_ENV)
    if shared:
        return Path(shared) / str(uid)
    xdg = environ.get("XDG_RUNTIME_DIR")
    if xdg:
        return Path(xdg) / "driftwatch"
    return Path(f"/tmp/driftwatch-{uid}")


def channel_dirs(extra: Sequence[Path], environ: Mapping[str, str] | None = None) -> list[Path]:
    """Where hooked processes keep their channels: ``extra``, ``$DRIFTWATCH_RUNTIME_DIR``,
    every user's directory in ``$DRIFTWATCH_SHARED_DIR``, and every user's default runtime
    directories (``/tmp/driftwatch-UID``, ``/run/user/UID/driftwatch``)."""
    environ = os.environ if environ is None else environ
    found = [*extra]
    if environ.get(RUNTIME_DIR_ENV):
        found.append(Path(environ[RUNTIME_DIR_ENV]))
    if environ.get(SHARED_DIR_ENV):
        shared = glob.escape(environ[SHARED_DIR_ENV])
        found += map(Path, sorted(glob.glob(f"{shared}/[0-9]*")))
    found += map(Path, sorted(glob.glob("/tmp/driftwatch-[0-9]*")))
    found += map(Path, sorted(glob.glob("/run/user/[0-9]*/driftwatch")))
    return list(dict.fromkeys(found))


def channel_path(directory: str | os.PathLike[str], pid: int, create_time: float) -> Path:
    """The channel file of the process ``(pid, create_time)``."""
    return Path(directory) / f"{pid}-{stamp(create_time)}{SUFFIX}"


def process_channel(
    pid: int, create_time: float, environ: Mapping[str, str], uid: int, root: str = ""
) -> Path:
    """The channel file that the hook of process ``(pid, create_time)`` creates, given its
    environment and user, as this process reaches it: ``root`` is prefixed to the path
    (``/proc/PID/root`` for a process in another mount namespace, whose ``pid`` is then the
    one it sees itself by)."""
    return channel_path(f"{root}{runtime_dir(environ, uid)}", pid, create_time)


def meta_path(path: Path) -> Path:
    """The metadata sidecar of the channel file ``path``."""
    return path.with_suffix(META_SUFFIX)


def request_path(path: Path) -> Path:
    """The capture request beside the channel file ``path`` (monitor to hook)."""
    return path.with_suffix(REQUEST_SUFFIX)


def traces_dir(path: Path) -> Path:
    """Where the hook of the channel file ``path`` writes the traces it was asked for: one
    TensorBoard logdir per request, ``<traces_dir>/<request id>/plugins/profile/...``."""
    return path.with_suffix(TRACES_SUFFIX)


def write_atomically(path: Path, text: str, mode: int | None = None) -> None:
    """Replace ``path`` with ``text`` in one step, so a reader sees the old file or the new one
    and never part of one: written beside it under a hidden name, then renamed over it.

    ``mode`` sets the new file's permissions (a temporary file is made 0600). ``OSError`` when
    it cannot be written; the temporary file is removed then.
    """
    fd, temporary = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as out:
            out.write(text)
        if mode is not None:
            os.chmod(temporary, mode)
        os.replace(temporary, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temporary)
        raise


def list_channels(directory: str | os.PathLike[str]) -> list[tuple[int, float, Path]]:
    """``(pid, create_time, path)`` of every channel file in ``directory``, by pid."""
    directory = Path(directory)
    try:
        names = os.listdir(directory)
    except FileNotFoundError:
        return []
    except OSError as err:
        raise ChannelError(f"cannot list the channel directory {directory}: {err}") from err
    found = []
    for name in names:
        match = _NAME.match(name)
        if match:
            found.append((int(match.group(1)), int(match.group(2)) / 100, directory / name))
    return sorted(found)


def remove_channel(path: Path) -> bool:
    """Remove a channel, its metadata, its capture request and the traces left beside it,
    e.g. once its writer has exited; logs failures.

    Returns whether the channel and its metadata are gone.
    """
    shutil.rmtree(traces_dir(path), ignore_errors=True)
    with contextlib.suppress(OSError):
        os.unlink(request_path(path))
    removed = True
    for part in (path, meta_path(path)):
        try:
            os.unlink(part)
        except FileNotFoundError:
            pass
        except OSError as err:
            log.warning("driftwatch: cannot remove %s: %s", part, err)
            removed = False
    return removed


def ensure_private_dir(path: str | os.PathLike[str]) -> Path:
    """Create ``path`` (mode 0700) if needed and check that only this user can get into it.

    Refuses what ``check_private_dir`` refuses, and a directory whose parent anyone may
    write to without the sticky bit, where it could be swapped as a whole: anyone else who
    can write there could plant or swap a channel file.
    """
    directory = Path(path)
    try:
        directory.parent.mkdir(parents=True, exist_ok=True)
        refuse_open_directory(directory.parent)
        try:
            os.mkdir(directory, 0o700)
            os.chmod(directory, 0o700)  # the umask may have removed owner bits
        except FileExistsError:
            pass
    except OSError as err:
        raise ChannelError(f"cannot create the channel directory {directory}: {err}") from err
    check_private_dir(directory, os.geteuid())
    return directory


def check_private_dir(directory: Path, uid: int | None = None) -> int:
    """Check that ``directory`` is a real directory only its owner can enter; its owner's uid.

    Refuses a symlink, a directory of another user than ``uid`` (when given), or one that
    group or others can enter.
    """
    try:
        info = os.lstat(directory)
    except OSError as err:
        raise ChannelError(f"cannot read the channel directory {directory}: {err}") from err
    if stat.S_ISLNK(info.st_mode):
        raise ChannelError(
            f"channel directory {directory} is a symbolic link; remove it or point "
            "DRIFTWATCH_RUNTIME_DIR at a real directory"
        )
    if not stat.S_ISDIR(info.st_mode):
        raise ChannelError(f"channel directory {directory} exists but is not a directory")
    if uid is not None and info.st_uid != uid:
        raise ChannelError(
            f"channel directory {directory} belongs to uid {info.st_uid}, not to this user "
            f"(uid {uid}); remove it or set DRIFTWATCH_RUNTIME_DIR"
        )
    if info.st_mode & 0o077:
        raise ChannelError(
            f"channel directory {directory} is open to other users "
            f"(mode {stat.S_IMODE(info.st_mode):04o}); run: chmod 700 {directory}"
        )
    return info.st_uid


def refuse_open_directory(directory: Path) -> None:
    """Raise ``ChannelError`` if anyone may write to ``directory`` and its sticky bit is off:
    there, anyone could rename or replace the files and directories it holds."""
    mode = os.stat(directory).st_mode
    if mode & stat.S_IWOTH and not mode & stat.S_ISVTX:
        raise ChannelError(
            f"{directory} is writable by every user and lacks the sticky bit "
            f"(mode {stat.S_IMODE(mode):04o}), so anyone could replace channel files there; "
            f"run: chmod +t {directory}, or set DRIFTWATCH_RUNTIME_DIR"
        )
