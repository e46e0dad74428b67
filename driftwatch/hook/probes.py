"""TensorFlow probes run every N steps or T seconds: allocator memory and tracing counts.

Each probe handles its own error forms and switches itself off, logging once, rather than
disturb training.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator
from typing import Any

from driftwatch.series import Labels

log = logging.getLogger(__name__)

Reading = tuple[str, Labels, float]
"""(series, labels, value)."""

MAX_UNWRAP_DEPTH = 6
IDLE_ALLOCATOR_READS = 10
"""Reads of a zero allocator peak after which a device counts as keeping no statistics."""


def traced_functions(fn: object) -> Iterator[Any]:
    """The ``tf.function`` objects behind ``fn``: itself, or reachable through ``__wrapped__``
    and closures (Keras 3 wraps its ``tf.function`` train step in plain Python functions)."""
    seen: set[int] = set()
    pending: list[tuple[Any, int]] = [(fn, 0)]
    while pending:
        obj, depth = pending.pop()
        if id(obj) in seen or depth > MAX_UNWRAP_DEPTH:
            continue
        seen.add(id(obj))
        if hasattr(obj, "experimental_get_tracing_count"):
            yield obj
            continue
        wrapped = getattr(obj, "__wrapped__", None)
        if wrapped is not None:
            pending.append((wrapped, depth + 1))
        for cell in getattr(obj, "__closure__", None) or ():
            try:
                content = cell.cell_contents
            except ValueError:  # an empty cell
                continue
            if callable(content):
                pending.append((content, depth + 1))


CPU_BFC_ENV = "TF_CPU_ALLOCATOR_USE_BFC"
"""TensorFlow's switch to its BFC allocator on CPU, whose statistics count the job's tensors."""


class TensorflowProbes:
    """Reads ``get_memory_info`` of every GPU, and of the CPU when its BFC allocator is on
    (``CPU_BFC_ENV``): the default CPU allocator answers too, but its figures stayed flat
    while a Keras job kept every batch's tensors (see docs/hook.md); and tracing counts."""

    def __init__(self) -> None:
        self._devices: list[str] | None = None  # resolved on the first read
        self._zero_peaks: dict[str, int] = {}  # device: reads that answered a zero peak
        self._functions: list[tuple[Any, int]] = []  # (tf.function, its count when first read)

    def watch(self, fn: object) -> None:
        """Count the retracing of the ``tf.function`` objects behind ``fn``.

        Each function's traces up to the first reading are its normal first traces (Keras
        traces a new model's train function a few times): only later ones are counted, so
        a search that builds one model after another is not mistaken for retracing.
        """
        for function in traced_functions(fn):
            if all(function is not known for known, _ in self._functions):
                self._functions.append((function, -1))

    def read(self) -> list[Reading]:
        readings = self._memory()
        if self._functions:
            retraced = 0
            for i, (function, first) in enumerate(self._functions):
                count = int(function.experimental_get_tracing_count())
                if first < 0:  # the first reading: its traces so far are the normal ones
                    self._functions[i] = (function, count)
                    first = count
                retraced += count - first
            readings.append(("tracing_count", (), float(retraced)))
        return readings

    def _memory(self) -> list[Reading]:
        import tensorflow as tf

        if self._devices is None:
            cpu = os.environ.get(CPU_BFC_ENV, "").lower() in ("1", "true")
            self._devices = [
                d.name.removeprefix("/device:")
                for d in tf.config.list_logical_devices()
                if d.device_type == "GPU" or (cpu and d.device_type == "CPU")
            ]
        readings: list[Reading] = []
        for device in list(self._devices):
            try:
                info = tf.config.experimental.get_memory_info(device)
            except (ValueError, tf.errors.OpError) as err:
                # "No matching devices" (device gone) or an allocator that keeps no stats.
                self._drop(device, str(err))
                continue
            if info["peak"] == 0:  # nothing placed yet, or the plain CPU allocator (no stats)
                zeros = self._zero_peaks[device] = self._zero_peaks.get(device, 0) + 1
                if zeros >= IDLE_ALLOCATOR_READS:
                    self._drop(device, "its allocator keeps no statistics")
                continue
            labels = (("device", device),)
            readings.append(("tf_allocator_current_bytes", labels, float(info["current"])))
            readings.append(("tf_allocator_peak_bytes", labels, float(info["peak"])))
        return readings

    def _drop(self, device: str, why: str) -> None:
        assert self._devices is not None
        self._devices.remove(device)
        log.info("driftwatch: not reading TensorFlow memory of %s: %s", device, why)
