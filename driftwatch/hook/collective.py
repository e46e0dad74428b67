"""How long a rank of a synchronous data-parallel job waits at its collectives, timed in the
graph.

In a ``MultiWorkerMirroredStrategy`` job every rank's step ends at the gradients'
all-reduce, so every rank's step time is the slowest rank's: a straggler is not seen in step
times. What differs between the ranks is how long each waits there for the others: the rank
the others wait for waits least. While the custom-loop patch traces a train step (a
``tf.function`` that computes gradients), each all-reduce the strategy builds in it
(``CollectiveReplicaLauncher.all_reduce``: the gradients', and ``strategy.reduce``'s) runs
between two ``tf.timestamp`` ops: the first once its input is ready (this rank has arrived),
the second once its output is (every rank has arrived and the data is back). One
``assign_add`` per collective adds the interval and a count to a float64 variable on the
host; each probe reads the variables (host memory: no device sync) and the hook sends the
share of step time spent there since its previous probe (``collective_wait_share``).

Nothing is patched in graphs that are not train steps, in eager calls, or in ``fit`` (whose
train function Keras 3 cannot run under this strategy): a job of one process builds no
collective and pays nothing. Reasoning and figures: docs/ranks.md, "Collective wait".
"""

from __future__ import annotations

import functools
import logging
import weakref
from collections.abc import Callable
from typing import Any, Protocol

log = logging.getLogger(__name__)

COLLECTIVE_WAIT_SERIES = "collective_wait_share"
"""The series of the share of step time a rank waits at its collectives."""
_PATCHED = "_driftwatch_patched"


class StepState(Protocol):
    """What the custom-loop patch knows of the call under way (``TrainStepRecognizer``)."""

    running: Any  # the outermost tf.function being called or traced, or None

    def watch_wait(self, series: str, waited: Callable[[], float]) -> None: ...


class CollectiveTimings:
    """The seconds spent in each timed collective and how many ran, in one variable each,
    kept while the ``tf.function`` it was traced in lives (a loop that makes its step anew
    every iteration traces new collectives every iteration)."""

    def __init__(self, tf: Any) -> None:
        self._tf = tf
        # The function each collective was traced in, and its float64 [seconds, runs].
        self._totals: list[tuple[weakref.ref[Any], Any]] = []
        self._retired = 0.0  # seconds of the collectives of functions gone

    def timed(self, run: Callable[[], Any], ready: Any, function: Any) -> Any:
        """``run()`` (building one collective, in a graph of ``function`` being traced)
        between two timestamps, the first after ``ready`` (its input); adds their interval
        to a total."""
        tf = self._tf
        total = self._new_total(function)
        with tf.control_dependencies([ready]):
            start = tf.timestamp()
        with tf.control_dependencies([start]):
            outputs = run()
        done = [t for t in tf.nest.flatten(outputs) if isinstance(t, tf.Tensor)]
        with tf.control_dependencies(done):
            end = tf.timestamp()
        total.assign_add(tf.stack([end - start, tf.constant(1.0, tf.float64)]))
        return outputs

    def seconds(self) -> float:
        """Seconds spent in every timed collective so far (read from host memory); the
        totals of functions gone are kept as one number and let go."""
        seconds, live = self._retired, []
        for function, total in self._totals:
            spent = float(total.numpy()[0])
            seconds += spent
            if function() is None:
                self._retired += spent
            else:
                live.append((function, total))
        self._totals = live
        return seconds

    def collectives(self) -> int:
        """Collectives timed in functions that live."""
        return len(self._totals)

    def _new_total(self, function: Any) -> Any:
        """A host variable of its own for one collective, made outside the graph being
        traced and outside the strategy's variable creator (a local, not a mirrored one)."""
        from tensorflow.python.ops import resource_variable_ops

        tf = self._tf
        with tf.init_scope(), tf.device("/cpu:0"):
            total = resource_variable_ops.ResourceVariable(
                tf.zeros([2], tf.float64), trainable=False, name="driftwatch_collective_wait"
            )
        self._totals.append((weakref.ref(function), total))
        return total


def patch_all_reduce(launcher_class: Any, state: StepState, tf: Any) -> None:
    """Wrap ``launcher_class.all_reduce`` so collectives traced in a train step are timed;
    the first one timed has the hook send their share at each probe."""
    original: Callable[..., Any] = launcher_class.all_reduce
    if getattr(original, _PATCHED, False):
        return
    timings = CollectiveTimings(tf)

    @functools.wraps(original)
    def all_reduce(self: Any, input_tensor: Any, *args: Any, **kwargs: Any) -> Any:
        running = state.running
        if running is None or not running._driftwatch_trains or tf.executing_eagerly():
            return original(self, input_tensor, *args, **kwargs)
        state.watch_wait(COLLECTIVE_WAIT_SERIES, timings.seconds)
        reduce = functools.partial(original, self, input_tensor, *args, **kwargs)
        return timings.timed(reduce, input_tensor, running)

    setattr(all_reduce, _PATCHED, True)
    launcher_class.all_reduce = all_reduce


def install(tf: Any, state: StepState) -> None:
    """Patch the strategy's all-reduce of the ``tensorflow`` module ``tf``, if it has one."""
    try:
        from tensorflow.python.distribute import cross_device_utils
    except ImportError as err:  # a TensorFlow that moved it: ranks' waits are not measured
        log.info("driftwatch: collectives not found, their wait not measured: %r", err)
        return
    patch_all_reduce(cross_device_utils.CollectiveReplicaLauncher, state, tf)
