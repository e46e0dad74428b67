"""Zero-code custom training loops: find the train step among the job's ``tf.function`` calls.

``install(tf)`` patches two methods of TensorFlow's own classes, so every ``tf.function`` the
job creates, however it was created, is seen without touching the job's code:

- ``Function.__call__`` (the class ``tf.function`` returns): the outermost calls, those not
  made while another ``tf.function`` is being called or traced, are the candidates;
- ``GradientTape.gradient``: called while a candidate runs (normally while it is being
  traced), it marks the candidate as one that computes gradients, i.e. trains.

The first function that trains becomes the train step: each of its outermost calls is one
step (``Hook.step_started``/``step_ended`` around it, exactly as ``DriftwatchCallback`` times
``fit``), its tracing count is watched (retracing), and each probe (every 100 steps or 10 s)
checks the scalar floating-point values the last call returned for NaN/Inf. A step that is
re-created as a new ``tf.function`` around the same Python code on every iteration stays the
step (and every new one counts as a retrace); another training function called
``SWITCH_AFTER_CALLS`` times in a row without the step becomes the step.

While a ``fit`` patched by autolog runs (``fit_started``/``fit_ended``), nothing is
recognised: its ``DriftwatchCallback`` times it already. See docs/hook.md for what this can
and cannot recognise and what each part costs.
"""

from __future__ import annotations

import atexit
import functools
import inspect
import logging
import time
from collections.abc import Callable, Iterator
from typing import Any

from driftwatch.hook import multiworker
from driftwatch.hook.core import Hook, shared_hook, user_hook_exists

log = logging.getLogger(__name__)

SWITCH_AFTER_CALLS = 100
"""Calls of another training function in a row after which it becomes the train step."""
MAX_CHECKED_OUTPUTS = 16
"""Most scalar outputs of the train step that a probe checks for NaN/Inf."""
MAX_OUTPUT_DEPTH = 3
"""How deep a probe looks into the train step's nested outputs (tuples, lists, dicts)."""
_PATCHED = "__driftwatch_patched__"


class StepTraces:
    """The tracing count of the train step, however many ``tf.function`` objects it has been.

    Quacks like a ``tf.function`` for ``TensorflowProbes.watch``: a step re-created on every
    iteration is traced once per object, and each of those traces is a retrace.
    """

    def __init__(self, function: Any) -> None:
        self._function = function
        self._retired = 0  # traces of the functions followed before the current one

    def follow(self, function: Any, *, count_its_first_traces: bool) -> None:
        """The train step is ``function`` from now on. Its traces so far count as retraces
        when it is the same step re-created, not when it is another function taking over."""
        self._retired += self._function.experimental_get_tracing_count()
        if not count_its_first_traces:
            self._retired -= function.experimental_get_tracing_count()
        self._function = function

    def experimental_get_tracing_count(self) -> int:
        return self._retired + int(self._function.experimental_get_tracing_count())


class TrainStepRecognizer:
    """The state of the two patches; ``called`` runs after each outermost training call."""

    __slots__ = (
        "busy",
        "disabled",
        "fetches",
        "hook",
        "last_outputs",
        "others",
        "running",
        "step",
        "step_python",
        "traces",
        "waits",
    )

    def __init__(self, hook: Hook | None = None) -> None:
        """``hook``: the hook to time the step with; by default the process's shared hook,
        made when a train step is first recognised."""
        self.busy = False  # a tf.function call is under way (or fit is), so calls are nested
        self.running: Any = None  # the outermost function being called, while it runs
        self.step: Any = None  # the tf.function recognised as the train step
        self.step_python: Any = None  # the code of the Python function behind it
        self.others = 0  # calls of other training functions since the step's last call
        self.last_outputs: Any = None  # what the step's last call returned (NaN checks)
        self.hook = hook
        self.traces: StepTraces | None = None
        self.disabled = False  # the job instruments its own loop with a Hook
        self.waits: dict[str, Callable[[], float]] = {}  # timed in traced steps, by series
        self.fetches: multiworker.InputFetches | None = None  # batches fetched in the graph

    def called(self, function: Any, start: float, outputs: Any) -> None:
        """``function``, which trains, was called at ``start`` and returned ``outputs``."""
        if function is not self.step and not self._adopt(function):
            return
        hook = self.hook
        assert hook is not None
        hook.step_started(start)
        self.others = 0
        self.last_outputs = outputs
        hook.step_ended(time.perf_counter())

    def watch_wait(self, series: str, waited: Callable[[], float]) -> None:
        """A wait timed inside traced train steps (``waited()``: its seconds so far): the
        hook sends its share of step time at each probe, once there is a hook."""
        self.waits.setdefault(series, waited)
        if self.hook is not None:
            self.hook.watch_wait(series, waited)

    def watch_input(self, fetched: Callable[[], tuple[float, int]]) -> None:
        """Batches fetched inside traced train steps (``fetched()``: their wait and count
        so far): each probe adds those since the previous one to the hook's input wait,
        once there is a hook."""
        if self.fetches is None:
            self.fetches = multiworker.InputFetches(fetched)
            if self.hook is not None:
                self._time_fetches(self.hook)

    def _time_fetches(self, hook: Hook) -> None:
        assert self.fetches is not None
        hook.expect_input_wait()
        hook.check_at_probe(self.fetches.add_to)

    def _adopt(self, function: Any) -> bool:
        """Whether ``function`` is (now) the train step; adopts it if so. A failure here
        switches recognition off, never reaches the job."""
        if self.disabled:
            return False
        try:
            return self._consider(function)
        except Exception as err:  # noqa: BLE001 - the job's training must go on
            log.warning("driftwatch: custom-loop recognition switched off: %r", err)
            self._stand_down()
            return False

    def _consider(self, function: Any) -> bool:
        step = self.step
        if step is None:
            hook = self.hook
            if hook is None:
                if user_hook_exists():
                    log.info("driftwatch: the job times its steps with a Hook of its own")
                    self._stand_down()
                    return False
                self.hook = hook = shared_hook()
            self.traces = StepTraces(function)
            hook.watch_function(self.traces)
            for series, waited in self.waits.items():
                hook.watch_wait(series, waited)
            if self.fetches is not None:
                self._time_fetches(hook)
            hook.check_at_probe(self.check_outputs)
            hook.probe()  # the step's tracing count so far is its normal first traces
            atexit.register(self._at_exit)
            log.info("driftwatch: timing %s as the train step", _name(function))
        elif step_identity(function) is self.step_python:  # re-created on every iteration
            assert self.traces is not None
            self.traces.follow(function, count_its_first_traces=True)
        else:
            self.others += 1
            if self.others < SWITCH_AFTER_CALLS:
                return False
            assert self.hook is not None
            assert self.traces is not None
            self.hook.boundary()  # the old step's last period does not run into the new one's
            self.traces.follow(function, count_its_first_traces=False)
            log.info("driftwatch: timing %s as the train step from now on", _name(function))
        self.step = function
        self.step_python = step_identity(function)
        return True

    def check_outputs(self, hook: Hook) -> None:
        """At a probe: check the step's last scalar floating-point outputs for NaN/Inf.

        Reading a tensor copies its few bytes to the host; on a GPU it waits for that one
        step to finish, once per probe, never per step.
        """
        for name, value in scalar_outputs(self.last_outputs):
            hook.check_finite(value, name)

    def _stand_down(self) -> None:
        self.disabled = True
        self.step = None
        self.last_outputs = None

    def _at_exit(self) -> None:
        """A last probe when the job ends: a NaN in its last second is still reported."""
        if self.hook is not None and not self.disabled:
            try:
                self.hook.probe(final=True)
            except Exception as err:  # noqa: BLE001 - never turn a job's exit into an error
                log.info("driftwatch: last probe failed: %r", err)


def step_identity(function: Any) -> object:
    """What stays the same when a job makes its train step anew (``@tf.function`` on a
    ``def`` inside the loop, or ``tf.function(step)`` every iteration): the code of the Python
    function behind ``function``, through decorators and bound methods; computed once per
    ``tf.function`` object."""
    identity = function._driftwatch_identity
    if identity is None:
        python = inspect.unwrap(function.python_function)
        python = getattr(python, "__func__", python)  # a bound method: its function
        identity = function._driftwatch_identity = getattr(python, "__code__", python)
    return identity


def scalar_outputs(outputs: Any) -> Iterator[tuple[str, float]]:
    """The scalar floating-point values in a train step's outputs, with a name each: a
    tensor's value is copied to the host; non-scalar and non-float values are skipped."""
    found = 0
    pending: list[tuple[str, Any, int]] = [("train_step_output", outputs, 0)]
    while pending and found < MAX_CHECKED_OUTPUTS:
        name, value, depth = pending.pop()
        if isinstance(value, dict):
            if depth < MAX_OUTPUT_DEPTH:
                pending += [(str(key), item, depth + 1) for key, item in value.items()]
            continue
        if isinstance(value, list | tuple):
            if depth < MAX_OUTPUT_DEPTH:
                pending += [(f"{name}[{i}]", item, depth + 1) for i, item in enumerate(value)]
            continue
        number = _host_scalar(value)
        if number is not None:
            found += 1
            yield name, number


def _host_scalar(value: Any) -> float | None:
    """``value`` as a float if it is a scalar of a floating-point type, else None."""
    if isinstance(value, float):
        return value
    dtype = getattr(value, "dtype", None)
    shape = getattr(value, "shape", None)
    if dtype is None or shape is None or len(shape) != 0:
        return None
    if not (getattr(dtype, "is_floating", False) or getattr(dtype, "kind", "") == "f"):
        return None
    try:
        return float(value)
    except (TypeError, ValueError):  # a symbolic tensor: no value to read
        return None


def _name(function: Any) -> str:
    return str(getattr(function, "__name__", None) or type(function).__name__)


_recognizer = TrainStepRecognizer()


def recognizer() -> TrainStepRecognizer:
    """This process's recognizer (one, as there is one train loop and one hook)."""
    return _recognizer


def fit_started() -> bool:
    """``fit`` with a ``DriftwatchCallback`` begins: recognise nothing until ``fit_ended``.
    Returns what to pass to ``fit_ended`` (a ``fit`` may run inside another's callback)."""
    was = _recognizer.busy
    _recognizer.busy = True
    return was


def fit_ended(was_busy: bool) -> None:
    _recognizer.busy = was_busy


def patch_function_call(function_class: Any, state: TrainStepRecognizer) -> None:
    """Wrap ``function_class.__call__`` so ``state`` sees every outermost call."""
    original: Callable[..., Any] = function_class.__call__
    if getattr(original, _PATCHED, False):
        return
    clock = time.perf_counter
    function_class._driftwatch_trains = False  # set on an instance once it computes gradients
    function_class._driftwatch_identity = None  # set on an instance by step_identity

    @functools.wraps(original)  # keeps __module__: AutoGraph then calls it unconverted
    def __call__(self: Any, *args: Any, **kwargs: Any) -> Any:
        if state.busy:  # inside another call or its tracing, or inside fit
            return original(self, *args, **kwargs)
        state.busy = True
        state.running = self
        start = clock()
        try:
            outputs = original(self, *args, **kwargs)
        finally:
            state.busy = False
            state.running = None
        if self._driftwatch_trains:
            state.called(self, start, outputs)
        return outputs

    setattr(__call__, _PATCHED, True)
    function_class.__call__ = __call__


def patch_gradient(tape_class: Any, state: TrainStepRecognizer) -> None:
    """Wrap ``tape_class.gradient`` to mark the outermost running function as training."""
    original: Callable[..., Any] = tape_class.gradient
    if getattr(original, _PATCHED, False):
        return

    @functools.wraps(original)
    def gradient(self: Any, *args: Any, **kwargs: Any) -> Any:
        running = state.running
        if running is not None:
            running._driftwatch_trains = True
        return original(self, *args, **kwargs)

    setattr(gradient, _PATCHED, True)
    tape_class.gradient = gradient


def patch_iterator_next(iterator_class: Any, state: TrainStepRecognizer) -> None:
    """Wrap ``iterator_class._next_internal`` (``next(it)`` and ``it.get_next()`` of a
    ``tf.data`` iterator) so the time the job waits for each batch outside a ``tf.function``
    adds to its hook's input wait. Inside a call or its tracing (``state.busy``, fit's too)
    the op only joins a graph: nothing is timed. Batches fetched before the train step is
    recognised are not counted."""
    original: Callable[..., Any] = iterator_class._next_internal
    if getattr(original, _PATCHED, False):
        return
    clock = time.perf_counter

    @functools.wraps(original)
    def _next_internal(self: Any) -> Any:
        hook = state.hook
        if hook is None or state.busy:
            return original(self)
        if not hook.input_batches:  # the first batch timed
            hook.expect_input_wait()
        start = clock()
        try:
            return original(self)
        finally:
            hook.add_input_wait(clock() - start)

    setattr(_next_internal, _PATCHED, True)
    iterator_class._next_internal = _next_internal


def install(tf: Any) -> None:
    """Patch the ``tensorflow`` module ``tf`` so its custom loops' train steps are timed, and
    the time they wait for ``tf.data`` batches and, in a multi-worker job, for the other ranks."""
    patch_function_call(type(tf.function(_nothing)), _recognizer)
    patch_gradient(tf.GradientTape, _recognizer)
    multiworker.install(tf, _recognizer)
    try:
        from tensorflow.python.data.ops import iterator_ops
    except ImportError as err:  # a TensorFlow that moved it: steps are still timed
        log.info("driftwatch: tf.data iterators not found, input wait not measured: %r", err)
        return
    patch_iterator_next(iterator_ops.OwnedIterator, _recognizer)


def _nothing() -> None:
    """What the probe ``tf.function`` wraps, to learn the class ``tf.function`` returns."""
