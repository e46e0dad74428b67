"""Which values of an event file are scalars, and the training progress they tell.

A value is a scalar if its tag's data class is "scalar" and it holds one number. The data
class is tensorboard's: ``data_compat`` then ``dataclass_compat``, as its loader migrates
events. ``Tags`` decides it without building the migrated protos (a TF1 value of every
scalar event costs a tensor proto and a metadata proto there); tests/test_eventfiles.py
compares the two on files TensorFlow wrote. tensorboard itself is imported by
``eventfiles.py`` only, which hands its parts over as ``Protos``.
"""

from __future__ import annotations

import logging
import math
import os
import struct
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, NamedTuple

from driftwatch.series import Sample
from driftwatch.series.training import MAX_NONFINITE_NAMES, nonfinite_role
from driftwatch.sources.protowire import (
    CONTENT_KEY,
    DTYPE_KEY,
    METADATA_KEY,
    PACKED_VALUES_KEY,
    SHAPE_KEY,
    SIMPLE_VALUE_KEY,
    STEP_KEY,
    SUMMARY_KEY,
    TAG_KEY,
    TENSOR_KEY,
    VALUE_KEY,
    WALL_TIME_KEY,
    Malformed,
    varint,
)
from driftwatch.sources.records import MaskedCrc

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Protos:
    """The parts of tensorboard (and the checksum) event files are read with."""

    version: str
    masked_crc32c: MaskedCrc  # TFRecord's checksum
    crc: str  # how it is computed, for ``describe``
    parse: Callable[[bytes], Any]  # a record -> its Event
    make_ndarray: Callable[[Any], Any]
    decode_error: type[Exception]  # what parsing a record that is no event raises
    plugin_class: dict[str, int]  # data class of a plugin's summaries that name none
    legacy_plugin: dict[str, str]  # the plugin of each TF1 summary value kind
    run_graph_tag: str  # the tag a graph event becomes


_MASK_DELTA = 0xA282EAD8


def masked(crc32c: Callable[[bytes], int]) -> MaskedCrc:
    """TFRecord's masked CRC-32C, from a CRC-32C."""

    def masked_crc32c(data: bytes) -> int:
        crc = crc32c(data)
        return (((crc >> 15) | (crc << 17)) + _MASK_DELTA) & 0xFFFFFFFF

    return masked_crc32c


class Scalar(NamedTuple):
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
        # (tag with its directory's name, role) -> non-finite values it held
        self.nonfinite_by_tag: dict[tuple[str, str], int] = {}
        self.top: tuple[int, float] | None = None  # highest step, wall time first logged
        self._last: dict[tuple[str, str], tuple[int, float]] = {}  # key -> (step, wall time)

    def nonfinite_samples(self, t: float) -> list[Sample]:
        """``nonfinite_total`` and, for each tag that held one, ``nonfinite_by_name_total``."""
        return [Sample("nonfinite_total", float(self.nonfinite), t)] + [
            Sample("nonfinite_by_name_total", float(n), t, (("name", name), ("role", role)))
            for (name, role), n in self.nonfinite_by_tag.items()
        ]

    def feed(self, scalar: Scalar) -> float | None:
        """Seconds per step if ``scalar`` advances the highest step, else None."""
        if not math.isfinite(scalar.value):
            self.nonfinite += 1
            directory, tag = scalar.key
            name = f"{os.path.basename(directory)}/{tag}" if directory else tag
            key = (name, nonfinite_role(tag))
            counts = self.nonfinite_by_tag
            if key not in counts and len(counts) >= MAX_NONFINITE_NAMES:
                key = ("(others)", key[1])
            counts[key] = counts.get(key, 0) + 1
        previous = self._last.get(scalar.key)
        self._last[scalar.key] = (scalar.step, scalar.wall_time)
        if self.top is not None and scalar.step <= self.top[0]:
            return None
        self.top = (scalar.step, scalar.wall_time)
        if previous is None:  # else its step is below the old top, so below this one
            return None
        seconds = (scalar.wall_time - previous[1]) / (scalar.step - previous[0])
        return seconds if seconds > 0 else None


_SCALAR_SHAPE_DTYPES = {1: struct.Struct("=f"), 2: struct.Struct("=d")}  # float, double
_NUMERIC_DTYPES = frozenset({1, 2, 3, 4, 5, 6, 9, 10, 14, 17, 19, 22, 23})
"""TensorProto dtypes a scalar can have: float, double, (u)int8-64, bool, bfloat16, half."""


class Tags:
    """Which values of one file are scalars, and their values.

    A value is a scalar if its tag's data class is "scalar" and it holds one number. The
    data class is tensorboard's (``data_compat`` then ``dataclass_compat``, as its loader
    migrates events): a TF1 value's kind names its plugin (``simple_value``: scalars); a
    tag's first metadata in the file decides whether the plugin's class applies; later
    events of a tag may carry no metadata. Decided here without building migrated protos
    (the tests compare this with tensorboard's own migration).
    """

    def __init__(self, tb: Protos) -> None:
        self._tb = tb
        self._first: dict[str, tuple[str, int]] = {}  # tag -> its first (plugin, data class)
        self._scalar: set[str] = set()  # tags whose latest metadata said "scalar"
        # Tags no value can change (their first metadata's plugin decides, and did): whether
        # they are scalars. Most tags, after their first value: these skip the metadata.
        self._settled: dict[str, bool] = {}
        self.never_scalar: set[bytes] = set()
        """The settled tags that are no scalars, UTF-8: their values need not be read."""
        self._scalar_tags: dict[bytes, str] = {}  # the settled scalar tags, by their UTF-8

    def scalars(self, values: Iterable[Any]) -> list[tuple[str, float]]:
        """The tag and number of each scalar among ``values`` (``Summary.Value``s)."""
        found = []
        settled_of = self._settled.get
        for value in values:
            tag = value.tag
            settled = settled_of(tag)
            if settled is None:
                settled = self._judge(value)
            if not settled:
                continue
            kind = value.WhichOneof("value")
            if kind == "tensor":
                number = self._number(value.tensor)
                if number is not None:
                    found.append((tag, number))
            elif kind == "simple_value":
                found.append((tag, float(value.simple_value)))
        return found

    def _judge(self, value: Any) -> bool:
        """Whether ``value``'s tag is a scalar, once its metadata is taken in."""
        tag = value.tag
        kind = value.WhichOneof("value")
        legacy = self._tb.legacy_plugin.get(kind) if kind is not None else None
        if legacy is not None:  # becomes a tensor with its plugin's metadata
            plugin, data_class, has_metadata = legacy, 0, True
        elif value.HasField("metadata"):
            metadata = value.metadata
            plugin, data_class = metadata.plugin_data.plugin_name, metadata.data_class
            has_metadata = True
        else:
            plugin, data_class, has_metadata = "", 0, False
        first = self._first.setdefault(tag, (plugin, data_class))
        settles = self._tb.plugin_class.get(first[0]) if first[1] == 0 else None
        if has_metadata:
            if first[1] == 0:  # unknown: the first metadata's plugin decides
                data_class = self._tb.plugin_class.get(first[0], data_class)
            if data_class == 1:
                self._scalar.add(tag)
            else:
                self._scalar.discard(tag)
        scalar = tag in self._scalar
        if settles is not None and scalar == (settles == 1):
            self._settled[tag] = scalar
            if scalar:
                self._scalar_tags[tag.encode()] = tag
            else:
                self.never_scalar.add(tag.encode())
        return scalar

    def not_scalar(self, tag: str) -> None:
        """A tag that a graph or run-metadata event took: no longer a scalar."""
        self._scalar.discard(tag)
        self._settled.pop(tag, None)
        self.never_scalar.discard(tag.encode())
        self._scalar_tags.pop(tag.encode(), None)

    def quick(self, record: bytes) -> tuple[float, int, list[tuple[str, float]]] | None:
        """A summary event's wall time, step, and the tag and number of each of its scalars,
        read from the record's bytes where it has the form writers give it and each of its
        tags has settled (most records after a tag's first): ``scalars`` without parsing the
        record. None otherwise: parse it and ask ``scalars``."""
        try:
            return _quick_summary(record, self._scalar_tags, self.never_scalar)
        except (IndexError, struct.error, Malformed):  # cut short: not the usual form
            return None

    def _number(self, tensor: Any) -> float | None:
        """The one number of ``tensor``, as ``make_ndarray`` reads it; None if it holds
        another count of numbers (or none), or something else than numbers."""
        dtype = tensor.dtype
        if dtype not in _NUMERIC_DTYPES:
            return None
        fast = _SCALAR_SHAPE_DTYPES.get(dtype)
        if fast is not None and not tensor.tensor_shape.dim:  # the forms writers use
            content = tensor.tensor_content
            if len(content) == fast.size:
                return float(fast.unpack(content)[0])
            values = tensor.float_val if dtype == 1 else tensor.double_val
            if not content and len(values) == 1:
                return float(values[0])
        try:
            array = self._tb.make_ndarray(tensor)
        except (ValueError, TypeError, ArithmeticError) as err:  # a writer's bug
            log.debug("a scalar tensor that cannot be read: %s", err)
            return None
        return float(array.ravel()[0]) if array.size == 1 else None


_DOUBLE, _FLOAT = struct.Struct("<d"), struct.Struct("<f")


def _quick_summary(
    record: bytes, scalar_tags: dict[bytes, str], never_scalar: set[bytes]
) -> tuple[float, int, list[tuple[str, float]]] | None:
    """``Tags.quick``: an event of a wall time, a step and a summary (each optional, in that
    order), each value of which is its tag then a number (a float, or a float or double
    tensor of no dimensions) or anything of a tag that is no scalar, and maybe metadata."""
    end = len(record)
    head = _summary_head(record, end)
    if head is None:
        return None
    wall_time, step, i = head
    found = []
    while i < end:
        if record[i] != VALUE_KEY:
            return None
        length, i = varint(record, i + 1, end)
        value_end = i + length
        if value_end > end or record[i] != TAG_KEY:
            return None
        length, i = varint(record, i + 1, end)
        name = record[i : i + length]
        i += length
        if i > value_end:
            return None
        tag = scalar_tags.get(name)
        if tag is not None:
            number = _value_number(record, i, value_end, end)
            if number is None:
                return None
            found.append((tag, number))
        elif name not in never_scalar:
            return None  # a tag not settled yet: its metadata may decide
        i = value_end
    return wall_time, step, found


def _summary_head(record: bytes, end: int) -> tuple[float, int, int] | None:
    """The wall time and step of an event whose last field is its summary, and where the
    summary's values start; None for an event of another form."""
    wall_time, i = (
        (_DOUBLE.unpack_from(record, 1)[0], 9) if record[0] == WALL_TIME_KEY else (0.0, 0)
    )
    step = 0
    if record[i] == STEP_KEY:
        step, i = varint(record, i + 1, end)
        if step >= 1 << 63:
            step -= 1 << 64  # an int64 below zero
    if record[i] != SUMMARY_KEY:
        return None
    length, i = varint(record, i + 1, end)
    if i + length != end:
        return None  # fields after the summary, or fewer bytes
    return wall_time, step, i


def _value_number(record: bytes, i: int, value_end: int, end: int) -> float | None:
    """The number of a scalar's value whose tag ends at ``record[i]``: a float, or a tensor
    ``_tensor_number`` reads, then maybe metadata, up to ``value_end``; None for any other
    value."""
    if i >= value_end:
        return None
    key = record[i]
    if key == SIMPLE_VALUE_KEY:
        number, i = _FLOAT.unpack_from(record, i + 1)[0], i + 5
    elif key == TENSOR_KEY:
        length, i = varint(record, i + 1, end)
        tensor_end = i + length
        if tensor_end > value_end:
            return None
        number = _tensor_number(record, i, tensor_end)
        if number is None:
            return None
        i = tensor_end
    else:
        return None
    if i < value_end and record[i] == METADATA_KEY:
        length, i = varint(record, i + 1, end)
        i += length
    return float(number) if i == value_end else None


def _tensor_number(record: bytes, i: int, end: int) -> float | None:
    """The one number of a float or double tensor of no dimensions at ``record[i:end]``, as
    ``Tags._number`` reads it; None for any other tensor."""
    if end - i < 4 or record[i] != DTYPE_KEY:
        return None
    dtype = record[i + 1]
    fast = _SCALAR_SHAPE_DTYPES.get(dtype)
    if fast is None:
        return None
    i += 2
    if i < end and record[i] == SHAPE_KEY:
        if record[i + 1] != 0:
            return None  # dimensions (or an unknown rank): make_ndarray decides
        i += 2
    if i >= end:
        return None
    key, length = record[i], record[i + 1]
    if key not in (CONTENT_KEY, PACKED_VALUES_KEY[dtype]) or length != fast.size:
        return None  # other values, or not one number
    if i + 2 + length != end:
        return None
    return float(fast.unpack_from(record, i + 2)[0])
