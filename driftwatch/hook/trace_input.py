"""Input wait read from a TensorFlow Profiler trace, at the moments a trace is captured.

``fit`` (Keras 3, TensorFlow backend) fetches each batch inside its traced train function
(``iterator.get_next()`` in ``multi_step_on_iterator``), where no host-side timer can see it;
``fit_input`` times it continuously inside that graph, and a trace shows it too.
TensorFlow's kernel for that op records a TraceMe, ``IteratorGetNextOp::DoCompute``, on a
line of its own per iterator (``tf_data_iterator_get_next/<id>``) in the trace's host plane,
however the op was called (eagerly in a custom loop, or in ``fit``'s graph). Each event is the
wait for one batch; from one event's start to the next is one step. So over a capture of a few
steps, the share of step time waiting for input is the waits of all but the last batch over
the time from the first fetch to the last.

The TF Profiler's own input-pipeline analysis (``xspace_to_tools_data(...,
"input_pipeline_analyzer")``) fills its step breakdown from device step events only: on a
CPU-only trace it is empty (checked with TensorFlow 2.21), which is why this reads the events.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

GET_NEXT_EVENT = "IteratorGetNextOp::DoCompute"
"""The TraceMe TensorFlow's IteratorGetNext kernel records around fetching one batch."""
GET_NEXT_LINE = "tf_data_iterator_get_next"
"""Prefix of the host-plane lines holding those events, one line per iterator."""
MIN_BATCHES = 3
"""Batches a trace must hold for a share (two whole steps)."""


@dataclass(frozen=True, slots=True)
class InputWait:
    """What a trace says of the steps it holds: their share of time waiting for input."""

    share: float  # 0-1
    steps: int  # whole steps (fetch to next fetch) it is judged over
    step_seconds: float  # mean
    wait_seconds: float  # mean wait per step


def input_wait_in_trace(path: Path) -> InputWait | None:
    """The input wait of the busiest iterator in the ``.xplane.pb`` file ``path``; None when
    the trace holds fewer than ``MIN_BATCHES`` fetches. Raises ``OSError`` and protobuf's
    ``DecodeError`` for a file that cannot be read or parsed."""
    from tensorflow.tsl.profiler.protobuf import xplane_pb2

    space = xplane_pb2.XSpace()
    space.ParseFromString(path.read_bytes())
    fetches: list[tuple[int, int]] = []  # (start, duration) in picoseconds, busiest iterator
    for plane in space.planes:
        ids = {i for i, meta in plane.event_metadata.items() if meta.name == GET_NEXT_EVENT}
        if not ids:
            continue
        for line in plane.lines:
            if not line.name.startswith(GET_NEXT_LINE):
                continue
            line_start = line.timestamp_ns * 1000
            events = [
                (line_start + event.offset_ps, event.duration_ps)
                for event in line.events
                if event.metadata_id in ids
            ]
            if len(events) > len(fetches):
                fetches = events
    if len(fetches) < MIN_BATCHES:
        return None
    fetches.sort()
    span = fetches[-1][0] - fetches[0][0]
    waited = sum(duration for _, duration in fetches[:-1])
    steps = len(fetches) - 1
    if span <= 0:
        return None
    return InputWait(
        share=min(1.0, waited / span),
        steps=steps,
        step_seconds=span / steps / 1e12,
        wait_seconds=waited / steps / 1e12,
    )
