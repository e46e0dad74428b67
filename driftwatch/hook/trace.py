"""Profiler traces on request: the hook's side of evidence capture.

At each probe (never per step) the hook looks for a new capture request beside its channel
(``driftwatch.channel.requests``); when there is one it starts the TensorFlow Profiler
(``tf.profiler.experimental.start``) into ``traces_dir(channel)/<id>/`` and asks for the
next probe at the step the trace should stop, so the per-step path stays what it was. It
answers with ``CAPTURE`` records: started, done (with the steps traced) or failed (why, in
the channel's meta). The hook never imports TensorFlow itself: a job that has not imported
it gets a failed answer. The reasoning behind the limits is in docs/capture.md.
"""

from __future__ import annotations

import logging
import math
import os
import sys
import time
from typing import Any

from driftwatch.channel.env import tf_cluster_tasks
from driftwatch.channel.paths import traces_dir
from driftwatch.channel.requests import RequestWatch, TraceRequest
from driftwatch.channel.ring import ChannelWriter
from driftwatch.channel.wire import CAPTURE_META, CaptureStatus, RecordKind

log = logging.getLogger(__name__)

TRACE_MAX_STEPS = 20
"""Steps one trace covers at most, whatever the request asks."""
TRACE_MAX_SECONDS = 60.0
"""A trace stops at the first probe this many seconds after it started, steps done or not."""
TRACE_FIRST_STEP = 100
"""No trace starts before this global step (warm-up: tracing, compiling, first batches)."""
TRACE_MIN_GAP_SECONDS = 30.0
"""Seconds between the starts of two traces of one process, at least (a request that comes
sooner waits)."""
TRACE_MAX_PER_PROCESS = 20
"""Traces one process takes at most, however often it is asked."""
MULTI_WORKER_REFUSAL = (
    "not taken in a process of a multi-worker TensorFlow job (TF_CONFIG names a cluster of "
    "several tasks): stopping the profiler there can abort the worker"
)
"""The answer to every trace request in such a process (docs/capture.md)."""


class ProfilerTraces:
    """One process's trace requests and its trace under way (one at a time)."""

    def __init__(self, writer: ChannelWriter) -> None:
        assert writer.path is not None
        self._writer = writer
        self._requests = RequestWatch(writer.path)
        self._dir = traces_dir(writer.path)
        self._waiting: TraceRequest | None = None  # came before TRACE_FIRST_STEP
        self._active: tuple[TraceRequest, int, float] | None = None  # request, step, start
        self._last_start = -math.inf
        self._taken = 0
        self._refusal = MULTI_WORKER_REFUSAL if tf_cluster_tasks(os.environ) > 1 else ""

    def at_probe(self, step: int, now: float, meta: dict[str, object], final: bool) -> int | None:
        """Stop a trace that is done (or every trace, when ``final``: fit ended, the job
        exits), start one that was asked for. Returns the step at which the next probe must
        come to stop the trace under way, or None."""
        if self._active is not None:
            request, first, started = self._active
            if final or step - first >= request.steps or now - started >= TRACE_MAX_SECONDS:
                self._stop(step - first, meta)
            else:
                return first + request.steps
        if final:
            return None
        waiting = self._requests.poll() or self._waiting
        if waiting is None:
            return None
        request = waiting
        if step < TRACE_FIRST_STEP or now - self._last_start < TRACE_MIN_GAP_SECONDS:
            self._waiting = request  # taken once warm-up is over, or the gap has passed
            return None
        self._waiting = None
        if self._refusal:
            self._answer(request, CaptureStatus.FAILED, 0, meta, self._refusal)
            return None
        if self._taken >= TRACE_MAX_PER_PROCESS:
            self._answer(request, CaptureStatus.FAILED, 0, meta, "too many traces already")
            return None
        return self._start(request, step, now, meta)

    def _start(
        self, request: TraceRequest, step: int, now: float, meta: dict[str, object]
    ) -> int | None:
        tf: Any = sys.modules.get("tensorflow")
        if tf is None:
            self._answer(request, CaptureStatus.FAILED, 0, meta, "TensorFlow is not loaded")
            return None
        steps = min(request.steps, TRACE_MAX_STEPS)
        try:
            logdir = self._dir / str(request.id)
            logdir.mkdir(parents=True, exist_ok=True)
            tf.profiler.experimental.start(str(logdir))
        except Exception as err:  # noqa: BLE001 - e.g. another profiler session is running
            self._answer(request, CaptureStatus.FAILED, 0, meta, f"cannot start: {err}")
            return None
        self._taken += 1
        self._last_start = now
        self._active = (TraceRequest(request.id, steps, request.label), step, now)
        self._answer(request, CaptureStatus.STARTED, 0, meta)
        return step + steps

    def _stop(self, steps: int, meta: dict[str, object]) -> None:
        assert self._active is not None
        request = self._active[0]
        self._active = None
        try:
            sys.modules["tensorflow"].profiler.experimental.stop()
        except Exception as err:  # noqa: BLE001 - a failed trace must never disturb training
            self._answer(request, CaptureStatus.FAILED, steps, meta, f"cannot stop: {err}")
            return
        self._answer(request, CaptureStatus.DONE, steps, meta)

    def _answer(
        self,
        request: TraceRequest,
        status: CaptureStatus,
        steps: int,
        meta: dict[str, object],
        error: str = "",
    ) -> None:
        if error:
            log.info("driftwatch: profiler trace %d not taken: %s", request.id, error)
            meta[CAPTURE_META] = {"id": request.id, "status": int(status), "error": error}
            self._writer.set_meta(meta)  # before the record that points at it
        self._writer.write(RecordKind.CAPTURE, request.id, time.time(), float(status), float(steps))
