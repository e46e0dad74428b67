"""Event-file source: size, step progress and non-finite scalars of TensorBoard event files.

Files are found among the target's open files (every tick) and under the given logdirs
(re-walked every ``rescan_seconds``), then tailed incrementally. driftwatch reads the
TFRecord framing itself, by the records' headers (``records.py``: a large record's images or
histograms are skipped, never read; corruption is survived there), checks checksums in C
(google-crc32c) and parses each event with tensorboard's generated protobuf classes, except
the usual summary event of tags already seen, read from its bytes (``Tags.quick``). Which
values are scalars is decided as tensorboard's migration of legacy summaries decides it
(``scalars.py``), without building the migrated protos. tensorboard is imported
lazily and forced onto its pure-Python TensorFlow stub, so watching a run never imports
TensorFlow into driftwatch.
"""

from __future__ import annotations

import contextlib
import functools
import heapq
import logging
import math
import operator
import os
import sys
import time
import types
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

from driftwatch.errors import SourceUnavailable, TargetAccessDenied
from driftwatch.series import Sample
from driftwatch.sources.records import MaskedCrc, Records
from driftwatch.sources.scalars import Protos, Scalar, StepProgress, Tags, masked
from driftwatch.units import human_bytes

log = logging.getLogger(__name__)

EVENT_FILE_PREFIX = "events.out.tfevents."

_NOTF = "tensorboard.compat.notf"
"""A module tensorboard looks for: if importable, ``tensorboard.compat.tf`` is its stub."""

_MISSING = (
    "tensorboard is not installed (pip install 'driftwatch[tf]'): event files are not monitored"
)


def _checksum() -> tuple[MaskedCrc, str]:
    """google-crc32c's CRC-32C (C, gigabytes a second), else tensorboard's (pure Python)."""
    try:
        import google_crc32c
    except ImportError:
        from tensorboard.compat.tensorflow_stub.pywrap_tensorflow import masked_crc32c

        return masked_crc32c, "tensorboard's pure-Python CRC-32C (pip install google-crc32c)"
    where = "in C" if google_crc32c.implementation == "c" else "in pure Python: slow"
    return masked(google_crc32c.value), f"google-crc32c {where}"


def _make_ndarray(tensor: Any) -> Any:
    """tensorboard's reading of a tensor proto (imported on first use: a rare form's)."""
    from tensorboard.util import tensor_util

    return tensor_util.make_ndarray(tensor)


@functools.cache
def _tensorboard() -> Protos:
    """Import tensorboard's protos on its TensorFlow stub; ``SourceUnavailable`` if missing."""
    try:
        import tensorboard

        # Before ``tensorboard.compat.tf`` is first resolved: else it imports TensorFlow.
        sys.modules.setdefault(_NOTF, types.ModuleType(_NOTF))
        from google.protobuf.message import DecodeError
        from tensorboard.compat.proto import event_pb2, summary_pb2
        from tensorboard.plugins.audio import metadata as audio
        from tensorboard.plugins.custom_scalar import metadata as custom_scalars
        from tensorboard.plugins.graph import metadata as graphs
        from tensorboard.plugins.histogram import metadata as histograms
        from tensorboard.plugins.hparams import metadata as hparams
        from tensorboard.plugins.image import metadata as images
        from tensorboard.plugins.mesh import metadata as mesh
        from tensorboard.plugins.pr_curve import metadata as pr_curves
        from tensorboard.plugins.scalar import metadata as scalars
        from tensorboard.plugins.text import metadata as text
    except ImportError as err:
        if err.name == "tensorboard":
            raise SourceUnavailable(_MISSING) from err
        raise SourceUnavailable(
            f"tensorboard's event protos cannot be imported ({err}): event files are not monitored"
        ) from err
    tensor, blobs = summary_pb2.DATA_CLASS_TENSOR, summary_pb2.DATA_CLASS_BLOB_SEQUENCE
    # tensorboard.dataclass_compat's table: the data class of each plugin's summaries.
    plugin_class = {
        scalars.PLUGIN_NAME: summary_pb2.DATA_CLASS_SCALAR,
        histograms.PLUGIN_NAME: tensor,
        images.PLUGIN_NAME: blobs,
        audio.PLUGIN_NAME: blobs,
        text.PLUGIN_NAME: tensor,
        hparams.PLUGIN_NAME: tensor,
        pr_curves.PLUGIN_NAME: tensor,
        mesh.PLUGIN_NAME: tensor,
        custom_scalars.PLUGIN_NAME: tensor,
        graphs.PLUGIN_NAME_RUN_METADATA: blobs,
        graphs.PLUGIN_NAME_RUN_METADATA_WITH_GRAPH: blobs,
        graphs.PLUGIN_NAME_KERAS_MODEL: blobs,
    }
    checksum = _checksum()
    return Protos(
        version=str(tensorboard.__version__),
        masked_crc32c=checksum[0],
        crc=checksum[1],
        parse=event_pb2.Event.FromString,
        make_ndarray=_make_ndarray,
        decode_error=DecodeError,
        plugin_class=plugin_class,
        # tensorboard.data_compat's table: the plugin a TF1 value of each kind becomes.
        legacy_plugin={
            "simple_value": scalars.PLUGIN_NAME,
            "histo": histograms.PLUGIN_NAME,
            "image": images.PLUGIN_NAME,
            "audio": audio.PLUGIN_NAME,
        },
        run_graph_tag=graphs.RUN_GRAPH_NAME,
    )


def describe() -> tuple[bool, str]:
    """For ``driftwatch doctor``: whether event files can be read, and with what."""
    try:
        tb = _tensorboard()
    except SourceUnavailable as err:
        return False, str(err)
    return True, f"tensorboard {tb.version} protos (no TensorFlow); checksums: {tb.crc}"


class Tail:
    """One event file read incrementally: its records as events, and their scalars."""

    def __init__(self, tb: Protos, path: str) -> None:
        self.path = path
        self._tb = tb
        self._dir = os.path.dirname(path)
        self._tags = Tags(tb)
        self.records = Records(path, tb.masked_crc32c, self._tags.never_scalar)

    def read(self) -> Iterator[tuple[float, list[Scalar]]]:
        """The wall time and scalars (``scalars_of``) of each event appended since the last
        call; most records are read without being parsed (``Tags.quick``), a record that is
        no event is skipped."""
        quick, parse, decode_error = self._tags.quick, self._tb.parse, self._tb.decode_error
        directory = self._dir
        try:
            for record in self.records:
                read = quick(record)
                if read is None:
                    try:
                        event = parse(record)
                    except decode_error as err:
                        log.debug("skipped a record of %s that is no event: %s", self.path, err)
                        continue
                    yield event.wall_time, self.scalars_of(event)
                    continue
                wall_time, step, found = read
                yield (
                    wall_time,
                    [Scalar(wall_time, step, number, (directory, tag)) for tag, number in found],
                )
        except OSError as err:  # deleted or unreadable: dropped once its size says so
            log.debug("stopped reading %s: %s", self.path, err)

    def scalars(self, deadline: float) -> Iterator[Scalar]:
        """Scalars appended since the last call, until the end of the file or ``deadline``
        (then ``records.behind``). Stopping at the deadline loses nothing: the next record
        is not read."""
        self.records.behind = False
        for _wall_time, scalars in self.read():
            yield from scalars
            if time.monotonic() >= deadline:
                self.records.behind = True
                return

    def scalars_of(self, event: Any) -> list[Scalar]:
        what = event.WhichOneof("what")
        if what != "summary":
            if what == "graph_def":
                self._tags.not_scalar(self._tb.run_graph_tag)
            elif what == "tagged_run_metadata":
                self._tags.not_scalar(event.tagged_run_metadata.tag)
            return []
        found = self._tags.scalars(event.summary.value)
        if not found:
            return []
        wall_time, step, directory = event.wall_time, event.step, self._dir
        return [Scalar(wall_time, step, number, (directory, tag)) for tag, number in found]

    def unread(self) -> int:
        """Bytes of the file a read stopped at its deadline left (0: it read to the end)."""
        records = self.records
        return records.size - records.offset if records.behind and not records.broken else 0


class EventFileSource:
    """Watches the TensorBoard event files of one run.

    Per tick, from the run's first event file on (its files may all be deleted later):
    ``event_files``, ``event_file_bytes``, ``event_file_largest_bytes``, ``nonfinite_total``
    and ``event_file_unread_bytes``; once a step is known,
    ``train_step`` and ``step_timestamp`` (all stamped ``now``); and one ``step_seconds`` per
    step advance, stamped with the wall time the new step was logged at; ``track_steps()``
    false (the hook measures steps exactly) leaves the step series out. Reading is limited
    to ``read_budget_seconds`` per tick so a long backlog (attaching to a run hours in) is
    caught up over several ticks; what a tick leaves unread is ``event_file_unread_bytes``,
    and the first time that happens is logged.
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
        self._tails: dict[tuple[int, int], Tail] = {}  # by the file's (device, inode)
        self._any_file = False
        self._progress = StepProgress()
        self._neighbours: list[str] = []  # directories of tailed files, listed by ``drain``
        self._behind_logged = False

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
        if not self._any_file:  # a run that writes none has no event-file series
            return []
        sizes = self._sizes()
        samples = [
            Sample("event_files", float(len(sizes)), now),
            Sample("event_file_bytes", float(sum(sizes)), now),
            Sample("event_file_largest_bytes", float(max(sizes, default=0)), now),
        ]
        samples += self._read(deadline)
        samples += self._progress.nonfinite_samples(now)
        samples.append(Sample("event_file_unread_bytes", float(self._unread()), now))
        if self._progress.top is not None and self._track_steps():
            step, wall_time = self._progress.top
            samples.append(Sample("train_step", float(step), now))
            samples.append(Sample("step_timestamp", wall_time, now))
        return samples

    def _discover(self, tb: Protos, now: float) -> None:
        """Tail each event file the target has open, or that is under a logdir, once: a file
        found under two names (a logdir on the host, the path a container opened it by) is
        the same (device, inode). A name already tailed is not looked at again (``_sizes``
        stats it this tick anyway)."""
        found = [p for p in self._list_open_paths() if is_event_file(p)]
        for directory in self._neighbours:  # not walked: a file may sit in /tmp itself
            with contextlib.suppress(OSError):
                found += [e.path for e in os.scandir(directory) if is_event_file(e.name)]
        if now >= self._next_walk:
            self._next_walk = now + self._rescan_seconds
            for logdir in self._logdirs:
                self._check_logdir(logdir)
                for root, _dirs, files in os.walk(logdir):
                    found += [os.path.join(root, f) for f in files if is_event_file(f)]
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
                self._tails[identity] = Tail(tb, path)
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
        merged = streams[0] if len(streams) == 1 else heapq.merge(*streams, key=_wall_time)
        feed = self._progress.feed
        samples = []
        for scalar in merged:
            seconds = feed(scalar)
            if seconds is not None and track_steps:
                samples.append(Sample("step_seconds", seconds, scalar.wall_time))
        return samples

    def _unread(self) -> int:
        """Bytes this tick's read left for the next ones; the first time, a warning."""
        unread = sum(tail.unread() for tail in self._tails.values())
        if unread and not self._behind_logged:
            self._behind_logged = True
            log.warning(
                "event files are written faster than they are read in %g s a tick: %s left "
                "for the next ticks (event_file_unread_bytes says how far behind)",
                self._read_budget_seconds,
                human_bytes(unread),
            )
        return unread

    def close(self) -> None:
        """Drop the readers; they hold no open descriptors between reads."""
        self._tails.clear()


_wall_time = operator.itemgetter(0)  # of a Scalar


def tail(path: str) -> Tail:
    """A reader of the event file at ``path``; ``SourceUnavailable`` without tensorboard."""
    return Tail(_tensorboard(), path)


def is_event_file(path: str) -> bool:
    return os.path.basename(path).startswith(EVENT_FILE_PREFIX)
