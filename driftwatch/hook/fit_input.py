"""Keras ``fit``'s input wait, timed on a sample of its steps, by default.

Keras 3's TensorFlow trainer fetches each batch inside its traced train function
(``iterator.get_next()`` in ``multi_step_on_iterator``), where no host-side timer sees it.
On a sampled step ``FitInputSampler.train`` fetches the batch itself, with a small
``tf.function`` that runs the ``IteratorGetNext`` op between two ``tf.timestamp`` ops (the
second after the batch's tensors: the op's wait and its hand-off to tf.data's thread, not
the Python call around it), and hands that batch to the train function as a one-element
Python iterator: Keras then runs its ``one_step_on_data`` on it, the same step the graph
would have run. The wait is read back as a float (a CPU tensor: no device sync) and added
to the hook's ``input_wait_seconds`` for all the steps since the previous sample; from there
``input_wait_share`` is sent at each probe as for a custom loop.

The other steps run Keras's train function untouched, at no cost. Steps are sampled about
``SAMPLE_SPACING_SECONDS`` of training apart (every step once steps are that long), at
random strides around that spacing so that a pipeline with a period of its own (a shuffle
buffer refilling every N batches) is not read at one phase only.

Not timed (no ``input_wait_share``, unknown rather than 0): ``steps_per_execution > 1``
(Keras then fetches the next batch with ``get_next_as_optional`` in the same loop body as
the step, so the fetch overlaps the step and its duration is not a wait), a distribution
strategy other than the default (its iterators are not ``OwnedIterator``), ``run_eagerly``
and other backends. Reasoning and figures: docs/hook.md, "Input wait".
"""

from __future__ import annotations

import logging
import math
import random
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from driftwatch.hook.core import Hook

log = logging.getLogger(__name__)

SAMPLE_SPACING_SECONDS = 0.05
"""Training time between two timed fetches, on average (seconds)."""
FIRST_SAMPLED_STEP = 2
"""The first step timed, counted in the hook's steps: after the step that traces fit's
train function, before the first probe reads the tracing counts."""


class Sampler(Protocol):
    """Runs fit's train function for a step, timing its input fetch on the steps it samples.

    ``next_step``: the hook's step count from which the next call is sampled (infinite when
    none will be); the caller compares it with the step count, nothing more, on the others.
    """

    next_step: float

    def train(self, train_function: Callable[[Any], Any], iterator: Any) -> Any: ...


class NeverSampled:
    """The sampler of a ``fit`` whose fetches cannot be timed: it samples no step."""

    next_step = math.inf

    def train(self, train_function: Callable[[Any], Any], iterator: Any) -> Any:
        return train_function(iterator)


NEVER = NeverSampled()


class FitInputSampler:
    """Times the input fetch of one ``fit`` step now and then (see the module); a
    ``Sampler``, whose ``next_step`` becomes infinite once the fetch cannot be timed."""

    def __init__(self, tf: Any, hook: Hook) -> None:
        from tensorflow.python.data.ops import iterator_ops

        self._tf = tf
        self._hook = hook
        self._iterator_type = iterator_ops.OwnedIterator
        self._fetch = tf.function(self._timed_fetch, reduce_retracing=True)
        self._random = random.Random()
        self._sampled = (hook.global_step, math.nan)  # the previous sample: step, clock
        self.next_step: float = hook.global_step + FIRST_SAMPLED_STEP
        hook.expect_input_wait()  # the first reading within a dozen steps, not 100

    def _timed_fetch(self, iterator: Any) -> tuple[Any, Any]:
        """The next batch of ``iterator``, and the seconds its fetch op waited (traced)."""
        tf = self._tf
        with tf.device("/CPU:0"):
            start = tf.timestamp()
        with tf.control_dependencies([start]):
            batch = iterator.get_next()
        with tf.device("/CPU:0"), tf.control_dependencies(tf.nest.flatten(batch)):
            end = tf.timestamp()
        return batch, end - start

    def train(self, train_function: Callable[[Any], Any], iterator: Any) -> Any:
        """Run ``train_function`` for this step, its batch fetched and timed here."""
        if not isinstance(iterator, self._iterator_type):  # a distributed iterator
            self.next_step = math.inf
            return train_function(iterator)
        batch, waited = self._fetch(iterator)  # at the end of the data: OutOfRangeError,
        self._record(float(waited))  # which fit's epoch loop takes as the epoch's end
        return train_function(iter((batch,)))

    def _record(self, waited: float) -> None:
        """Add the wait for every step since the previous sample; draw the next sample."""
        hook = self._hook
        step, now = hook.global_step, time.perf_counter()
        previous_step, previous_time = self._sampled
        steps = max(1, step - previous_step)
        hook.add_input_wait(attributed_wait(waited, steps, now - previous_time), steps)
        self._sampled = (step, now)
        period = (now - previous_time) / steps  # NaN at the first sample: the next step
        stride = round(SAMPLE_SPACING_SECONDS / period) if period > 0 else 1
        self.next_step = step + (self._random.randint(1, 2 * stride - 1) if stride > 1 else 1)


def attributed_wait(waited: float, steps: int, elapsed: float) -> float:
    """The input wait of ``steps`` steps of which one, sampled, waited ``waited`` seconds:
    each as long, but no more than the ``elapsed`` seconds they all took (NaN: unknown, at
    the first sample). One sample stretched by the scheduler (a fetch descheduled for
    200 ms among 5-ms steps) thus reads as the time it took, not as 200 ms a step."""
    wait = max(0.0, waited) * steps
    return min(wait, elapsed) if elapsed == elapsed else wait


_samplers: dict[int, FitInputSampler] = {}  # by id of the hook (one per process, shared)


def sampler(tf: Any, hook: Hook) -> Sampler:
    """``hook``'s sampler, made at its first ``fit`` and kept for the next ones (its fetch
    function is traced once); ``NEVER`` when TensorFlow has moved its iterators (fit's
    steps are still timed, its input wait is not)."""
    found = _samplers.get(id(hook))
    if found is None:
        try:
            found = _samplers[id(hook)] = FitInputSampler(tf, hook)
        except (ImportError, AttributeError) as err:
            log.info("driftwatch: tf.data iterators not found, fit's input wait unknown: %r", err)
            return NEVER
    return found
