"""Keras ``fit``'s input wait, timed inside its train function's graph, where the job asks for
it (``ENABLE_ENV``; off by default for its cost, bench/RESULTS.md "Fit's input wait").

Keras 3's TensorFlow trainer fetches each batch inside its traced train function
(``iterator.get_next()`` in ``multi_step_on_iterator``), where no host-side timer sees it.
``install(tf)`` wraps ``OwnedIterator.get_next`` so that, while ``DriftwatchCallback`` calls
fit's train function (``FitInputTimer.armed``) and that call traces it, the fetch is built
between two ``tf.timestamp`` ops on the CPU: the first runs before the ``IteratorGetNext`` op
(a control edge), the second after its outputs, and the batch reaches the step only through
an ``IdentityN`` op that waits for the second (otherwise the step's first ops, ready at the same
moment, can run before it and count as wait). Their difference, and a batch, are added to a
two-element float64 variable on the CPU (``AssignAddVariableOp``), which the hook reads at
each probe (every 100 steps or 10 s; the first reading 12 steps in) and adds to the same
``input_wait_seconds`` and ``input_batches`` a custom loop's iterator patch fills:
``input_wait_share`` then follows as it does for custom loops. The per-step cost is those
few ops in the graph, no host call.

What the difference holds: the time the train function was blocked on the fetch, the op's
hand-off to tf.data's thread and back included. The TF Profiler's ``IteratorGetNextOp::
DoCompute`` event starts after the hand-off, so on a healthy pipeline this reads a tenth of
a millisecond or so more per batch (docs/hook.md, "Input wait"); a custom loop's timed
``next(it)`` includes the eager op's dispatch likewise.

Not timed (no ``input_wait_share``, as before): ``steps_per_execution > 1`` (Keras then
fetches the next batch with ``get_next_as_optional`` in the same loop body as the step, so
the fetch overlaps the step and its duration is not a wait), a distribution strategy other
than the default (its iterators are not ``OwnedIterator``), ``run_eagerly=True`` (the fetch
is eager; not a graph), and a train function traced before a ``DriftwatchCallback`` first
called it.
"""

from __future__ import annotations

import functools
import logging
import os
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from driftwatch.hook.core import Hook

log = logging.getLogger(__name__)

ENABLE_ENV = "DRIFTWATCH_FIT_INPUT_WAIT"
"""Set to ``1`` in the job's environment to time fit's input wait (off by default: its
ops cost about 25 µs of CPU a step, 2 % of the hook-overhead bench's step)."""

_PATCHED = "__driftwatch_patched__"


class FitInputTimer:
    """The process's wait accumulator and the flag that arms the ``get_next`` patch."""

    def __init__(self, tf: Any) -> None:
        self._tf = tf
        self.armed = False  # fit's train function is being called (and maybe traced)
        self.variable: Any = None  # [seconds waited, batches], float64 on the CPU
        self._read = (0.0, 0.0)  # the variable's value at the last probe
        self._hooks: set[int] = set()  # ids of the hooks that read it at their probes

    def timed_get_next(self, original: Callable[[Any], Any], iterator: Any) -> Any:
        """``original(iterator)`` in a graph, between two timestamps whose difference (and
        a batch) are added to the variable; the batch is released after the second."""
        tf = self._tf
        if self.variable is None:
            with tf.init_scope(), tf.device("/CPU:0"):
                self.variable = tf.Variable(
                    tf.zeros([2], tf.float64), trainable=False, name="driftwatch_input_wait"
                )
        with tf.device("/CPU:0"):
            start = tf.timestamp()
        with tf.control_dependencies([start]):
            batch = original(iterator)
        flat = tf.nest.flatten(batch)
        dense = [i for i, t in enumerate(flat) if isinstance(t, tf.Tensor)]
        with tf.device("/CPU:0"), tf.control_dependencies([flat[i] for i in dense]):
            end = tf.timestamp()
            self.variable.assign_add(tf.stack([end - start, tf.constant(1.0, tf.float64)]))
        if not dense:
            return batch
        with tf.control_dependencies([end]):  # one IdentityN op releases every tensor
            released = tf.identity_n([flat[i] for i in dense])
        for i, tensor in zip(dense, released, strict=True):
            flat[i] = tensor
        return tf.nest.pack_sequence_as(batch, flat)

    def report_to(self, hook: Hook) -> None:
        """Have ``hook`` read the accumulated waits at each of its probes (once per hook),
        its first reading within a dozen steps (``Hook.expect_input_wait``)."""
        if id(hook) not in self._hooks:
            self._hooks.add(id(hook))
            hook.check_at_probe(self.read)
            hook.expect_input_wait()

    def read(self, hook: Hook) -> None:
        """Add the waits and batches timed since the last reading to ``hook``'s, each new
        batch's wait taken as their mean (one read of a CPU variable: no device sync)."""
        if self.variable is None:
            return
        seconds, batches = (float(v) for v in self.variable.numpy())
        waited, fetched = seconds - self._read[0], round(batches - self._read[1])
        self._read = (seconds, batches)
        if fetched <= 0:
            return
        hook.add_input_wait(max(0.0, waited), fetched)


_timer: FitInputTimer | None = None


def enabled() -> bool:
    """Whether the job asked for fit's input wait (``ENABLE_ENV``)."""
    return os.environ.get(ENABLE_ENV) == "1"


def timer() -> FitInputTimer | None:
    """This process's timer, once ``install`` has run."""
    return _timer


def install(tf: Any) -> FitInputTimer | None:
    """Wrap ``OwnedIterator.get_next`` of the ``tensorflow`` module ``tf`` (once); None when
    TensorFlow has moved it (fit's steps are still timed, its input wait is not)."""
    global _timer
    if _timer is not None:
        return _timer
    try:
        from tensorflow.python.data.ops import iterator_ops
    except ImportError as err:
        log.info("driftwatch: tf.data iterators not found, fit's input wait unknown: %r", err)
        return None
    state = _timer = FitInputTimer(tf)
    iterator_class = iterator_ops.OwnedIterator
    original: Callable[[Any], Any] = iterator_class.get_next
    if getattr(original, _PATCHED, False):
        return state

    @functools.wraps(original)
    def get_next(self: Any) -> Any:
        if not state.armed or tf.executing_eagerly() or tf.distribute.has_strategy():
            return original(self)
        return state.timed_get_next(original, self)

    setattr(get_next, _PATCHED, True)
    iterator_class.get_next = get_next
    return state
