"""Hook source: what the in-process hook wrote into the target's channel, as samples.

The channel appears when the job starts training, possibly long after monitoring began, so
the source looks for it on every tick until it is found.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from pathlib import Path

from driftwatch.channel.paths import ChannelError
from driftwatch.channel.ring import ChannelReader, Record
from driftwatch.channel.wire import (
    CAPTURE_META,
    RUNTIME_META,
    SERIES_META,
    VALUE_SERIES,
    CaptureStatus,
    RecordKind,
)
from driftwatch.series import (
    MAX_LABEL_SETS,
    RUNTIME_LABELS,
    SERIES,
    Labels,
    Sample,
    checked_labels,
)

log = logging.getLogger(__name__)

MAX_SERIES = len(SERIES) * MAX_LABEL_SETS
"""Entries of the hook's series table read at most: more cannot all be admitted anyway."""


@dataclass(frozen=True, slots=True)
class CaptureAnswer:
    """The hook's answer to a profiler-trace request (a ``CAPTURE`` record)."""

    id: int
    status: CaptureStatus
    steps: int  # steps traced
    t: float
    error: str  # why it failed, when it did


def _series_table(table: object) -> list[tuple[str, Labels | None]]:
    """The hook's list of ``[series, {label: value}]``, checked entry by entry: an entry that
    names no known series or has the wrong labels keeps its index but labels None."""
    if not isinstance(table, list):
        return []
    checked: list[tuple[str, Labels | None]] = []
    for entry in table[:MAX_SERIES]:
        valid = isinstance(entry, list) and len(entry) == 2 and isinstance(entry[1], dict)
        name = str(entry[0]) if valid else ""
        checked.append((name, checked_labels(name, entry[1]) if valid else None))
    return checked


def _runtime_labels(versions: object) -> Labels | None:
    """The hook's ``{"python": ..., ...}`` as ``runtime_info`` labels; None if it sent none."""
    if not isinstance(versions, dict):
        return None
    return checked_labels("runtime_info", {name: versions.get(name, "") for name in RUNTIME_LABELS})


class HookSource:
    """Reads the hook's channel of one process, the file ``path`` once it exists.

    ``owner``: the uid the channel file must belong to (default: this user's).
    """

    name = "hook"

    def __init__(self, path: Path, owner: int | None = None) -> None:
        self._path = path
        self._owner = owner
        self._refusal = ""  # why the channel was last refused: warned once, retried quietly
        self._reader: ChannelReader | None = None
        self._series: list[tuple[str, Labels | None]] = []
        self._table_read = False  # whether this tick has re-read the series table
        self._runtime: Labels | None = None  # the job's versions, sent once per connection
        self._runtime_sent = False
        self._answers: list[CaptureAnswer] = []

    @property
    def connected(self) -> bool:
        """Whether the target has a hook whose channel is being read."""
        return self._reader is not None

    @property
    def path(self) -> Path:
        """The channel file (which may not exist yet), as this process reaches it."""
        return self._path

    def take_answers(self) -> list[CaptureAnswer]:
        """The hook's answers to capture requests read since the last call."""
        answers, self._answers = self._answers, []
        return answers

    def sample(self, now: float) -> list[Sample]:
        reader = self._reader or self._connect()
        if reader is None:
            return []
        return self._samples(reader, reader.read()[0], now)

    def drain(self, now: float) -> list[Sample]:
        """The channel read until it is empty (a writer that died mid-record leaves it
        abandoned, which the reader skips)."""
        reader = self._reader or self._connect()
        samples: list[Sample] = []
        while reader is not None:
            records, _lost = reader.read()
            if not records:
                break
            samples += self._samples(reader, records, now)
        return samples

    def _samples(self, reader: ChannelReader, records: list[Record], now: float) -> list[Sample]:
        self._table_read = False
        samples: list[Sample] = []
        last_step = None
        for record in records:
            if record.kind == RecordKind.VALUE:
                series = self._series_at(reader, record.key)
                if series is not None:
                    samples.append(Sample(series[0], record.a, record.t, series[1]))
                continue
            if record.kind == RecordKind.STEP:
                last_step = record
            elif record.kind == RecordKind.CAPTURE:
                self._answers.append(self._answer(reader, record))
                continue
            if (names := VALUE_SERIES.get(record.kind)) is not None:
                samples.append(Sample(names[0], record.a, record.t))
                samples.append(Sample(names[1], record.b, record.t))
        if last_step is not None:
            samples.append(Sample("train_step", float(last_step.key), now))
            samples.append(Sample("step_timestamp", last_step.t, now))
        samples.append(Sample("hook_records_lost_total", float(reader.lost_total), now))
        if self._runtime is not None and not self._runtime_sent:
            samples.append(Sample("runtime_info", 1.0, now, self._runtime))
            self._runtime_sent = True
        return samples

    def _answer(self, reader: ChannelReader, record: Record) -> CaptureAnswer:
        try:
            status = CaptureStatus(int(record.a))
        except ValueError:
            status = CaptureStatus.FAILED
        error = ""
        if status is CaptureStatus.FAILED:
            entry = reader.meta().get(CAPTURE_META)
            if isinstance(entry, dict) and entry.get("id") == record.key:
                error = str(entry.get("error", ""))
            error = error or "the hook gave no reason"
        return CaptureAnswer(record.key, status, int(record.b), record.t, error)

    def _connect(self) -> ChannelReader | None:
        if not os.path.lexists(self._path):
            return None
        try:
            self._reader = ChannelReader.open(self._path, self._owner)
        except ChannelError as err:
            if str(err) != self._refusal:
                self._refusal = str(err)
                log.warning("cannot read the hook's channel: %s", err)
            return None
        log.info("reading the hook's channel %s", self._path)
        self._runtime_sent = False
        self._load_meta(self._reader)
        return self._reader

    def _load_meta(self, reader: ChannelReader) -> None:
        """Read the writer's series table and, until known, the job's versions."""
        meta = reader.meta()
        self._series = _series_table(meta.get(SERIES_META))
        if self._runtime is None:
            self._runtime = _runtime_labels(meta.get(RUNTIME_META))

    def _series_at(self, reader: ChannelReader, key: int) -> tuple[str, Labels] | None:
        """The series and labels of a ``VALUE`` record's key; None for one the table lacks."""
        if key >= len(self._series) and not self._table_read:  # added since: refresh, once
            self._table_read = True
            self._load_meta(reader)
        series = self._series[key] if key < len(self._series) else None
        return None if series is None or series[1] is None else (series[0], series[1])

    def close(self) -> None:
        if self._reader is not None:
            self._reader.close()
            self._reader = None
