"""The protobuf wire format, as the event-file readers read it from bytes.

One reader of varints (``varint``), one decoder of a field's key and extent
(``field_size``), one writer of varints, and the keys of the event.proto, summary.proto and
tensor.proto fields that ``records.py`` and ``scalars.py`` read without parsing.

Failure is one rule for all of them: bytes that are no valid encoding raise ``Malformed``,
never ``IndexError`` or a wrong value. That is a varint that reaches ``end`` before its last
byte (cut short) or runs past 10 bytes (no 64-bit value is longer), a field whose payload
runs past ``end``, and a key of field number 0 or of a wire type without a length
(groups). Every caller turns it into what a corrupt record costs there: a walked record is
read whole and checked by its checksum (``records.py``); a record read without parsing is
parsed instead (``Tags.quick``), and a record protobuf refuses is skipped.
"""

from __future__ import annotations

VARINT, FIXED64, LENGTH_DELIMITED, FIXED32 = 0, 1, 2, 5
"""The wire types event files use (3 and 4, groups, are deprecated and never written)."""

_FIXED = {FIXED64: 8, FIXED32: 4}  # the payload length of each fixed-width wire type
_MAX_SHIFT = 63  # the shift of a varint's 10th byte: the last a 64-bit value needs
_UINT64 = (1 << 64) - 1


class Malformed(Exception):
    """Bytes that are no valid protobuf encoding: cut short, over-long, or of no known form."""


def key(number: int, wire_type: int) -> int:
    """The key of field ``number`` of ``wire_type``, as it is encoded when below 16."""
    return number << 3 | wire_type


# Event (event.proto)
WALL_TIME_KEY = key(1, FIXED64)  # double
STEP_KEY = key(2, VARINT)  # int64
SUMMARY_KEY = key(5, LENGTH_DELIMITED)  # Summary
# Summary and Summary.Value (summary.proto)
VALUE_KEY = key(1, LENGTH_DELIMITED)  # Summary.value, repeated
TAG_KEY = key(1, LENGTH_DELIMITED)  # Value.tag
SIMPLE_VALUE_KEY = key(2, FIXED32)  # Value.simple_value, a float
TENSOR_KEY = key(8, LENGTH_DELIMITED)  # Value.tensor, a TensorProto
METADATA_KEY = key(9, LENGTH_DELIMITED)  # Value.metadata, a SummaryMetadata
# TensorProto (tensor.proto)
DTYPE_KEY = key(1, VARINT)
SHAPE_KEY = key(2, LENGTH_DELIMITED)  # TensorShapeProto
CONTENT_KEY = key(4, LENGTH_DELIMITED)  # tensor_content, bytes
PACKED_VALUES_KEY = {1: key(5, LENGTH_DELIMITED), 2: key(6, LENGTH_DELIMITED)}
"""float_val (dtype 1) and double_val (dtype 2), packed: the key of each by its dtype."""


def varint(data: bytes, i: int, end: int) -> tuple[int, int]:
    """The varint at ``data[i:]`` (its low 64 bits, as protobuf reads it: an int64 below
    zero is 2**64 above it) and the index after it, read no further than ``end`` (at most
    ``len(data)``). ``Malformed`` if it does not end before ``end`` or within 10 bytes."""
    if i >= end:
        raise Malformed
    byte = data[i]
    if byte < 0x80:  # most varints: one byte
        return byte, i + 1
    value, shift = byte & 0x7F, 7
    i += 1
    while i < end:
        byte = data[i]
        value |= (byte & 0x7F) << shift
        i += 1
        if byte < 0x80:
            return value & _UINT64, i
        shift += 7
        if shift > _MAX_SHIFT:
            break
    raise Malformed


def field_size(data: bytes, i: int, end: int) -> tuple[int, int, int]:
    """The field at ``data[i:]``: its key, its header's length (the key's, and for a
    length-delimited field its length's) and its whole length. ``Malformed`` if the field
    is of number 0 or a wire type without a length, or its header runs past ``end``; a
    payload is measured, not read (it may run past ``end`` and past ``data``)."""
    field_key = data[i] if i < end else 0x80
    j = i + 1
    if field_key >= 0x80:
        field_key, j = varint(data, i, end)
    wire_type = field_key & 7
    if field_key >> 3 == 0:
        raise Malformed
    if wire_type == LENGTH_DELIMITED:
        length = data[j] if j < end else 0x80
        if length < 0x80:  # inline ``varint``: most lengths are one byte
            j += 1
        else:
            length, j = varint(data, j, end)
        return field_key, j - i, j - i + length
    if wire_type == VARINT:
        if j < end and data[j] < 0x80:
            return field_key, j - i, j + 1 - i
        _value, k = varint(data, j, end)
        return field_key, j - i, k - i
    fixed = _FIXED.get(wire_type)
    if fixed is None:
        raise Malformed
    return field_key, j - i, j - i + fixed


_ONE_BYTE = [bytes((n,)) for n in range(0x80)]  # varints of one byte, ready-made


def encode_varint(value: int) -> bytes:
    """``value`` (at least 0) as a varint."""
    if value < 0x80:
        return _ONE_BYTE[value]
    out = bytearray()
    while value > 0x7F:
        out.append(value & 0x7F | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)
