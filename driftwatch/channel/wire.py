"""The wire protocol: what the records in a channel mean, for the hook (the writer) and the
hook source (the reader).

Stdlib only: the monitoring side imports this without TensorFlow.

Records are ``(kind, key, t, a, b)`` with ``t`` in unix seconds:

- ``STEP``: one per train-function call, written when the next one starts. ``key`` is the
  global step reached, ``a`` the wall-clock seconds per step over the period (start to next
  start, divided by the steps it ran), ``b`` the seconds per step of that period spent
  outside the train step (other callbacks, input pipeline, host work).
- ``VALUE``: a probed value; ``key`` indexes ``meta["series"]``, a list of
  ``[series, {label: value}]`` pairs; ``a`` is the value.
- ``EPOCH``: ``key`` the epoch index, ``a`` its wall-clock seconds, ``b`` of which validation.
- ``CAPTURE``: the hook's answer to a profiler-trace request (``driftwatch.channel.requests``):
  ``key`` the request's id, ``a`` a ``CaptureStatus``, ``b`` the steps traced; why one
  failed is in ``meta["capture"]``.
"""

from __future__ import annotations

import enum


class RecordKind(enum.IntEnum):
    STEP = 1
    VALUE = 2
    EPOCH = 3
    CAPTURE = 4


class CaptureStatus(enum.IntEnum):
    """What became of a trace request, as a ``CAPTURE`` record's ``a``."""

    STARTED = 1
    DONE = 2
    FAILED = 3


VALUE_SERIES: dict[int, tuple[str, str]] = {
    RecordKind.STEP: ("step_seconds", "step_gap_seconds"),
    RecordKind.EPOCH: ("epoch_seconds", "validation_seconds"),
}
"""The series of a record's two values (``a``, ``b``), by kind (``VALUE``: see the module)."""
SERIES_META = "series"
"""Meta key: the list of ``[series, labels]`` that ``VALUE`` records index."""
RUNTIME_META = "runtime"
"""Meta key: ``{"python": ..., "tensorflow": ..., "keras": ...}``, the job's versions."""
CAPTURE_META = "capture"
"""Meta key: ``{"id": ..., "status": ..., "error": ...}``, the hook's latest trace request."""
