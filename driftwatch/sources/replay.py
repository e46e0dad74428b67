"""A finished (or running) run's samples, rebuilt from its TensorBoard event files alone.

What ``driftwatch analyze`` reads a logdir with: the files are read as ``EventFileSource``
tails them (``eventfiles.py``, ``records.py``: a large record is skipped by its length), to
their ends, their records merged in wall-time order.
"""

from __future__ import annotations

import heapq
import math
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

from driftwatch.series import Sample
from driftwatch.sources.eventfiles import is_event_file, tail
from driftwatch.sources.scalars import Scalar, StepProgress

Progress = Callable[[int, int], None]
"""Told ``(bytes read, bytes to read)`` as a replay goes on, and once at its end."""

PROGRESS_EVERY = 64
"""Records read between two calls of a replay's ``Progress``."""


class _Replayed(NamedTuple):
    wall_time: float
    file: int
    size: int  # the file's size once this record was written
    scalars: list[Scalar]


def _replay_file(index: int, path: str) -> Iterator[_Replayed]:
    reader = tail(path)
    records = reader.records
    for wall_time, scalars in reader.read():
        # The file's size as of this record: its records' end, skipped ones included.
        yield _Replayed(wall_time, index, records.offset, scalars)


def event_files(logdir: Path) -> list[str]:
    """The event files under ``logdir``, in the order of their paths."""
    return sorted(
        os.path.join(root, f)
        for root, _dirs, files in os.walk(logdir)
        for f in files
        if is_event_file(f)
    )


def _total_bytes(paths: list[str]) -> int:
    """The files' sizes added up, a file that cannot be read counting none: the bytes a
    replay's progress is told it has to read."""
    total = 0
    for path in paths:
        try:
            total += os.stat(path).st_size
        except OSError:
            continue
    return total


@dataclass
class Tally:
    """What a replay read: event files and their records (events), filled in as it goes."""

    files: int = 0
    records: int = 0


def replay_logdir(
    logdir: Path,
    resolution: float = 1.0,
    progress: Progress | None = None,
    tally: Tally | None = None,
) -> Iterator[Sample]:
    """The samples of the run logged in ``logdir`` (a directory, or one event file).

    Each file's size as of each record comes from the record lengths, so event-file growth
    over the run is known without having watched it; step progress and non-finite values
    are read as ``EventFileSource`` reads them. Series other than ``step_seconds`` are
    emitted at most once per ``resolution`` seconds of the run's wall time.
    """
    paths = [str(logdir)] if logdir.is_file() else event_files(logdir)
    tally = tally if tally is not None else Tally()
    tally.files = len(paths)
    total = _total_bytes(paths)
    sizes = [0] * len(paths)
    steps = StepProgress()

    def progress_samples(t: float) -> Iterator[Sample]:
        yield Sample("event_files", float(sum(1 for size in sizes if size)), t)
        yield Sample("event_file_bytes", float(sum(sizes)), t)
        yield Sample("event_file_largest_bytes", float(max(sizes)), t)
        yield from steps.nonfinite_samples(t)
        if steps.top is not None:
            yield Sample("train_step", float(steps.top[0]), t)
            yield Sample("step_timestamp", steps.top[1], t)

    emitted = -math.inf  # when progress samples were last emitted
    t = math.nan
    streams = [_replay_file(i, path) for i, path in enumerate(paths)]
    for count, replayed in enumerate(heapq.merge(*streams, key=lambda r: r.wall_time)):
        tally.records = count + 1
        sizes[replayed.file] = replayed.size
        t = replayed.wall_time
        for scalar in replayed.scalars:
            seconds = steps.feed(scalar)
            if seconds is not None:
                yield Sample("step_seconds", seconds, scalar.wall_time)
        if abs(t - emitted) >= resolution:  # a record out of time order emits them too
            emitted = t
            yield from progress_samples(t)
        if progress is not None and count % PROGRESS_EVERY == 0:
            progress(sum(sizes), total)
    if math.isfinite(t):  # the final state, whatever the resolution
        yield from progress_samples(t)
    if progress is not None:
        progress(max(sum(sizes), total), total)
