"""What a rank of a synchronous data-parallel job waits for inside its train step, timed in
the graph: the other ranks, at its collectives, and its input.

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

A step that fetches its batch in the graph (``next(iterator)`` of a distributed dataset
inside the ``tf.function``, as TensorFlow's tutorials write it) waits for its input where no
host timer sees it: that fetch (``DistributedIterator.get_next``) is timed the same way, and
each probe adds the batches fetched since the previous one, and their wait, to the hook's
input wait (``input_wait_share``), as the host-side patch does for a fetch outside the step.

Nothing is patched in eager calls, in graphs that are not train steps (told when read: a
fetch is traced before the step's gradients are), or in ``fit`` (whose train function Keras
3 cannot run under this strategy): a job of one process builds no collective and pays
nothing. Reasoning and figures: docs/ranks.md, "Collective wait".
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

    def watch_input(self, fetched: Callable[[], tuple[float, int]]) -> None: ...


class InputWaits(Protocol):
    """Where fetched batches' waits go (``Hook``)."""

    def add_input_wait(self, seconds: float, batches: int = 1) -> None: ...


class InputFetches:
    """Hands the hook, at each probe, the batches fetched in traced train steps since the
    previous probe and their wait."""

    def __init__(self, fetched: Callable[[], tuple[float, int]]) -> None:
        self._fetched = fetched  # seconds waited and batches fetched so far
        self._seen = (0.0, 0)

    def add_to(self, hook: InputWaits) -> None:
        """A probe check: adds the batches since the previous probe to ``hook``'s input wait."""
        seconds, batches = self._fetched()
        if batches > self._seen[1]:
            hook.add_input_wait(seconds - self._seen[0], batches - self._seen[1])
        self._seen = (seconds, batches)


class GraphTimings:
    """The seconds spent in each op timed in a traced graph and how many times it ran, in
    one variable each, kept while the ``tf.function`` it was traced in lives (a loop that
    makes its step anew every iteration traces new ops every iteration)."""

    def __init__(self, tf: Any) -> None:
        self._tf = tf
        # The function each op was traced in, and its float64 [seconds, runs].
        self._totals: list[tuple[weakref.ref[Any], Any]] = []
        self._retired = (0.0, 0.0)  # seconds and runs of the ops of functions gone

    def timed(self, run: Callable[[], Any], ready: Any, function: Any) -> Any:
        """``run()`` (building one op, in a graph of ``function`` being traced) between two
        timestamps, the first after ``ready`` (its input; None: at once); adds their
        interval to a total."""
        tf = self._tf
        total = self._new_total(function)
        with tf.control_dependencies([] if ready is None else [ready]):
            start = tf.timestamp()
        with tf.control_dependencies([start]):
            outputs = run()
        flat = tf.nest.flatten(outputs, expand_composites=True)  # a PerReplica: its tensors
        done = [t for t in flat if isinstance(t, tf.Tensor)]
        with tf.control_dependencies(done):
            end = tf.timestamp()
        total.assign_add(tf.stack([end - start, tf.constant(1.0, tf.float64)]))
        return outputs

    def spent(self, trains_only: bool = False) -> tuple[float, int]:
        """Seconds spent in the timed ops so far and how many ran (read from host memory),
        with ``trains_only`` those of functions that compute gradients only; the totals of
        functions gone are kept as one and let go."""
        seconds, runs = self._retired
        live = []
        for ref, total in self._totals:
            function = ref()
            if trains_only and function is not None and not function._driftwatch_trains:
                live.append((ref, total))
                continue
            spent, ran = (float(v) for v in total.numpy())
            seconds, runs = seconds + spent, runs + ran
            if function is None:
                self._retired = (self._retired[0] + spent, self._retired[1] + ran)
            else:
                live.append((ref, total))
        self._totals = live
        return seconds, int(runs)

    def seconds(self) -> float:
        """Seconds spent in every timed op so far."""
        return self.spent()[0]

    def kept(self) -> int:
        """Ops timed in functions that live."""
        return len(self._totals)

    def _new_total(self, function: Any) -> Any:
        """A host variable of its own for one op, made outside the graph being traced and
        outside the strategy's variable creator (a local, not a mirrored one)."""
        from tensorflow.python.ops import resource_variable_ops

        tf = self._tf
        with tf.init_scope(), tf.device("/cpu:0"):
            total = resource_variable_ops.ResourceVariable(
                tf.zeros([2], tf.float64), trainable=False, name="driftwatch_wait"
            )
        self._totals.append((weakref.ref(function), total))
        return total


def patch_all_reduce(launcher_class: Any, state: StepState, tf: Any) -> None:
    """Wrap ``launcher_class.all_reduce`` so collectives traced in a train step are timed;
    the first one timed has the hook send their share at each probe."""
    original: Callable[..., Any] = launcher_class.all_reduce
    if getattr(original, _PATCHED, False):
        return
    timings = GraphTimings(tf)

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


def patch_get_next(iterator_class: Any, state: StepState, tf: Any) -> None:
    """Wrap ``iterator_class.get_next`` so fetches traced in a function are timed; those of
    train steps count as the hook's input wait."""
    original: Callable[..., Any] = iterator_class.get_next
    if getattr(original, _PATCHED, False):
        return
    timings = GraphTimings(tf)

    @functools.wraps(original)
    def get_next(self: Any, *args: Any, **kwargs: Any) -> Any:
        running = state.running
        if running is None or tf.executing_eagerly():
            return original(self, *args, **kwargs)
        state.watch_input(functools.partial(timings.spent, trains_only=True))
        return timings.timed(functools.partial(original, self, *args, **kwargs), None, running)

    setattr(get_next, _PATCHED, True)
    iterator_class.get_next = get_next


def install(tf: Any, state: StepState) -> None:
    """Patch the strategy's all-reduce and distributed iterator of the ``tensorflow``
    module ``tf``, where it has them."""
    try:
        from tensorflow.python.distribute import cross_device_utils, input_lib
    except ImportError as err:  # a TensorFlow that moved them: ranks' waits are not measured
        log.info("driftwatch: collectives not found, their wait not measured: %r", err)
        return
    patch_all_reduce(cross_device_utils.CollectiveReplicaLauncher, state, tf)
    patch_get_next(input_lib.DistributedIterator, state, tf)
