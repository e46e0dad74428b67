"""Event-file source: size, step progress and non-finite scalars of TensorBoard event files.

Files are found among the target's open files (every tick) and under the given logdirs
(re-walked every ``rescan_seconds``), then tailed incrementally: driftwatch reads the
TFRecord framing itself and parses each record with tensorboard's event protos and
migrations. tensorboard is imported lazily and forced onto its pure-Python TensorFlow stub,
so watching a run never imports TensorFlow into driftwatch.

Reading the framing here, rather than with tensorboard's loader, is what makes corrupt files
survivable: that loader retries a record whose checksum fails forever, so nothing after it
in the file would ever be read. Here a record whose data fails its checksum is skipped (its
length was intact), and a file whose length field fails its checksum is no longer read
(nothing after it can be found reliably); either is logged once per file. A record not yet
completely written is retried on the next read.
"""

from __future__ import annotations

import contextlib
import functools
import heapq
import logging
import math
import os
import struct
import sys
import time
import types
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

from driftwatch.errors import SourceUnavailable, TargetAccessDenied
from driftwatch.series import Sample

log = logging.getLogger(__name__)

EVENT_FILE_PREFIX = "events.out.tfevents."

_NOTF = "tensorboard.compat.notf"
"""A module tensorboard looks for: if importable, ``tensorboard.compat.tf`` is its stub."""

_MISSING = (
    "tensorboard is not installed (pip install 'driftwatch[tf]'): event files are not monitored"
)


@dataclass(frozen=True, slots=True)
class _Tensorboard:
    """The parts of tensorboard this source uses."""

    version: str
    masked_crc32c: Callable[[bytes], int]  # TFRecord's checksum
    parse: Callable[[bytes, dict[str, Any]], Iterator[Any]]  # record -> migrated events
    make_ndarray: Callable[[Any], Any]
    scalar_class: int  # SummaryMetadata.data_class of scalar summaries
    decode_error: type[Exception]  # what parsing a record that is no event raises


@functools.cache
def _tensorboard() -> _Tensorboard:
    """Import tensorboard's loader on its TensorFlow stub; ``SourceUnavailable`` if missing."""
    try:
        import tensorboard

        # Before ``tensorboard.compat.tf`` is first resolved: else it imports TensorFlow.
        sys.modules.setdefault(_NOTF, types.ModuleType(_NOTF))
        from google.protobuf.message import DecodeError
        from tensorboard import data_compat, dataclass_compat
        from tensorboard.compat.proto import event_pb2, summary_pb2
        from tensorboard.compat.tensorflow_stub.pywrap_tensorflow import masked_crc32c
        from tensorboard.util import tensor_util
    except ImportError as err:
        if err.name == "tensorboard":
            raise SourceUnavailable(_MISSING) from err
        raise SourceUnavailable(
            f"tensorboard's event-file loader cannot be imported ({err}): "
            "event files are not monitored"
        ) from err

    def parse(record: bytes, initial_metadata: dict[str, Any]) -> Iterator[Any]:
        """What ``EventFileLoader`` does to each record, for readers of raw records."""
        event = data_compat.migrate_event(event_pb2.Event.FromString(record))
        yield from dataclass_compat.migrate_event(event, initial_metadata)

    return _Tensorboard(
        version=str(tensorboard.__version__),
        masked_crc32c=masked_crc32c,
        parse=parse,
        make_ndarray=tensor_util.make_ndarray,
        scalar_class=int(summary_pb2.DATA_CLASS_SCALAR),
        decode_error=DecodeError,
    )


def describe() -> tuple[bool, str]:
    """For ``driftwatch doctor``: whether event files can be read, and with what."""
    try:
        tb = _tensorboard()
    except SourceUnavailable as err:
        return False, str(err)
    return True, f"tensorboard {tb.version} (pure-Python event-file reader, no TensorFlow)"


class _Scalar(NamedTuple):
    wall_time: float
    step: int
    value: float
    key: tuple[str, str]  # (directory, tag): train/ and validation/ are separate series


class StepProgress:
    """Training progress from scalar events fed in wall-time order.

    Follows the highest step seen. Only the tag that raises it yields a duration, measured
    from that same tag's previous event: so tags at the same step add nothing, and
    epoch-numbered tags (lower steps) never mix with global-step tags.
    """

    def __init__(self) -> None:
        self.nonfinite = 0
        self.top: tuple[int, float] | None = None  # highest step, wall time first logged
        self._last: dict[tuple[str, str], tuple[int, float]] = {}  # key -> (step, wall time)

    def feed(self, scalar: _Scalar) -> float | None:
        """Seconds per step if ``scalar`` advances the highest step, else None."""
        if not math.isfinite(scalar.value):
            self.nonfinite += 1
        previous = self._last.get(scalar.key)
        self._last[scalar.key] = (scalar.step, scalar.wall_time)
        if self.top is not None and scalar.step <= self.top[0]:
            return None
        self.top = (scalar.step, scalar.wall_time)
        if previous is None:  # else its step is below the old top, so below this one
            return None
        seconds = (scalar.wall_time - previous[1]) / (scalar.step - previous[0])
        return seconds if seconds > 0 else None


_LENGTH = struct.Struct("<QI")  # a record's length and the length's masked CRC-32C
_DATA_CRC = struct.Struct("<I")


class _Records:
    """The TFRecords of one file, read from where the last read stopped (``offset``)."""

    def __init__(self, tb: _Tensorboard, path: str) -> None:
        self.path = path
        self.offset = 0  # just past the last whole record
        self._crc = tb.masked_crc32c
        self._skipped = False  # a record was skipped: warned
        self.broken = False  # the framing was lost: the file is not read any more

    def __iter__(self) -> Iterator[bytes]:
        """Whole records after ``offset``, each once; ``OSError`` if the file cannot be read."""
        if self.broken:
            return
        with open(self.path, "rb") as file:
            size = os.fstat(file.fileno()).st_size
            file.seek(self.offset)
            while self.offset + _LENGTH.size <= size:
                header = file.read(_LENGTH.size)
                length, length_crc = _LENGTH.unpack(header)
                if self._crc(header[:8]) != length_crc:
                    self.broken = True
                    log.warning(
                        "event file %s is corrupt at byte %d (a record's length fails its "
                        "checksum): nothing after it can be read; the file is no longer read",
                        self.path,
                        self.offset,
                    )
                    return
                end = self.offset + _LENGTH.size + length + _DATA_CRC.size
                if end > size:
                    return  # not completely written yet
                data = file.read(length)
                (data_crc,) = _DATA_CRC.unpack(file.read(_DATA_CRC.size))
                self.offset = end
                if self._crc(data) == data_crc:
                    yield data
                elif not self._skipped:
                    self._skipped = True
                    log.warning(
                        "event file %s: a record fails its checksum and is skipped "
                        "(further corrupt records of this file are skipped silently)",
                        self.path,
                    )


class _Tail:
    """One event file read incrementally: its records as parsed, migrated events."""

    def __init__(self, tb: _Tensorboard, path: str) -> None:
        self.path = path
        self._tb = tb
        self._dir = os.path.dirname(path)
        self.records = _Records(tb, path)
        self._metadata: dict[str, Any] = {}  # tensorboard's per-file migration state
        # Tags whose first event said "scalar": later events of a tag carry no metadata.
        self._scalar_tags: set[str] = set()

    def events(self) -> Iterator[Any]:
        """Events appended since the last call; a record that is no event is skipped."""
        try:
            for record in self.records:
                try:
                    yield from self._tb.parse(record, self._metadata)
                except self._tb.decode_error as err:
                    log.debug("skipped a record of %s that is no event: %s", self.path, err)
        except OSError as err:  # deleted or unreadable: dropped once its size says so
            log.debug("stopped reading %s: %s", self.path, err)

    def scalars(self, deadline: float) -> Iterator[_Scalar]:
        """Scalars appended since the last call, until the end of the file or ``deadline``.

        Stopping at the deadline loses nothing: the next record is not read.
        """
        for event in self.events():
            yield from self.scalars_of(event)
            if time.monotonic() >= deadline:
                return

    def scalars_of(self, event: Any) -> Iterator[_Scalar]:
        for value in event.summary.value:
            scalar = self._scalar(value)
            if scalar is not None:
                yield _Scalar(event.wall_time, event.step, scalar, (self._dir, value.tag))

    def _scalar(self, value: Any) -> float | None:
        if value.HasField("metadata"):
            if value.metadata.data_class == self._tb.scalar_class:
                self._scalar_tags.add(value.tag)
            else:
                self._scalar_tags.discard(value.tag)
        if value.tag not in self._scalar_tags or not value.HasField("tensor"):
            return None
        array = self._tb.make_ndarray(value.tensor)
        return float(array.ravel()[0]) if array.size == 1 else None


class EventFileSource:
    """Watches the TensorBoard event files of one run.

    Per tick: ``event_files``, ``event_file_bytes``, ``event_file_largest_bytes``; once a file
    is known, ``nonfinite_total``; once a step is known, ``train_step`` and ``step_timestamp``
    (all stamped ``now``); and one ``step_seconds`` per step advance, stamped with the wall
    time the new step was logged at; ``track_steps()`` false (the hook measures steps
    exactly) leaves the step series out. Reading is limited to ``read_budget_seconds`` per tick so
    a long backlog (attaching to a run hours in) is caught up over several ticks.
    """

    name = "eventfiles"

    def __init__(
        self,
        logdirs: Sequence[Path],
        open_paths: Callable[[], list[str]] | None = None,
        rescan_seconds: float = 10.0,
        read_budget_seconds: float = 1.0,
        track_steps: Callable[[], bool] = lambda: True,
    ) -> None:
        self._logdirs = list(logdirs)
        self._open_paths = open_paths
        self._rescan_seconds = rescan_seconds
        self._read_budget_seconds = read_budget_seconds
        self._track_steps = track_steps
        self._next_walk = -math.inf  # the `now` from which logdirs are walked again
        self._access_denied_logged = False
        self._missing_logdirs: set[Path] = set()
        self._tails: dict[tuple[int, int], _Tail] = {}  # by the file's (device, inode)
        self._any_file = False
        self._progress = StepProgress()
        self._neighbours: list[str] = []  # directories of tailed files, listed by ``drain``

    def sample(self, now: float) -> list[Sample]:
        return self._sample(now, time.monotonic() + self._read_budget_seconds)

    def drain(self, now: float) -> list[Sample]:
        """Every file read to its end: the logdirs and the directories of the files already
        tailed are walked once more (the target's open files are gone with it)."""
        self._open_paths = None  # gone with the process
        self._next_walk = -math.inf
        self._neighbours = sorted({os.path.dirname(tail.path) for tail in self._tails.values()})
        return self._sample(now, math.inf)

    def _sample(self, now: float, deadline: float) -> list[Sample]:
        tb = _tensorboard()
        self._discover(tb, now)
        sizes = self._sizes()
        samples = [
            Sample("event_files", float(len(sizes)), now),
            Sample("event_file_bytes", float(sum(sizes)), now),
            Sample("event_file_largest_bytes", float(max(sizes, default=0)), now),
        ]
        samples += self._read(deadline)
        if self._any_file:
            samples.append(Sample("nonfinite_total", float(self._progress.nonfinite), now))
        if self._progress.top is not None and self._track_steps():
            step, wall_time = self._progress.top
            samples.append(Sample("train_step", float(step), now))
            samples.append(Sample("step_timestamp", wall_time, now))
        return samples

    def _discover(self, tb: _Tensorboard, now: float) -> None:
        """Tail each event file the target has open, or that is under a logdir, once: a file
        found under two names (a logdir on the host, the path a container opened it by) is
        the same (device, inode). A name already tailed is not looked at again (``_sizes``
        stats it this tick anyway)."""
        found = [p for p in self._list_open_paths() if _is_event_file(p)]
        for directory in self._neighbours:  # not walked: a file may sit in /tmp itself
            with contextlib.suppress(OSError):
                found += [e.path for e in os.scandir(directory) if _is_event_file(e.name)]
        if now >= self._next_walk:
            self._next_walk = now + self._rescan_seconds
            for logdir in self._logdirs:
                self._check_logdir(logdir)
                for root, _dirs, files in os.walk(logdir):
                    found += [os.path.join(root, f) for f in files if _is_event_file(f)]
        tailed = {tail.path for tail in self._tails.values()}
        for path in found:
            if path in tailed:
                continue
            try:
                status = os.stat(path)
            except OSError as err:
                log.debug("cannot stat %s: %s", path, err)
                continue
            identity = (status.st_dev, status.st_ino)
            if identity not in self._tails:
                self._tails[identity] = _Tail(tb, path)
                self._any_file = True

    def _check_logdir(self, logdir: Path) -> None:
        """Warn once when a logdir disappears (and again if it comes back and goes again)."""
        if logdir.is_dir():
            self._missing_logdirs.discard(logdir)
        elif logdir not in self._missing_logdirs:
            self._missing_logdirs.add(logdir)
            log.warning("logdir %s no longer exists; its event files are no longer read", logdir)

    def _list_open_paths(self) -> list[str]:
        if self._open_paths is None:
            return []
        try:
            return self._open_paths()
        except TargetAccessDenied as err:
            if not self._access_denied_logged:
                self._access_denied_logged = True
                log.warning("event files are found only under the logdirs: %s", err)
            return []

    def _sizes(self) -> list[int]:
        """Sizes of the known files; files that no longer exist are forgotten."""
        sizes = []
        for identity, tail in list(self._tails.items()):
            try:
                sizes.append(os.stat(tail.path).st_size)
            except FileNotFoundError:
                del self._tails[identity]
            except OSError as err:
                log.debug("cannot stat %s: %s", tail.path, err)
        return sizes

    def _read(self, deadline: float) -> list[Sample]:
        """Consume new scalars of all files in wall-time order, until the ``deadline`` (on
        the monotonic clock); ``step_seconds`` samples."""
        track_steps = self._track_steps()
        streams = [tail.scalars(deadline) for tail in self._tails.values()]
        samples = []
        for scalar in heapq.merge(*streams, key=lambda s: s.wall_time):
            seconds = self._progress.feed(scalar)
            if seconds is not None and track_steps:
                samples.append(Sample("step_seconds", seconds, scalar.wall_time))
        return samples

    def close(self) -> None:
        """Drop the loaders; they hold no open descriptors between reads."""
        self._tails.clear()


class _Replayed(NamedTuple):
    wall_time: float
    file: int
    size: int  # the file's size once this record was written
    scalars: list[_Scalar]


def _replay_file(tb: _Tensorboard, index: int, path: str) -> Iterator[_Replayed]:
    tail = _Tail(tb, path)
    for event in tail.events():
        # The file's size as of this record: its records' end, skipped ones included.
        yield _Replayed(event.wall_time, index, tail.records.offset, list(tail.scalars_of(event)))


def replay_logdir(logdir: Path, resolution: float = 1.0) -> Iterator[Sample]:
    """A finished (or running) run's samples, rebuilt from its event files alone.

    Each file's size as of each record comes from the record lengths, so event-file growth
    over the run is known without having watched it; step progress and non-finite values
    are read as ``EventFileSource`` reads them. Series other than ``step_seconds`` are
    emitted at most once per ``resolution`` seconds of the run's wall time.
    """
    tb = _tensorboard()
    paths = sorted(
        os.path.join(root, f)
        for root, _dirs, files in os.walk(logdir)
        for f in files
        if _is_event_file(f)
    )
    sizes = [0] * len(paths)
    progress = StepProgress()

    def progress_samples(t: float) -> Iterator[Sample]:
        yield Sample("event_files", float(sum(1 for size in sizes if size)), t)
        yield Sample("event_file_bytes", float(sum(sizes)), t)
        yield Sample("event_file_largest_bytes", float(max(sizes)), t)
        yield Sample("nonfinite_total", float(progress.nonfinite), t)
        if progress.top is not None:
            yield Sample("train_step", float(progress.top[0]), t)
            yield Sample("step_timestamp", progress.top[1], t)

    emitted = -math.inf  # when progress samples were last emitted
    t = math.nan
    streams = [_replay_file(tb, i, path) for i, path in enumerate(paths)]
    for replayed in heapq.merge(*streams, key=lambda r: r.wall_time):
        sizes[replayed.file] = replayed.size
        t = replayed.wall_time
        for scalar in replayed.scalars:
            seconds = progress.feed(scalar)
            if seconds is not None:
                yield Sample("step_seconds", seconds, scalar.wall_time)
        if abs(t - emitted) >= resolution:  # a record out of time order emits them too
            emitted = t
            yield from progress_samples(t)
    if math.isfinite(t):  # the final state, whatever the resolution
        yield from progress_samples(t)


def _is_event_file(path: str) -> bool:
    return os.path.basename(path).startswith(EVENT_FILE_PREFIX)
