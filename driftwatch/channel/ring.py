"""The ring: one shared-memory file per hooked process, from the hook to the monitor.

The in-process hook (the writer) appends fixed-size records to a memory-mapped file; the
monitor (the reader) maps the same file and copies out what is new. The writer never blocks,
takes no lock and makes no system call per record; when nobody reads, the ring simply
overwrites its oldest records, and the reader counts what it missed. This module knows
nothing about what records mean (see ``driftwatch.channel.wire``) and uses the stdlib only,
so it is safe to import inside a training process.

Where the files live and how they are named is ``driftwatch.channel.paths``'s. Next to each,
a JSON sidecar holds the writer's metadata, replaced atomically as a whole. The writer holds
a lock (``flock``) on its file as long as it lives, so anyone who can open the file can tell
an abandoned channel from a live one (``writer_alive``), whichever PID namespace its writer
is in.

The PID is the writer's own, which is not the node's when the writer runs in a container;
the header therefore also names the writer as a ``driftwatch.target.pidns.ProcessId``, which a
node agent maps to the process it sees (``driftwatch.target.pidns.find_process``).

Format, version 2, little-endian throughout::

    header, 64 bytes
       0  8s  magic b"DWCHAN1\\0"
       8  u32 version (2)
      12  u32 record size in bytes (40)
      16  u32 capacity, in records
      20  u32 writer pid, in its own PID namespace
      24  f64 writer create_time
      32  u64 write_seq: how many records the writer has started, the last perhaps unfinished
      40  u64 writer start time, in clock ticks after boot
      48  u64 inode of the writer's PID namespace
      56  reserved (zeros) up to 64
    then ``capacity`` records of 40 bytes; record number ``seq`` (1-based) is in slot
    ``(seq - 1) % capacity``:
       0  u64 seq (with bit 63 set: abandoned, the writer could not encode its values)
       8  u32 kind
      12  u32 key
      16  f64 t
      24  f64 a
      32  f64 b

To write record ``n`` the writer first sets ``write_seq`` to ``n``, announcing that the slot
of record ``n - capacity`` is being overwritten, then fills the body, then sets the record's
``seq`` to ``n`` last. The reader copies the records up to ``write_seq``, reads
``write_seq`` again, and counts as lost (never returns) every copied record that the
writer may have started to overwrite meanwhile; a record whose ``seq`` is not yet the
expected one is still being written and is retried on the next read. A lapped reader thus
gets exactly the newest ``capacity`` records.

The two ``seq`` counters are aligned 8-byte words, stored and loaded through a ``memoryview``
of unsigned 64-bit words: each access is then a single native load or store, so a counter is
never seen torn (``struct.pack_into`` would not do: it zero-fills its target before writing,
so a reader could catch ``write_seq`` at 0). Native order is the file's little-endian order
on the hosts channels support. The protocol also assumes that stores become visible in
program order, as on x86-64; on weakly ordered CPUs such as ARM a record could, rarely, be
seen before its body is complete.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import mmap
import os
import stat
import struct
import sys
from pathlib import Path
from typing import NamedTuple

from driftwatch.channel.paths import (
    ChannelError,
    channel_path,
    ensure_private_dir,
    meta_path,
    refuse_open_directory,
    remove_channel,
    runtime_dir,
    write_atomically,
)
from driftwatch.target.pidns import ProcessId, identify

log = logging.getLogger(__name__)

MAGIC = b"DWCHAN1\0"
VERSION = 2
DEFAULT_CAPACITY = 65536
MAX_META_BYTES = 1 << 20
"""A larger metadata sidecar is ignored: the reader never loads an unbounded file."""

_HEADER = struct.Struct("<8sIIIId")
_IDENTITY = struct.Struct("<QQ")  # start ticks and PID namespace, after write_seq
_BODY = struct.Struct("<IIddd")  # a record after its seq
_RECORD = struct.Struct("<QIIddd")
HEADER_SIZE = 64
WRITE_SEQ_OFFSET = 32
IDENTITY_OFFSET = 40
_WRITE_SEQ_WORD = WRITE_SEQ_OFFSET // 8
RECORD_SIZE = _RECORD.size
ABANDONED = 1 << 63
_pack_body = _BODY.pack_into


class Record(NamedTuple):
    seq: int
    kind: int
    key: int
    t: float
    a: float
    b: float


def writer_alive(path: Path) -> bool:
    """Whether a process still holds the channel ``path`` open as its writer (a process
    forked from the writer counts, until it exits too); False if the file is gone."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        return False
    except OSError as err:
        raise ChannelError(f"cannot open the channel file {path}: {err}") from err
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)  # also releases the lock, when it was taken
    return False


def read_meta(path: Path) -> dict[str, object]:
    """The metadata sidecar of the channel file ``path``; empty if missing or malformed."""
    sidecar = meta_path(path)
    try:
        with open(sidecar, "rb") as file:
            text = file.read(MAX_META_BYTES + 1)
        if len(text) > MAX_META_BYTES:
            raise ValueError(f"larger than {MAX_META_BYTES} bytes")
        meta = json.loads(text)
    except (OSError, ValueError) as err:
        log.debug("no usable channel metadata in %s: %s", sidecar, err)
        return {}
    if not isinstance(meta, dict):
        log.debug("channel metadata in %s is not an object", sidecar)
        return {}
    return meta


class ChannelWriter:
    """The hook's end: appends records to a channel file it created (see ``create``).

    Not thread-safe, by design (the hot path takes no lock): call ``write`` from one thread.
    """

    __slots__ = ("_fd", "_meta_failed", "_mm", "_seq", "_words", "capacity", "dropped", "path")

    def __init__(self, path: Path, fd: int, mm: mmap.mmap, capacity: int) -> None:
        self.path = path
        self.capacity = capacity
        self.dropped = 0  # records that could not be written (values out of range, or closed)
        self._fd = fd  # open, and locked, as long as the channel is: see ``writer_alive``
        self._mm = mm
        self._words = memoryview(mm).cast("Q")  # for the seq counters, see the module doc
        self._seq = 0
        self._meta_failed = False

    @classmethod
    def create(
        cls,
        directory: str | os.PathLike[str],
        process: ProcessId,
        create_time: float,
        capacity: int = DEFAULT_CAPACITY,
    ) -> ChannelWriter:
        """Create the channel file of ``process`` (``create_time`` as psutil says) in
        ``directory`` and map it.

        The file is built (and locked) under a hidden temporary name and renamed into place,
        so a reader never finds a half-initialised channel, nor one that looks abandoned; a
        stale file of the same name (this process re-creating its channel) is replaced.
        """
        if not 1 <= capacity <= 0xFFFFFFFF:
            raise ValueError(f"capacity must be between 1 and 2**32 - 1, not {capacity}")
        _require_little_endian()
        path = channel_path(directory, process.pid, create_time)
        temporary = path.with_name(f".{path.name}.tmp")
        size = HEADER_SIZE + capacity * RECORD_SIZE
        try:
            _refuse_foreign(path)
            _refuse_foreign(temporary)
            with contextlib.suppress(FileNotFoundError):
                os.unlink(temporary)  # left by an earlier attempt of this process
            fd = os.open(
                temporary, os.O_CREAT | os.O_EXCL | os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600
            )
        except OSError as err:
            raise ChannelError(f"cannot create the channel file {path}: {err}") from err
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            os.ftruncate(fd, size)
            mm = mmap.mmap(fd, size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
            _HEADER.pack_into(
                mm, 0, MAGIC, VERSION, RECORD_SIZE, capacity, process.pid, create_time
            )
            _IDENTITY.pack_into(mm, IDENTITY_OFFSET, process.start_ticks, process.namespace)
            os.replace(temporary, path)
        except OSError as err:
            os.close(fd)
            with contextlib.suppress(OSError):
                os.unlink(temporary)
            raise ChannelError(f"cannot create the channel file {path}: {err}") from err
        return cls(path, fd, mm, capacity)

    def write(self, kind: int, key: int, t: float, a: float = 0.0, b: float = 0.0) -> None:
        """Append one record; the hot path: no system call, no lock, never raises."""
        seq = self._seq + 1
        offset = HEADER_SIZE + (self._seq % self.capacity) * RECORD_SIZE
        words = self._words
        try:
            words[_WRITE_SEQ_WORD] = seq
            _pack_body(self._mm, offset + 8, kind, key, t, a, b)
            words[offset >> 3] = seq
        except (struct.error, TypeError, ValueError):
            self._abandon(offset, seq)
            return
        self._seq = seq

    def _abandon(self, offset: int, seq: int) -> None:
        """Give up a record whose values do not fit the format, or written after ``close``.

        Monitoring must never break training: the record is only counted in ``dropped``,
        and its slot is marked so that readers skip it instead of waiting for it.
        """
        self.dropped += 1
        self._seq = seq
        with contextlib.suppress(ValueError):  # the mapping is closed
            self._words[offset >> 3] = seq | ABANDONED

    def set_meta(self, meta: dict[str, object]) -> None:
        """Replace the metadata sidecar atomically; problems are logged once, never raised."""
        sidecar = meta_path(self.path)
        try:
            write_atomically(sidecar, json.dumps(meta, default=str))
        except (OSError, TypeError, ValueError) as err:
            if not self._meta_failed:
                self._meta_failed = True
                log.warning("driftwatch: cannot write the channel metadata %s: %s", sidecar, err)

    def close(self, unlink: bool = False) -> None:
        """Unmap the channel; with ``unlink``, also remove its files. Later writes are dropped."""
        self._words.release()
        self._mm.close()
        if unlink:
            remove_channel(self.path)
        if self._fd >= 0:  # last: the channel looks abandoned from here on
            os.close(self._fd)
            self._fd = -1


class NullWriter:
    """Stands in for a ``ChannelWriter`` when no channel could be opened: does nothing."""

    path: Path | None = None

    def write(self, kind: int, key: int, t: float, a: float = 0.0, b: float = 0.0) -> None:
        pass

    def set_meta(self, meta: dict[str, object]) -> None:
        pass

    def close(self, unlink: bool = False) -> None:
        pass


def open_writer(
    pid: int, create_time: float, directory: str | os.PathLike[str] | None = None
) -> ChannelWriter | NullWriter:
    """The channel writer of process ``pid`` (this one, its caller's own), or a ``NullWriter``
    (with one warning) if impossible.

    Never raises: a monitoring problem must not disturb training.
    """
    try:
        process = identify(pid)
        private = ensure_private_dir(runtime_dir() if directory is None else directory)
        return ChannelWriter.create(private, process, create_time)
    except (ChannelError, OSError) as err:
        log.warning("driftwatch: monitoring channel disabled, records are not sent: %s", err)
        return NullWriter()


def _require_little_endian() -> None:
    if sys.byteorder != "little":
        raise ChannelError("driftwatch channels need a little-endian host")


def _refuse_foreign(path: Path) -> None:
    """Raise ``ChannelError`` if a file at ``path``, which we are about to replace, is not ours."""
    try:
        owner = os.lstat(path).st_uid
    except FileNotFoundError:
        return
    if owner != os.geteuid():
        raise ChannelError(f"{path} exists and belongs to uid {owner}; remove it")


class ChannelReader:
    """The monitor's end: copies out the records written since the last ``read``."""

    def __init__(
        self, path: Path, mm: mmap.mmap, capacity: int, process: ProcessId, create_time: float
    ) -> None:
        self.path = path
        self.capacity = capacity
        self.process = process  # the writer, as it named itself in the header
        self.create_time = create_time
        self.lost_total = 0
        self._mm = mm
        self._words = memoryview(mm).cast("Q")  # for the seq counters, see the module doc
        # Start with the oldest record still in the ring: what was overwritten before this
        # reader existed was not lost by it.
        self._next = max(1, self._head() - capacity + 1)  # seq of the next record to return

    @classmethod
    def open(cls, path: str | os.PathLike[str], owner: int | None = None) -> ChannelReader:
        """Map the channel file ``path`` read-only, after checking it is a safe, valid channel.

        The file must belong to ``owner`` (by default this user; a privileged monitor passes
        its target's) and sit in a directory not open to every user without the sticky bit.
        """
        path = Path(path)
        _require_little_endian()
        fd = _open_channel_file(path)
        try:
            size = _checked_size(path, fd, os.geteuid() if owner is None else owner)
            mm = mmap.mmap(fd, size, mmap.MAP_SHARED, mmap.PROT_READ)
        except OSError as err:
            raise ChannelError(f"cannot map the channel file {path}: {err}") from err
        finally:
            os.close(fd)
        magic, version, record_size, capacity, pid, create_time = _HEADER.unpack_from(mm, 0)
        ticks, namespace = _IDENTITY.unpack_from(mm, IDENTITY_OFFSET)
        problem = _header_problem(magic, version, record_size, capacity, size)
        if problem is not None:
            mm.close()
            raise ChannelError(f"{path}: {problem}")
        return cls(path, mm, capacity, ProcessId(pid, ticks, namespace), create_time)

    def _head(self) -> int:
        """``write_seq``: the newest record the writer has started (perhaps not finished)."""
        seq: int = self._words[_WRITE_SEQ_WORD]
        return seq

    def read(self) -> tuple[list[Record], int]:
        """The records written since the previous read, in order, and how many were lost.

        Lost records are those the writer overwrote before they were read; reading goes on
        from the oldest record still in the ring. Records the writer abandoned are skipped.
        """
        head = self._head()
        first = max(self._next, head - self.capacity + 1)
        lost = first - self._next
        count = head - first + 1
        if count <= 0:
            self.lost_total += lost
            return [], lost
        slot = (first - 1) % self.capacity
        start = HEADER_SIZE + slot * RECORD_SIZE
        end = start + count * RECORD_SIZE
        if slot + count <= self.capacity:
            data = self._mm[start:end]
        else:  # wraps around the end of the ring
            data = self._mm[start:] + self._mm[HEADER_SIZE : end - self.capacity * RECORD_SIZE]
        # The writer may have started to overwrite any record it has announced since.
        oldest_intact = self._head() - self.capacity + 1
        records = []
        expected = first
        for fields in _RECORD.iter_unpack(data):
            if expected < oldest_intact:
                lost += 1
            elif fields[0] == expected:
                records.append(Record._make(fields))
            elif fields[0] != expected | ABANDONED:
                break  # announced but not complete yet: retry it next time
            expected += 1
        self._next = expected
        self.lost_total += lost
        return records, lost

    def meta(self) -> dict[str, object]:
        """The writer's metadata sidecar; empty if missing or malformed."""
        return read_meta(self.path)

    def close(self) -> None:
        self._words.release()
        self._mm.close()


def _open_channel_file(path: Path) -> int:
    """A read-only descriptor of ``path``, refused in an open directory or through a link."""
    try:
        refuse_open_directory(path.parent)
        return os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except FileNotFoundError as err:
        raise ChannelError(f"no channel file {path} (is the hook running?)") from err
    except OSError as err:
        if os.path.islink(path):
            raise ChannelError(f"channel file {path} is a symbolic link; refusing it") from err
        raise ChannelError(f"cannot open the channel file {path}: {err}") from err


def _checked_size(path: Path, fd: int, owner: int) -> int:
    """The size of the open channel file, once it is known to be a regular file of ``owner``
    long enough for a header; ``ChannelError`` otherwise."""
    info = os.fstat(fd)
    if not stat.S_ISREG(info.st_mode):
        raise ChannelError(f"{path} is not a regular file")
    if info.st_uid != owner:
        raise ChannelError(
            f"channel file {path} is owned by uid {info.st_uid}, not by the watched "
            f"process's user (uid {owner}); refusing it"
        )
    if info.st_size < HEADER_SIZE:
        raise ChannelError(f"{path} is not a driftwatch channel (too short)")
    return info.st_size


def _header_problem(
    magic: bytes, version: int, record_size: int, capacity: int, size: int
) -> str | None:
    """What makes a channel's header unreadable by this driftwatch (``None``: nothing)."""
    if magic != MAGIC:
        return "not a driftwatch channel (bad magic)"
    if version != VERSION or record_size != RECORD_SIZE:
        return (
            f"channel format version {version} with {record_size}-byte records; "
            f"this driftwatch reads version {VERSION} ({RECORD_SIZE}-byte records)"
        )
    if capacity < 1 or size != HEADER_SIZE + capacity * RECORD_SIZE:
        return f"size {size} does not match its capacity of {capacity} records"
    return None
