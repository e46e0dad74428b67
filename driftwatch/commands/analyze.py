"""``driftwatch analyze``: the live detectors, offline, on a logdir or a recorded samples file.

A samples file has one JSON object per line: ``{"t": <unix seconds>, "series": <name>,
"value": <number>}`` with an optional ``"labels": {...}``, series named as in ``SERIES``
(docs/metrics.md), in time order: a record up to ``REORDER_SECONDS`` early is put in its
place.

The recording is replayed as a live monitor would watch it, with one difference that keeps
the cost in proportion to the records rather than to the time they span: a silence of more
than ``GAP_SECONDS`` (no record of any series) is a gap, where the run was stopped or paused
and later resumed (or a record is misdated). Nothing is judged inside a gap: each side is
judged as a run of its own, ended at its last record, and the gap is stated as a
``recording_gap`` finding. Inside a shorter silence (a hang the stall detector should
report) the detectors are asked at ever sparser times (``_silence_ticks``). Nothing is
judged after the last record.
"""

from __future__ import annotations

import bisect
import itertools
import json
import math
import operator
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rich.console import Console

from driftwatch.detect import Engine
from driftwatch.detect.catalog import default_engine
from driftwatch.detect.goodput import PHASES, Breakdown, GoodputAccount
from driftwatch.errors import DriftwatchError
from driftwatch.findings import KINDS, Finding
from driftwatch.series import SERIES, Sample
from driftwatch.sources.eventfiles import is_event_file
from driftwatch.sources.replay import Tally, replay_logdir
from driftwatch.units import human_seconds, local_time

if TYPE_CHECKING:
    from rich.progress import Progress, TaskID

EVALUATE_EVERY_SECONDS = 30.0
"""How often, in the recording's time, the detectors are asked what holds (seconds)."""
GAP_SECONDS = 6 * 3600.0
"""A silence in the records longer than this is a gap: a stopped run resumed (seconds)."""
REORDER_SECONDS = 60.0
"""How far before the newest record so far a samples file's record may be (seconds)."""
PROGRESS_AFTER_SECONDS = 2.0
"""A logdir's read shows a progress bar once it has lasted this long, on a terminal (seconds)."""


class RecordingError(DriftwatchError):
    """A samples file that cannot be analysed; the message names the line."""


EXPECTED = 'expected {"t": seconds, "series": name, "value": number}'

BATCH_LINES = 4096
"""Lines parsed by one ``json.loads`` call: per-line calls cost more than the parsing."""


def _parse(path: Path, lines: list[str], first: int) -> Iterable[tuple[int, Any]]:
    """``(line number, decoded JSON)`` of the non-blank ``lines``, numbered from ``first``.

    One ``json.loads`` of them all as an array; should that fail (a blank or malformed
    line), or the array not hold one value per line (lines that are not JSON values on their
    own), they are decoded one by one, blank lines skipped, so that the error names the line.
    """
    try:
        values = json.loads("[" + ",".join(lines) + "]")
    except ValueError:
        values = None
    if isinstance(values, list) and len(values) == len(lines):
        return enumerate(values, first)
    decoded: list[tuple[int, Any]] = []
    for number, line in enumerate(lines, first):
        if not line.strip():
            continue
        try:
            decoded.append((number, json.loads(line)))
        except ValueError as err:
            raise RecordingError(f"{path}:{number}: {EXPECTED}") from err
    return decoded


_TIME = operator.attrgetter("t")


def read_samples(path: Path) -> Iterator[Sample]:
    """The samples of a recording in time order, checked line by line (a hot loop: kept
    lean). Each batch of lines is sorted only if it holds a record earlier than one before
    it, and samples are handed on once no later record may come before them."""
    try:
        lines = path.open(encoding="utf-8")
    except OSError as err:
        raise RecordingError(f"{path}: cannot read: {err.strerror}") from err
    newest = -math.inf
    pending: list[Sample] = []  # read, not yet handed on; in time order between batches
    first = 1
    with lines:
        while batch := _next_lines(path, lines):
            disordered = False
            for number, record in _parse(path, batch, first):
                sample = _to_sample(path, number, record)
                t = sample.t
                if t >= newest:
                    newest = t
                elif t >= newest - REORDER_SECONDS:
                    disordered = True
                else:
                    raise RecordingError(
                        f"{path}:{number}: time goes backwards by {human_seconds(newest - t)} "
                        f"({t} after {newest}; records may be at most "
                        f"{REORDER_SECONDS:.0f} s out of order)"
                    )
                pending.append(sample)
            first += len(batch)
            if disordered:
                pending.sort(key=_TIME)  # stable: records of one time keep their order
            settled = bisect.bisect_right(pending, newest - REORDER_SECONDS, key=_TIME)
            yield from itertools.islice(pending, settled)
            del pending[:settled]
    yield from pending


_NUMBERS = (int, float)
"""The JSON types a sample's time and value may have."""


def _to_sample(path: Path, number: int, record: Any) -> Sample:
    """Line ``number``'s decoded record as a sample, checked: its fields, their types, a known
    series and labels that are an object."""
    try:
        t = record["t"]
        series = record["series"]
        value = record["value"]
    except (KeyError, TypeError) as err:
        raise RecordingError(f"{path}:{number}: {EXPECTED}") from err
    if type(t) not in _NUMBERS or (value is not None and type(value) not in _NUMBERS):
        raise RecordingError(f"{path}:{number}: t and value must be numbers")
    if series not in SERIES:
        raise RecordingError(f"{path}:{number}: unknown series {series!r} (see docs/metrics.md)")
    value = math.nan if value is None else value
    labels = record.get("labels")
    if labels is None:
        return Sample(series, value, t)
    if isinstance(labels, dict):
        return Sample(series, value, t, tuple(sorted((str(k), str(v)) for k, v in labels.items())))
    raise RecordingError(f"{path}:{number}: labels must be an object")


def _next_lines(path: Path, lines: Iterator[str]) -> list[str]:
    """The next batch of a samples file's lines; a binary file (an event file given instead of
    its logdir, say) is refused with a message, not a decoding error."""
    try:
        return list(itertools.islice(lines, BATCH_LINES))
    except UnicodeDecodeError as err:
        raise RecordingError(
            f"{path}: not a samples file (binary data); give a TensorBoard logdir, an event "
            "file or a samples file"
        ) from err


def _silence_ticks(first: float, until: float, every: float) -> Iterator[float]:
    """The times in ``[first, until]`` at which the detectors are asked, of those on the
    ``every`` grid from ``first``: ``first`` and then ever sparser (offsets of 1, 3, 7, 15,
    ... ticks), and the last one. With records more often than ``every``, that is each tick;
    a long silence costs a few evaluations (a stall is reported at most about twice as late
    after the last step as live), not one per tick."""
    last = math.floor((until - first) / every)
    offset = 0
    while offset < last:
        yield first + offset * every
        offset = 2 * offset + 1
    yield first + last * every


@dataclass
class _Part:
    """One stretch of a recording without a gap: a run of its own."""

    engine: Engine
    start: float = math.nan  # its first sample's time
    first: int = 0  # its first sample's index in the recording
    end: float = math.nan  # its last sample's time, once it has ended
    samples: int = 0  # and their number
    first_reported: dict[str, float] = field(default_factory=dict)
    latest: dict[str, Finding] = field(default_factory=dict)
    account: GoodputAccount = field(default_factory=GoodputAccount)
    goodput: Breakdown | None = None  # where its wall time went, once it has ended

    def evaluate(self, now: float, final: bool = False) -> None:
        for finding in self.engine.evaluate(now, final=final):
            self.first_reported.setdefault(finding.kind, now)
            self.latest[finding.kind] = finding

    def conclude(self, end: float, next_index: int) -> _Part:
        """Judge the part as a run that ended at ``end``, its last sample's time."""
        self.end, self.samples = end, next_index - self.first
        self.evaluate(end, final=True)
        self.goodput = self.account.breakdown(end, final=True)
        return self

    def findings(self) -> list[tuple[float, Finding]]:
        """Each kind's latest finding, with when it was first reported."""
        return [
            (self.first_reported[kind], _reported(finding, self.first_reported[kind]))
            for kind, finding in self.latest.items()
        ]

    def describe(self) -> str:
        span = self.end - self.start
        what = "records of one instant" if span == 0 else f"{human_seconds(span)} of records"
        return f"{what} ({self.samples:,} samples)"


def _reported(finding: Finding, at: float) -> Finding:
    return replace(finding, evidence={**finding.evidence, "first_reported": at})


def _gap_finding(before: _Part, after: _Part) -> Finding:
    length = after.start - before.end
    message = (
        f"no records for {human_seconds(length)}, from {local_time(before.end)} to "
        f"{local_time(after.start)}: the run was stopped or paused and resumed there (or a "
        f"record is misdated). Nothing is judged inside the gap: the {before.describe()} "
        f"before it and the {after.describe()} after it are judged as runs of their own."
    )
    evidence = {"gap_seconds": length, "resumed_at": after.start}
    return Finding("recording_gap", KINDS["recording_gap"].severity, before.end, message, evidence)


def _resumed(observe: Callable[[Sample], None], start: float) -> Callable[[Sample], None]:
    """``observe`` less the samples of steps taken before a resumed run's ``start``: the
    latest step the event files knew of, until the run logs one of its own
    (``step_timestamp``: else its start-up looks like a stall since before the gap), and the
    logged interval that spans the gap (``step_seconds``)."""

    def observe_resumed(sample: Sample) -> None:
        if sample.series == "step_timestamp":
            if sample.value < start:
                return
        elif sample.series == "step_seconds" and sample.t - sample.value < start:
            return
        observe(sample)

    return observe_resumed


@dataclass(slots=True)
class Read:
    """What ``analyze`` read: samples, their span, the steps they tell, the gaps; and, of a
    logdir, its event files and their records."""

    samples: int = 0
    start: float = math.nan
    end: float = math.nan
    steps: tuple[float, float] | None = None  # the lowest and highest step
    gaps: list[tuple[float, float]] = field(default_factory=list)  # (from, to)
    tally: Tally | None = None  # a logdir's files and records

    def describe(self, name: str) -> str:
        """One line: ``read 2 event files of NAME: 1,234 records (5,678 samples), steps 0 to
        5,000, 20.3 s from 2025-06-01 14:03:27 to 14:03:47, no gap``."""
        if self.tally is not None:
            files = "file" if self.tally.files == 1 else "files"
            what = f"{self.tally.files} event {files} of {name}: {self.tally.records:,} records"
            what += f" ({self.samples:,} samples)"
        else:
            what = f"{name}: {self.samples:,} samples"
        if self.steps is not None:
            what += f", steps {self.steps[0]:,.0f} to {self.steps[1]:,.0f}"
        if math.isfinite(self.start):
            what += f", {human_seconds(self.end - self.start)} from {local_time(self.start)}"
            what += f" to {local_time(self.end)}"
        gaps = [f"{human_seconds(b - a)} from {local_time(a)}" for a, b in self.gaps]
        what += ", gaps: " + "; ".join(gaps) if gaps else ", no gap"
        return f"read {what}"


@dataclass(frozen=True, slots=True)
class Analysis:
    """What ``analyze`` found: the findings, and where the wall time went (None: no steps)."""

    findings: list[Finding]
    goodput: Breakdown | None
    read: Read = field(default_factory=Read)


def detect(
    samples: Iterable[Sample],
    every: float = EVALUATE_EVERY_SECONDS,
    new_engine: Callable[[], Engine] = default_engine,
) -> list[Finding]:
    """Run the detectors of ``new_engine()`` over ``samples`` (in time order), as live every
    ``every`` seconds of their time (``_silence_ticks`` in a silence), each part between
    gaps with an engine of its own, judged as ended at its last record; each part's latest
    finding of each kind and the gaps, in the order they were first reported."""
    return detect_run(samples, every, new_engine).findings


def _goodput(parts: list[_Part]) -> Breakdown | None:
    """The parts' goodput together (the gaps between them left out)."""
    found = [part.goodput for part in parts if part.goodput is not None]
    if not found:
        return None
    return Breakdown({phase: sum(b.seconds[phase] for b in found) for phase in PHASES})


def detect_run(
    samples: Iterable[Sample],
    every: float = EVALUATE_EVERY_SECONDS,
    new_engine: Callable[[], Engine] = default_engine,
) -> Analysis:
    """``detect``'s findings, and the goodput of the parts, each counted from its first
    record to its last."""
    parts: list[_Part] = []
    part = _Part(new_engine())
    observe: Callable[[Sample], None] = part.engine.observe  # looked up once: a hot loop
    count, counted = part.account.observe, part.account.series  # and goodput's
    next_evaluation = -math.inf
    last = math.nan  # the time of the sample before
    index = 0
    low_step, high_step = math.inf, -math.inf
    for index, sample in enumerate(samples):
        t = sample.t
        if sample.series == "train_step":
            low_step, high_step = min(low_step, sample.value), max(high_step, sample.value)
        if t >= next_evaluation:
            if t - last > GAP_SECONDS:  # False for the first sample: NaN compares false
                parts.append(part.conclude(last, index))
                part = _Part(new_engine(), start=t, first=index, account=GoodputAccount(t))
                observe = _resumed(part.engine.observe, t)
                count = part.account.observe
                next_evaluation = t + every
            elif math.isnan(part.start):  # the first sample
                part.start = t
                part.account = GoodputAccount(t)
                count = part.account.observe
                next_evaluation = t + every
            else:
                for tick in _silence_ticks(next_evaluation, t, every):
                    part.evaluate(tick)
                next_evaluation += (math.floor((t - next_evaluation) / every) + 1) * every
        observe(sample)
        if sample.series in counted:
            count(sample)
        last = t
    if math.isnan(part.start):
        return Analysis([], None)
    parts.append(part.conclude(last, index + 1))
    read = Read(index + 1, parts[0].start, last)
    read.steps = (low_step, high_step) if high_step >= low_step else None
    read.gaps = [(before.end, after.start) for before, after in itertools.pairwise(parts)]
    reported = [pair for p in parts for pair in p.findings()]
    reported += [
        (after.start, _reported(_gap_finding(before, after), after.start))
        for before, after in itertools.pairwise(parts)
    ]
    reported.sort(key=operator.itemgetter(0))
    return Analysis([finding for _, finding in reported], _goodput(parts), read)


class ReadProgress:
    """A progress bar of the bytes of a logdir read, on stderr: only on a terminal, and only
    once the read has lasted ``after`` seconds, so quick reads and pipes stay quiet."""

    def __init__(self, console: Console | None = None, after: float = PROGRESS_AFTER_SECONDS):
        self._console = console if console is not None else Console(stderr=True)
        self._from = time.monotonic() + after
        self._bar: tuple[Progress, TaskID] | None = None

    def __call__(self, done: int, total: int) -> None:
        if self._bar is None:
            if time.monotonic() < self._from or not self._console.is_terminal:
                return
            from rich.progress import (
                BarColumn,
                DownloadColumn,
                Progress,
                TextColumn,
                TimeRemainingColumn,
                TransferSpeedColumn,
            )

            bar = Progress(
                TextColumn("reading event files"),
                *(BarColumn(), DownloadColumn(), TransferSpeedColumn(), TimeRemainingColumn()),
                console=self._console,
                transient=True,
            )
            self._bar = bar, bar.add_task("read", total=total)
            bar.start()
        bar, task = self._bar
        bar.update(task, completed=done, total=total)

    def close(self) -> None:
        if self._bar is not None:
            self._bar[0].stop()


def analyze(path: Path, new_engine: Callable[[], Engine] = default_engine) -> list[Finding]:
    """Findings for a TensorBoard logdir, one event file or a samples file (see ``detect``)."""
    return analyze_run(path, new_engine).findings


def analyze_run(path: Path, new_engine: Callable[[], Engine] = default_engine) -> Analysis:
    """Findings and goodput for a TensorBoard logdir, one event file or a samples file."""
    if path.is_dir() or (is_event_file(path.name) and path.is_file()):
        progress, tally = ReadProgress(), Tally()
        try:
            samples = list(replay_logdir(path, progress=progress, tally=tally))
        finally:
            progress.close()
        if not samples:
            raise RecordingError(f"{path}: no TensorBoard event files with data in it")
        samples.sort(key=_TIME)
        analysis = detect_run(samples, new_engine=new_engine)
        analysis.read.tally = tally
        return analysis
    if not path.exists():
        raise RecordingError(f"{path}: no such file or directory")
    return detect_run(read_samples(path), new_engine=new_engine)
