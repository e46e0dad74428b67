"""Bounded, multi-resolution history per series.

Each series keeps its most recent raw samples and downsampled tiers (10 s, 1 min, 10 min
buckets with count, mean, min, max and last), from which the history database is written:
the long view lives there, so memory holds only what the history may still need after a
slow disk: the newest hour of 10 s and 1 min buckets, the newest day of 10 min buckets (the
history's whole-run tier). Every part is a ring of flat ``array('d')``
columns with a fixed capacity, so memory stays constant however long the run, with no
Python object per sample once a ring is full.
"""

from __future__ import annotations

import math
import statistics
from array import array
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Protocol, cast

from driftwatch.series import Sample, SeriesKey, key_of


class Ring:
    """Rows of floats in fixed-capacity columns; the oldest row is overwritten when full."""

    __slots__ = ("_columns", "_next", "_size", "capacity")

    def __init__(self, capacity: int, width: int) -> None:
        if capacity < 1:
            raise ValueError("capacity must be at least 1")
        self.capacity = capacity
        self._columns = [array("d") for _ in range(width)]
        self._next = 0  # where the next row goes once the ring is full
        self._size = 0

    def __len__(self) -> int:
        return self._size

    def append(self, *row: float) -> None:
        if self._size < self.capacity:
            for column, value in zip(self._columns, row, strict=True):
                column.append(value)
            self._size += 1
            return
        index = self._next
        for column, value in zip(self._columns, row, strict=True):
            column[index] = value
        self._next = (index + 1) % self.capacity

    def append_pair(self, first: float, second: float) -> None:
        """``append`` of a two-column row, without building and zipping the row."""
        columns = self._columns
        if self._size < self.capacity:
            columns[0].append(first)
            columns[1].append(second)
            self._size += 1
            return
        index = self._next
        columns[0][index] = first
        columns[1][index] = second
        self._next = (index + 1) % self.capacity

    def last_rows(self, count: int) -> list[tuple[float, ...]]:
        """The newest ``count`` rows, oldest first (``last`` of every column, zipped)."""
        size = self._size
        end = self._next if size == self.capacity else size
        columns = self._columns
        # a negative index counts from the end of a full ring's columns: the older rows
        return [
            tuple([column[i] for column in columns]) for i in range(end - min(count, size), end)
        ]

    def column(self, index: int) -> list[float]:
        """One column, oldest first."""
        column = self._columns[index]
        return column[self._next :].tolist() + column[: self._next].tolist()

    def last(self, count: int, index: int) -> list[float]:
        """The newest ``count`` values of one column, oldest first."""
        size = self._size
        count = min(count, size)
        column = self._columns[index]
        end = self._next if size == self.capacity else size
        start = end - count
        if start >= 0:
            return column[start:end].tolist()
        return column[start:].tolist() + column[:end].tolist()


@dataclass(frozen=True, slots=True)
class TierSpec:
    width_seconds: float
    capacity: int
    """Buckets kept in memory."""
    history_seconds: float = math.inf
    """How far back from a run's newest data the history database keeps the tier."""


DEFAULT_TIERS = (  # in memory: an hour, an hour, a day; in the history: as commented
    TierSpec(10.0, 360, history_seconds=3600.0),  # the newest hour
    TierSpec(60.0, 60, history_seconds=86400.0),  # the newest day
    TierSpec(600.0, 144),  # the whole run
)

BUCKET_COLUMNS = ("start", "count", "mean", "min", "max", "last")
"""The columns of a tier's rows, in order."""


Bucket = tuple[float, float, float, float, float, float]
"""One row of a tier, in the order of ``BUCKET_COLUMNS``."""


class Tier:
    """Fixed-width time buckets; non-finite values are counted only in ``last``.

    A tier built on a ``finer`` one (whose width divides its own) is fed by it: the finer
    tier folds each bucket it closes into this one, and this one's open bucket includes what
    the finer tiers hold of it. A sample is added to the finest tier only, so the coarser
    tiers cost nothing per sample; their buckets are those they would have built alone.
    """

    __slots__ = (
        "_coarser",
        "_count",
        "_end",
        "_finer",
        "_held",
        "_last",
        "_max",
        "_min",
        "_start",
        "_sum",
        "closed",
        "rows",
        "width",
    )

    def __init__(self, spec: TierSpec, finer: Tier | None = None) -> None:
        self.width = spec.width_seconds
        self.rows = Ring(spec.capacity, len(BUCKET_COLUMNS))
        self.closed = 0
        """Buckets closed so far, including those the ring has since overwritten."""
        self._coarser: Tier | None = None
        self._finer = finer
        if finer is not None:
            ratio = self.width / finer.width
            if not (ratio >= 1 and ratio == round(ratio)):
                raise ValueError(
                    f"a tier of {self.width:g} s cannot be built from one of {finer.width:g} s: "
                    "its width must be a whole multiple of the finer one's"
                )
            finer._coarser = self
        self._start = math.nan
        self._end = -math.inf  # the open bucket's start plus its width: where the next starts
        self._held = False  # whether the open bucket holds anything of its own
        self._count = 0
        self._sum = 0.0
        self._min = math.inf
        self._max = -math.inf
        self._last = math.nan

    def add(self, t: float, value: float) -> None:
        """Add a sample (to the finest tier only: the coarser ones are fed by it)."""
        # A sample older than the open bucket (clock stepped back) folds into the open bucket.
        if not t < self._end:  # the open bucket's end is not computed again per sample
            self._reach(t)
        self._held = True
        self._last = value
        if value - value == 0.0:  # finite (inf - inf and NaN - NaN are NaN)
            self._count += 1
            self._sum += value
            if value < self._min:
                self._min = value
            if value > self._max:
                self._max = value

    def flush(self) -> None:
        """Close the open bucket, with what the finer tiers hold of it."""
        if self._finer is not None:
            self._finer.flush()
        self._close()

    def open_bucket(self) -> Bucket | None:
        """The bucket still being filled, as it stands; ``None`` when there is none."""
        content = self._content()
        if content is None:
            return None
        return _bucket(self._start, *content)

    def closed_since(self, closed: int) -> list[Bucket]:
        """The buckets closed after the first ``closed``, oldest first, as far as still kept."""
        count = min(self.closed - closed, len(self.rows))
        if count <= 0:
            return []
        return cast("list[Bucket]", self.rows.last_rows(count))  # rows as wide as a Bucket

    def _reach(self, t: float) -> None:
        """Time has reached ``t`` (a sample's, or where a finer tier's new bucket starts):
        if that is past the open bucket, close it and open the one that holds ``t``."""
        if t < self._end:
            return
        start = math.floor(t / self.width) * self.width
        if start > self._start or math.isnan(self._start):
            self._close()
            self._start = start
            self._end = start + self.width
            if self._coarser is not None:
                self._coarser._reach(start)

    def _fold(self, count: int, total: float, low: float, high: float, last: float) -> None:
        """Take in a bucket a finer tier has closed."""
        self._held = True
        self._last = last
        self._count += count
        self._sum += total
        self._min = min(self._min, low)
        self._max = max(self._max, high)

    def _content(self) -> tuple[int, float, float, float, float] | None:
        """(count, sum, min, max, last) of the open bucket, the finer tiers' part included."""
        finer = None if self._finer is None else self._finer._content()
        if finer is None:
            if not self._held:
                return None
            return (self._count, self._sum, self._min, self._max, self._last)
        if not self._held:
            return finer
        count, total, low, high, last = finer
        own_low, own_high = self._min, self._max
        return (
            self._count + count,
            self._sum + total,
            low if low < own_low else own_low,
            high if high > own_high else own_high,
            last,
        )

    def _close(self) -> None:
        """Close the open bucket with what it holds itself, and fold it into the coarser."""
        if self._held:
            own = (self._count, self._sum, self._min, self._max, self._last)
            self.rows.append(*_bucket(self._start, *own))
            self.closed += 1
            if self._coarser is not None:
                self._coarser._fold(*own)
        self._start = math.nan
        self._end = -math.inf
        self._held = False
        self._count = 0
        self._sum = 0.0
        self._min = math.inf
        self._max = -math.inf


def _bucket(start: float, count: int, total: float, low: float, high: float, last: float) -> Bucket:
    """The row of a bucket starting at ``start`` that holds ``count`` finite values summing to
    ``total`` between ``low`` and ``high``, its newest value ``last`` (NaN: no finite one)."""
    if not count:
        return (start, 0.0, math.nan, math.nan, math.nan, last)
    return (start, float(count), total / count, low, high, last)


def cascade(specs: Iterable[TierSpec]) -> list[Tier]:
    """The tiers of ``specs``, finest first, each built on the one before it."""
    tiers: list[Tier] = []
    for spec in specs:
        tiers.append(Tier(spec, tiers[-1] if tiers else None))
    return tiers


class SeriesHistory:
    """The bounded history of one series, with whole-run first value, peak and count."""

    __slots__ = ("_latest", "count", "first", "peak", "raw", "tiers")

    def __init__(self, raw_capacity: int, tiers: Iterable[TierSpec]) -> None:
        self.raw = Ring(raw_capacity, 2)  # columns: t, value
        self.tiers = cascade(tiers)
        self.first: tuple[float, float] | None = None
        self.peak = -math.inf
        self.count = 0
        self._latest: tuple[float, float] | None = None  # the raw ring's newest row

    def add(self, t: float, value: float) -> None:
        if self.first is None:
            self.first = (t, value)
        if value > self.peak:  # False for NaN
            self.peak = value
        self.count += 1
        self.raw.append_pair(t, value)
        self._latest = (t, value)
        if self.tiers:
            self.tiers[0].add(t, value)

    def latest(self) -> tuple[float, float] | None:
        return self._latest

    def recent_values(self, count: int) -> list[float]:
        return self.raw.last(count, 1)

    def recent_median(self, count: int) -> float:
        """Median of the newest ``count`` finite values; NaN when there are none."""
        finite = [v for v in self.recent_values(count) if math.isfinite(v)]
        return statistics.median(finite) if finite else math.nan


class Store:
    """Histories keyed by ``(series, labels)``. Written by one thread (the sampler) only;
    sinks read it as a ``StoreView``."""

    def __init__(self, raw_capacity: int = 2048, tiers: Iterable[TierSpec] = DEFAULT_TIERS):
        self._raw_capacity = raw_capacity
        self._tiers = tuple(tiers)
        self._histories: dict[SeriesKey, SeriesHistory] = {}

    def add(self, sample: Sample) -> None:
        key = key_of(sample)
        history = self._histories.get(key)
        if history is None:
            history = self._histories[key] = SeriesHistory(self._raw_capacity, self._tiers)
        history.add(sample.t, sample.value)

    def extend(self, samples: Iterable[Sample]) -> None:
        histories = self._histories
        for sample in samples:  # ``add``'s body, without a call per sample
            key = (sample.series, sample.labels)
            history = histories.get(key)
            if history is None:
                history = histories[key] = SeriesHistory(self._raw_capacity, self._tiers)
            history.add(sample.t, sample.value)

    def get(self, key: SeriesKey) -> SeriesHistory | None:
        return self._histories.get(key)

    def __iter__(self) -> Iterator[tuple[SeriesKey, SeriesHistory]]:
        return iter(list(self._histories.items()))

    def __len__(self) -> int:
        """Series held (a series, once held, stays)."""
        return len(self._histories)


# What a sink may read of the store: the same objects, seen through protocols that offer no
# way to change them.


class RingView(Protocol):
    def __len__(self) -> int: ...

    def last(self, count: int, index: int) -> list[float]: ...


class TierView(Protocol):
    @property
    def width(self) -> float: ...

    @property
    def closed(self) -> int: ...

    def open_bucket(self) -> Bucket | None: ...

    def closed_since(self, closed: int) -> list[Bucket]: ...


class SeriesView(Protocol):
    @property
    def raw(self) -> RingView: ...

    @property
    def tiers(self) -> Sequence[TierView]: ...

    @property
    def first(self) -> tuple[float, float] | None: ...

    @property
    def peak(self) -> float: ...

    @property
    def count(self) -> int: ...

    def latest(self) -> tuple[float, float] | None: ...

    def recent_median(self, count: int) -> float: ...


class StoreView(Protocol):
    """Read-only access to a ``Store``."""

    def get(self, key: SeriesKey) -> SeriesView | None: ...

    def __iter__(self) -> Iterator[tuple[SeriesKey, SeriesView]]: ...
