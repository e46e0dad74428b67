"""The TFRecord framing of event files, read by the records' headers.

A TFRecord is its data's length (8 bytes, little-endian), the masked CRC-32C of those 8
bytes (4), the data, and the data's masked CRC-32C (4). Every header is read and its
length's checksum checked, so the framing is never trusted blindly; what happens to the
data depends on its length (the rule, and why, in docs/analyze.md, "Reading event files"):

- a record of up to ``SMALL_RECORD_BYTES`` (every scalar a training job logs) is read
  whole, its checksum checked, and handed on as it is;
- a longer one (images, histograms, audio, graphs, profiles) is *walked*: its protobuf
  fields are read one by one, and the payloads no scalar and no step can be in (field
  lengths above ``KEEP_FIELD_BYTES`` in the places ``EVENT`` names) are skipped by their
  length, never read. What is handed on is the record re-encoded without those payloads: a
  valid ``Event`` with the same wall time, step, summary tags and metadata, every small
  value whole (a TF1 merged summary's scalars too), and each large tensor's dtype and
  shape; a large value whose tag the reader already knows holds no scalar (``Records``'
  ``dropped_tags``: an image logged every step) is left out from its tag on, unwalked.
  Its skipped bytes are not checksummed (not reading them is the point); its
  structure is checked instead, and a record that does not walk cleanly (a field running
  past its end, an unknown wire type: ``protowire.Malformed``) is read whole and checked as
  a small one is.

Corruption is handled as tensorboard's writer leaves it to readers: a record whose data
fails its checksum is skipped (its length was intact), and a file whose length fails its
checksum is no longer read (nothing after it can be found reliably); either is logged once
per file. A record not yet completely written is retried on the next read.
"""

from __future__ import annotations

import logging
import os
import struct
from collections.abc import Callable, Container, Iterator, Mapping
from dataclasses import dataclass, field

from driftwatch.sources.protowire import (
    STEP_KEY,
    SUMMARY_KEY,
    TAG_KEY,
    VALUE_KEY,
    WALL_TIME_KEY,
    Malformed,
    encode_varint,
    field_size,
    varint,
)

log = logging.getLogger(__name__)

SMALL_RECORD_BYTES = 64 * 1024
"""Records up to this length are read whole and checksummed; longer ones are walked (bytes)."""
KEEP_FIELD_BYTES = 1024
"""In a walked record, a payload field up to this length is kept, a longer one skipped (bytes)."""
READ_BYTES = 1024
"""Bytes read at a time: a window of small records, or a walked record's next fields."""

_HEADER = struct.Struct("<QI")  # a record's length and the length's masked CRC-32C
_CRC = struct.Struct("<I")
_LENGTH_OF_LENGTH = 8
_KEY_READ = 20  # a field's key and length: two varints of at most 10 bytes each
_HEAD_READ = 32  # an event's wall time, step and its summary's key and length, at most
_TAG_READ = 256  # a summary value's key and length, and its tag's (a longer tag: walked)


@dataclass(frozen=True, slots=True)
class Message:
    """How a walked protobuf message is re-encoded: which fields are walked in turn (when
    longer than ``KEEP_FIELD_BYTES``), which are kept whatever their length, and whether the
    others are dropped (``only``) or kept when short and emptied when long."""

    walked: Mapping[int, Message] = field(default_factory=dict)
    kept: frozenset[int] = frozenset()
    only: bool = False
    tagged: bool = False  # its first field is a tag: dropped whole if the reader drops the tag


# Field numbers of tensorboard/compat/proto: event.proto, summary.proto, tensor.proto.
_TENSOR = Message(kept=frozenset({1, 2}), only=True)  # dtype, tensor_shape: a scalar's size
_PLUGIN_DATA = Message(kept=frozenset({1}))  # plugin_name (its content can go)
_METADATA = Message(walked={1: _PLUGIN_DATA})  # data_class is a varint: always kept
_VALUE = Message(walked={8: _TENSOR, 9: _METADATA}, kept=frozenset({1}), tagged=True)
_SUMMARY = Message(walked={1: _VALUE})
_TAGGED_RUN_METADATA = Message(kept=frozenset({1}))  # tag (run_metadata can go)
EVENT = Message(walked={5: _SUMMARY, 8: _TAGGED_RUN_METADATA})
"""What a walked event keeps. A long field emptied rather than dropped (an image, a
histogram, a graph) stays in its ``oneof``, so the event is still of the same kind."""


class _Short(Exception):
    """The file ends before the bytes asked for: a record still being written."""


class _Window:
    """A file's bytes, read ``READ_BYTES`` (or more) at a time with ``pread``."""

    __slots__ = ("data", "fd", "start")

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self.start = 0
        self.data = b""

    def at(self, offset: int, n: int) -> int:
        """The index in ``data`` of the file's bytes ``[offset, offset + n)``."""
        index = offset - self.start
        if index < 0 or index + n > len(self.data):
            self.data = os.pread(self.fd, max(n, READ_BYTES), offset)
            self.start, index = offset, 0
            if n > len(self.data):
                raise _Short
        return index


def _tag(window: _Window, start: int, end: int) -> bytes | None:
    """The tag (field 1, a string) that the message at file bytes ``[start, end)`` begins
    with; None if it begins with another field."""
    i = window.at(start, min(_KEY_READ, end - start))
    data = window.data
    if data[i] != TAG_KEY:
        return None
    length, j = varint(data, i + 1, i + min(_KEY_READ, end - start))
    begin = start + j - i
    if begin + length > end:
        raise Malformed
    i = window.at(begin, length)
    return window.data[i : i + length]


def walk(
    window: _Window, start: int, end: int, message: Message, dropped: Container[bytes]
) -> bytes:
    """The message at file bytes ``[start, end)`` re-encoded as ``message`` says; a tagged
    message whose tag is in ``dropped`` is left out whole. Each field is measured by its
    header; a long payload is handed to ``_long_field``, every other field copied whole."""
    out: list[bytes] = []
    kept, only = message.kept, message.only
    missing = set(kept) if only else None  # kept fields not seen yet
    pos = start
    data = window.data
    n = len(data)
    while pos < end:
        if missing is not None and not missing:
            break  # nothing more to keep: the rest is never read
        i = pos - window.start  # inline ``window.at(pos, ...)``: the hot path
        if i < 0 or i + _KEY_READ > n:
            i = window.at(pos, _KEY_READ if end - pos > _KEY_READ else end - pos)
            data = window.data
            n = len(data)
        # The window holds _KEY_READ bytes at least, or to the end: the field's header.
        key, header, size = field_size(data, i, min(i + end - pos, n))
        if pos + size > end:
            raise Malformed
        if size - header > KEEP_FIELD_BYTES:  # only a length-delimited payload is so long
            parts = _long_field(window, pos, key, header, size, message, dropped)
            if parts is not None:
                out += parts
                pos += size
                data = window.data
                n = len(data)
                continue
        if missing is not None:
            if key >> 3 not in kept:
                pos += size
                continue
            missing.discard(key >> 3)
        if i + size > n:
            i = window.at(pos, size)
            data = window.data
            n = len(data)
        out.append(data[i : i + size])
        pos += size
    return b"".join(out)


def _long_field(
    window: _Window,
    pos: int,
    key: int,
    header: int,
    size: int,
    message: Message,
    dropped: Container[bytes],
) -> tuple[bytes, ...] | None:
    """The field at file byte ``pos``, of a payload longer than ``KEEP_FIELD_BYTES``, as
    ``message`` re-encodes it: walked (left out if its tag is in ``dropped``), emptied, or
    left out; None if ``message`` keeps it whole."""
    number = key >> 3
    inner = message.walked.get(number)
    if inner is not None:
        start, end = pos + header, pos + size
        if inner.tagged and _tag(window, start, end) in dropped:
            return ()
        inside = walk(window, start, end, inner, dropped)
        return encode_varint(key), encode_varint(len(inside)), inside
    if number in message.kept:
        return None
    return () if message.only else (encode_varint(key) + b"\0",)  # emptied: same field, no bytes


_EMPTY_SUMMARY = bytes((SUMMARY_KEY, 0))


def skim(window: _Window, start: int, end: int, dropped: Container[bytes]) -> bytes | None:
    """The commonest large record, re-encoded as ``walk`` would and in a few steps: an event
    of a wall time, a step and a summary whose values all have tags in ``dropped`` (an
    image or a histogram logged every step). None for any other record."""
    i = window.at(start, min(_HEAD_READ, end - start))
    data = window.data
    limit = i + min(_HEAD_READ, end - start)
    j = i + 9 if data[i] == WALL_TIME_KEY else i  # a double after its key
    if j < limit and data[j] == STEP_KEY:
        _step, j = varint(data, j + 1, limit)
    if j >= limit or data[j] != SUMMARY_KEY:
        return None
    head = data[i:j]
    length, j = varint(data, j + 1, limit)
    pos = start + j - i
    if pos + length != end:
        return None  # fields after the summary
    while pos < end:  # each value: its key, length and tag, read where the window has them
        n = min(_TAG_READ, end - pos)
        i = pos - window.start
        if i < 0 or i + n > len(data):
            i = window.at(pos, n)
            data = window.data
        limit = i + n
        if data[i] != VALUE_KEY:
            return None
        length, j = varint(data, i + 1, limit)
        pos += j - i + length  # the value's end
        if pos > end or j >= limit or data[j] != TAG_KEY:
            return None
        length, j = varint(data, j + 1, limit)
        if j + length > limit or data[j : j + length] not in dropped:
            return None
    return head + _EMPTY_SUMMARY


MaskedCrc = Callable[[bytes], int]
"""TFRecord's checksum: the masked CRC-32C of some bytes."""


class Records:
    """The TFRecords of one file, read from where the last read stopped (``offset``)."""

    def __init__(
        self, path: str, masked_crc: MaskedCrc, dropped_tags: Container[bytes] = frozenset()
    ) -> None:
        self.path = path
        self.dropped_tags = dropped_tags  # a walked record's values of these tags are left out
        self.offset = 0  # just past the last whole record
        self.size = 0  # the file's size when it was last read
        self.behind = False  # the last read was stopped before the file's end
        self._crc = masked_crc
        self._skipped = False  # a record was skipped: warned
        self.broken = False  # the framing was lost: the file is not read any more

    def __iter__(self) -> Iterator[bytes]:
        """Whole records after ``offset``, each once (a long one walked: see the module);
        ``OSError`` if the file cannot be read; none once the framing is lost."""
        return iter(()) if self.broken else self._read()

    def _read(self) -> Iterator[bytes]:
        """The records ``__iter__`` hands on: the file is opened when the first is asked
        for, and closed after the last (or when the iteration is dropped)."""
        fd = os.open(self.path, os.O_RDONLY | os.O_CLOEXEC)
        try:
            self.size = size = os.fstat(fd).st_size
            window = _Window(fd)
            crc = self._crc
            while self.offset + _HEADER.size <= size:
                i = self.offset - window.start  # inline ``window.at``: the path of every record
                data = window.data
                if i < 0 or i + _HEADER.size > len(data):
                    i = window.at(self.offset, _HEADER.size)
                    data = window.data
                length, length_crc = _HEADER.unpack_from(data, i)
                if crc(data[i : i + _LENGTH_OF_LENGTH]) != length_crc:
                    self._lose_framing()
                    return
                start = self.offset + _HEADER.size
                end = start + length + _CRC.size
                if end > size:
                    return  # not completely written yet
                try:
                    if length <= SMALL_RECORD_BYTES:  # inline: the path of every scalar
                        i += _HEADER.size
                        if i + length + _CRC.size > len(data):
                            i = window.at(start, length + _CRC.size)
                            data = window.data
                        whole = data[i : i + length]
                        (data_crc,) = _CRC.unpack_from(data, i + length)
                        record = whole if crc(whole) == data_crc else None
                        if record is None:
                            self._skip()
                    else:
                        record = self._large(window, start, length)
                except _Short:
                    return  # shorter than it was a moment ago: read again next time
                self.offset = end
                if record is not None:
                    yield record
        finally:
            os.close(fd)

    def _small(self, window: _Window, start: int, length: int) -> bytes | None:
        """The record's data, if it passes its checksum."""
        i = window.at(start, length + _CRC.size)
        data = window.data
        record = data[i : i + length]
        if self._crc(record) == _CRC.unpack_from(data, i + length)[0]:
            return record
        self._skip()
        return None

    def _large(self, window: _Window, start: int, length: int) -> bytes | None:
        """The record walked; read whole and checked if it does not walk cleanly."""
        try:
            dropped = self.dropped_tags
            skimmed = skim(window, start, start + length, dropped) if dropped else None
            if skimmed is not None:
                return skimmed
            return walk(window, start, start + length, EVENT, dropped)
        except Malformed:
            log.debug("a record of %s does not walk cleanly: read whole", self.path)
        return self._small(window, start, length)

    def _skip(self) -> None:
        if not self._skipped:
            self._skipped = True
            log.warning(
                "event file %s: a record fails its checksum and is skipped "
                "(further corrupt records of this file are skipped silently)",
                self.path,
            )

    def _lose_framing(self) -> None:
        self.broken = True
        log.warning(
            "event file %s is corrupt at byte %d (a record's length fails its "
            "checksum): nothing after it can be read; the file is no longer read",
            self.path,
            self.offset,
        )
