"""How much does driftwatch's in-process hook cost a training job?

Run: ``.venv/bin/python bench/hook_overhead.py`` (about 3-4 minutes on a 2-core box), or
``--quick`` for a ~30 s smoke run. It always exits 0: it is a measurement, not a test.

The whole process (every thread, TensorFlow's included, which inherit it) is pinned to one
CPU unless ``--no-pin`` is given. On a quiet 2-vCPU machine, unpinned, two *identical*
fits run back to back differ by 5-13% (interquartile range of their ratio), because
TensorFlow's and tf.data's threads and the Python thread land on the two cores differently
each time; pinned, by about 1%. Pinning is also the conservative setting for this question:
with no second core to absorb it, work a callback adds on any thread competes with the
training thread. Other processes on the same CPU still make wall-clock times jump (they
come in steps on a throttled VM), hence the CPU-time table and the A/A control below.

Macro benchmark
    ``model.fit`` of a small Keras MLP (16 features -> Dense 256 -> Dense 256 -> 1, batch
    128: about 1 ms of CPU per step here), ``verbose=0``, the same data and the same number
    of steps, under four configurations and an A/A control:

    * ``none``: no callback (Keras still adds its ``History`` callback and converts the
      logs to Python floats every batch, as it does in every configuration);
    * ``none-again``: no callback either, on a second identical model: the A/A control.
      Its ratio to ``none`` should be 1.000; its spread is this run's resolution;
    * ``driftwatch``: ``driftwatch.keras.DriftwatchCallback()`` with its default settings,
      its capture requests not polled (the hook as it was before evidence capture);
    * ``driftwatch+capture``: the same with capture armed, as every hooked job now runs:
      a capture request file beside the channel, which the hook ``stat``s at every probe,
      asking for nothing new (never triggered);
    * ``tensorboard``: ``keras.callbacks.TensorBoard(logdir, update_freq="batch")``;
    * ``naive-psutil``: a callback that, every batch, reads the process's memory, CPU times
      and I/O counters with psutil (and NVML memory, where a driver is present).

    Two more configurations train the same model for the same steps with a custom loop
    (a ``tf.function`` train step with ``GradientTape`` and the compiled optimizer, called
    once per batch of a ``tf.data`` pipeline over the same arrays, ``for x, y in dataset``):
    ``loop: none``, without driftwatch, and ``loop: driftwatch``, with
    ``driftwatch.hook.custom_loop``'s three patches switched on (what ``driftwatch run``
    installs: the train step, gradients, and the ``tf.data`` iterator's ``next``, whose
    wait is timed; they are switched off for every other configuration) and its train step
    recognised; their ratios are to ``loop: none``.

    Each configuration gets its own model, built identically (same seed) and compiled
    once, and its own callback instances, created once; one warm-up ``fit`` per
    configuration absorbs tracing. Then every round runs one ``fit`` of each configuration,
    one after another, with the order rotated by one place each round so that no
    configuration always runs first or last (on a shared, noisy machine this cancels
    drift). Each ``fit`` call is timed with ``time.perf_counter`` (wall clock) and with
    ``time.process_time`` (CPU time of the whole process, every thread). For each
    configuration the report gives the median time, the ratio of its median to the
    ``none`` median, and the median of the per-round ratios (configuration / ``none`` of
    the same round), which is the more robust figure when the machine's speed drifts, with
    the 25th-75th percentile of those per-round ratios as a measure of the noise and a
    distribution-free 95% confidence interval of their median (from order statistics).
    The goal is judged on wall clock; the CPU-time table, which other processes' load
    hardly moves, is there to tell a real overhead from a busy neighbour.

Micro benchmark
    The hook's own per-step path, without TensorFlow in the loop: N iterations of
    ``hook.step_started(t, 1); hook.step_ended(t)`` (``t`` fixed) and of
    ``with hook.step(): pass`` (which reads the clock twice, as real use does) on a
    ``driftwatch.hook.core.Hook``, once with probes pushed out of reach
    (``probe_every_steps`` and ``probe_every_seconds`` huge) and once with the default
    probe settings, so the probe's cost amortised over its 100 steps is included (the
    default hook watches a real ``tf.function`` so that the probe reads a tracing count,
    as it does under ``fit``). Also ``DriftwatchCallback``'s whole per-batch path as Keras
    drives it: its wrapper around the train function plus ``on_train_batch_end`` with a
    one-entry logs dict. And the custom-loop patch on a stand-in for a ``tf.function``
    whose call does nothing: a call of the recognised train step (the patch plus the hook's
    step path, default probes) and a call of another function (the patch alone). An empty
    loop (for the callback, a loop calling the bare train function; for the patch, the
    unpatched stand-in) is timed alongside and subtracted. Those tight loops keep the hook's
    code and data in L1, which a real step's ~1 ms of TensorFlow work does not, so the
    explicit calls and the callback are also timed one call at a time right after reading
    an 8 MiB buffer ("cold caches"; median per call, the same with an empty action
    subtracted). All variants alternate, rotated, over several repeats; the report gives
    the median and best µs per step.

In situ
    After the timed rounds (and likewise for ``loop: driftwatch``, timing what the
    recognised step costs after each call: ``TrainStepRecognizer.called``), a few more
    ``fit`` calls of the ``driftwatch`` configuration
    run with timing shims on the hook's ``step_started``/``step_ended`` and the callback's
    ``on_train_batch_end``: what those calls cost between real TensorFlow steps (mean per
    step, which includes the probes and page faults, and median and 99th percentile per
    call). This is what the micro benchmark cannot show: a tight loop keeps the hook's
    code and data hot.

Capture
    What evidence capture costs when it is triggered, in two more ``fit`` calls of the
    ``driftwatch+capture`` configuration with every batch's end time recorded: a py-spy
    dump of this process (``driftwatch.capture.stack.dump_stacks``, from a thread, halfway
    through the fit: its wall time, and the steps it overlapped against the median step),
    and a TensorFlow Profiler trace of ``TRACE_STEPS`` steps requested through the request
    file as the monitor does (the hook's start and stop calls' wall time, the traced steps
    against the median step, the trace's size). py-spy runs on the same pinned CPU.

Goals: ``DriftwatchCallback`` at most 1.02x the ``none`` time and ``loop: driftwatch`` at
most 1.02x the ``loop: none`` time (judged on the median of per-round ratios of wall-clock
time; the CPU-time ratio is printed beside it), and the hook's per-step path at most 5 µs
(judged on the slowest micro ``Hook`` or custom-loop train-step row; the in-situ figure is
printed beside it).

All ``DriftwatchCallback`` instances in a process share one hook (``shared_hook``); its
channel files go to a temporary ``DRIFTWATCH_RUNTIME_DIR`` that is removed at the end.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import itertools
import math
import os
import platform
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import psutil

DATA_SEED = 0
MODEL_SEED = 1
FEATURES = 16

# The two goals this benchmark checks.
FIT_RATIO_GOAL = 1.02
STEP_MICROSECONDS_GOAL = 5.0


@dataclass(frozen=True)
class Settings:
    rounds: int
    steps_per_epoch: int
    epochs: int
    batch_size: int
    width: int
    micro_iterations: int
    micro_cold_iterations: int
    micro_repeats: int
    in_situ_fits: int


FULL = Settings(
    rounds=35,
    steps_per_epoch=250,
    epochs=2,
    batch_size=128,
    width=256,
    micro_iterations=1_000_000,
    micro_cold_iterations=2_000,
    micro_repeats=5,
    in_situ_fits=4,
)
QUICK = Settings(
    rounds=5,
    steps_per_epoch=100,
    epochs=2,
    batch_size=128,
    width=256,
    micro_iterations=200_000,
    micro_cold_iterations=300,
    micro_repeats=3,
    in_situ_fits=2,
)


# -- small helpers --------------------------------------------------------------------------


def rotated(items: Sequence[str], by: int) -> list[str]:
    """``items`` rotated left by ``by`` places: round ``r`` starts with item ``r % len``."""
    shift = by % len(items)
    return [*items[shift:], *items[:shift]]


def quartiles(values: Sequence[float]) -> tuple[float, float]:
    """The 25th and 75th percentiles (both equal to the value when there is only one)."""
    if len(values) < 2:
        return values[0], values[0]
    q = statistics.quantiles(values, n=4, method="inclusive")
    return q[0], q[2]


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as cpuinfo:
            for line in cpuinfo:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def median_confidence_interval(values: Sequence[float], level: float = 0.95) -> tuple[float, float]:
    """A distribution-free confidence interval of the median: ``(x[k], x[n-1-k])`` of the
    sorted values, with ``k`` the largest count such that Binomial(n, 1/2) falls below it
    with probability at most ``(1 - level) / 2``. The whole range when n is too small."""
    ordered = sorted(values)
    n = len(ordered)
    tail = (1.0 - level) / 2.0
    k = 0
    below = 0.0  # P(Binomial(n, 1/2) < k + 1), built up term by term
    while k < n // 2:
        below += math.comb(n, k) / 2**n
        if below > tail:
            break
        k += 1
    return ordered[k], ordered[n - 1 - k]


def pin_to_one_cpu() -> int | None:
    """Pin every thread of this process to the last usable CPU; returns it (None: cannot).

    Threads created later inherit the affinity of their creator, so this is done before
    TensorFlow starts its thread pools; threads already running (NumPy's BLAS pool) are
    pinned one by one.
    """
    if not hasattr(os, "sched_setaffinity"):
        return None
    cpu = max(os.sched_getaffinity(0))
    for task in os.listdir("/proc/self/task"):
        with contextlib.suppress(OSError):  # a thread that has just ended
            os.sched_setaffinity(int(task), {cpu})
    return cpu


def verdict(ok: bool) -> str:
    return "PASS" if ok else "FAIL"


# -- macro: model.fit under five configurations ---------------------------------------------


def naive_system_callback() -> Any:
    """A callback that samples the process the obvious way, synchronously, every batch."""
    import keras

    class NaiveSystemCallback(keras.callbacks.Callback):  # type: ignore[misc]
        def __init__(self) -> None:
            super().__init__()
            self.process = psutil.Process()
            self.nvml_handle: Any = None
            self.nvml_error: str | None = None
            self.samples = 0
            try:
                import pynvml

                pynvml.nvmlInit()
                self.nvml_handle = pynvml.nvmlDeviceGetHandleByIndex(0)
            except Exception as err:  # noqa: BLE001 - ImportError or any NVMLError
                self.nvml_error = f"{type(err).__name__}: {err}"

        def on_train_batch_end(self, batch: int, logs: dict[str, Any] | None = None) -> None:
            self.process.memory_info()
            self.process.cpu_times()
            self.process.io_counters()
            if self.nvml_handle is not None:
                import pynvml

                pynvml.nvmlDeviceGetMemoryInfo(self.nvml_handle)
            self.samples += 1

    return NaiveSystemCallback()


def build_model(width: int) -> Any:
    import keras

    keras.utils.set_random_seed(MODEL_SEED)  # every configuration starts from the same weights
    model = keras.Sequential(
        [
            keras.Input((FEATURES,)),
            keras.layers.Dense(width, activation="relu"),
            keras.layers.Dense(width, activation="relu"),
            keras.layers.Dense(1),
        ]
    )
    model.compile(optimizer="adam", loss="mse")
    return model


LOOP_NAMES = ("loop: none", "loop: driftwatch")
"""The custom-loop configurations: without driftwatch, and with the train step recognised."""


class CustomLoop:
    """The same model trained by a custom loop: a ``tf.function`` train step with
    ``GradientTape`` called once per batch of a ``tf.data`` pipeline (``for x, y in``)."""

    def __init__(self, model: Any, x: np.ndarray, y: np.ndarray, batch_size: int) -> None:
        import tensorflow as tf

        self.batches = tf.data.Dataset.from_tensor_slices((x, y)).batch(batch_size)
        import keras

        optimizer = model.optimizer
        loss_function = keras.losses.MeanSquaredError()

        @tf.function  # type: ignore[untyped-decorator]
        def train_step(x: Any, y: Any) -> Any:
            with tf.GradientTape() as tape:
                loss = loss_function(y, model(x, training=True))
            gradients = tape.gradient(loss, model.trainable_variables)
            optimizer.apply_gradients(zip(gradients, model.trainable_variables, strict=True))
            return loss

        self.train_step = train_step

    def run(self, epochs: int) -> None:
        train_step = self.train_step
        for _ in range(epochs):
            for x, y in self.batches:
                train_step(x, y)


class LoopHooks:
    """``driftwatch.hook.custom_loop``'s two patches, switched on for one configuration only
    (what ``driftwatch run`` installs into a job), with a hook of their own."""

    def __init__(self) -> None:
        import tensorflow as tf
        from tensorflow.python.data.ops import iterator_ops

        from driftwatch.hook import custom_loop
        from driftwatch.hook.core import Hook

        self.hook = Hook(run="bench-loop")
        self.recognizer = custom_loop.TrainStepRecognizer(self.hook)
        self._function_class = type(tf.function(bare_train_function))
        self._tape_class = tf.GradientTape
        self._iterator_class = iterator_ops.OwnedIterator
        plain = self._methods_now()
        custom_loop.patch_function_call(self._function_class, self.recognizer)
        custom_loop.patch_gradient(self._tape_class, self.recognizer)
        custom_loop.patch_iterator_next(self._iterator_class, self.recognizer)
        self._methods = {False: plain, True: self._methods_now()}
        self._set(False)

    def _methods_now(self) -> tuple[Any, Any, Any]:
        return (
            self._function_class.__call__,
            self._tape_class.gradient,
            self._iterator_class._next_internal,
        )

    def _set(self, on: bool) -> None:
        (
            self._function_class.__call__,
            self._tape_class.gradient,
            self._iterator_class._next_internal,
        ) = self._methods[on]

    @contextlib.contextmanager
    def patched(self, on: bool) -> Iterator[None]:
        self._set(on)
        try:
            yield
        finally:
            self._set(False)

    def recognised(self) -> str | None:
        step = self.recognizer.step
        return None if step is None else str(step.python_function.__name__)


@dataclass
class MacroResult:
    name: str
    wall: list[float]  # wall-clock seconds per fit, one per round
    cpu: list[float]  # CPU seconds of the whole process (every thread) per fit


@dataclass
class MacroRun:
    results: list[MacroResult]
    in_situ: dict[str, tuple[float, float, float]]  # see measure_in_situ
    notes: list[str]


def run_macro(settings: Settings, workdir: Path) -> MacroRun:
    import keras

    from driftwatch.keras import DriftwatchCallback

    rng = np.random.default_rng(DATA_SEED)
    samples = settings.steps_per_epoch * settings.batch_size
    x = rng.standard_normal((samples, FEATURES)).astype(np.float32)
    y = (x[:, :1] * 0.5 + rng.standard_normal((samples, 1)) * 0.1).astype(np.float32)

    naive = naive_system_callback()
    factories: dict[str, Callable[[], list[Any]]] = {
        "none": list,
        "none-again": list,
        "driftwatch": lambda: [DriftwatchCallback()],
        ARMED: lambda: [armed_callback()],
        "tensorboard": lambda: [
            keras.callbacks.TensorBoard(str(workdir / "tensorboard"), update_freq="batch")
        ],
        "naive-psutil": lambda: [naive],
    }
    fit_names = list(factories)
    models = {name: build_model(settings.width) for name in [*fit_names, *LOOP_NAMES]}
    callbacks = {name: factory() for name, factory in factories.items()}
    callbacks["driftwatch"][0].hook._traces = None  # not polling: the hook before capture
    loops = {name: CustomLoop(models[name], x, y, settings.batch_size) for name in LOOP_NAMES}
    loop_hooks = LoopHooks()
    names = [*fit_names, *LOOP_NAMES]

    def fit(name: str) -> tuple[float, float]:
        gc.collect()
        start = time.perf_counter()
        start_cpu = time.process_time()
        if name in loops:
            with loop_hooks.patched(name == LOOP_NAMES[1]):
                loops[name].run(settings.epochs)
        else:
            models[name].fit(
                x,
                y,
                batch_size=settings.batch_size,
                epochs=settings.epochs,
                shuffle=False,
                verbose=0,
                callbacks=callbacks[name] or None,
            )
        return time.perf_counter() - start, time.process_time() - start_cpu

    steps = settings.steps_per_epoch * settings.epochs
    print(f"warm-up: one fit per configuration ({steps} steps each)", flush=True)
    for name in names:
        seconds, _ = fit(name)
        print(f"  {name:<13} {seconds:7.3f} s  ({seconds / steps * 1e3:.3f} ms/step)", flush=True)

    results = {name: MacroResult(name, [], []) for name in names}
    for round_number in range(settings.rounds):
        for name in rotated(names, round_number):
            wall, cpu = fit(name)
            results[name].wall.append(wall)
            results[name].cpu.append(cpu)
        line = "  ".join(f"{name} {results[name].wall[-1]:.3f}" for name in names)
        print(f"round {round_number + 1:>2}/{settings.rounds}  {line}", flush=True)
    notes = [
        f"{LOOP_NAMES[1]}: the train step recognised as {loop_hooks.recognised()!r}, "
        f"{loop_hooks.hook.global_step} steps timed, {loop_hooks.hook.input_batches} batches' "
        f"input wait timed ({loop_hooks.hook.input_wait_seconds:.3f} s in all)"
    ]
    if naive.nvml_error is not None:
        notes.append(f"naive-psutil: NVML unavailable ({naive.nvml_error}); psutil reads only")
    notes.append(f"naive-psutil: {naive.samples} batches sampled in total")

    print(f"in situ: {settings.in_situ_fits} instrumented driftwatch fits", flush=True)
    in_situ = measure_in_situ(
        lambda: fit("driftwatch"), callbacks["driftwatch"][0], settings.in_situ_fits
    )
    print(f"in situ: {settings.in_situ_fits} instrumented {LOOP_NAMES[1]} runs", flush=True)
    in_situ[LOOP_IN_SITU_ROW] = measure_loop_in_situ(
        lambda: fit(LOOP_NAMES[1]), settings.in_situ_fits
    )
    print("capture: a py-spy dump and a profiler trace, each during one fit", flush=True)
    notes += measure_capture(lambda: fit(ARMED), callbacks[ARMED], steps)
    return MacroRun(list(results.values()), in_situ, notes)


ARMED = "driftwatch+capture"
"""The configuration with capture armed (a request file polled at probes), never triggered."""


def armed_callback() -> Any:
    """A ``DriftwatchCallback`` with a hook of its own (the shared one is left unpolled for
    the ``driftwatch`` row) and a request file beside the channel that asks for nothing."""
    from driftwatch.channel.paths import request_path
    from driftwatch.hook.core import Hook
    from driftwatch.keras import DriftwatchCallback

    callback = DriftwatchCallback()
    callback.hook = Hook(run="bench-capture")
    path = callback.hook._writer.path
    assert path is not None, "no channel: set DRIFTWATCH_RUNTIME_DIR to a usable directory"
    request_path(path).write_text('{"id": 0, "steps": 1, "label": "none"}')  # id 0: invalid
    return callback


def measure_capture(run: Callable[[], object], fit_callbacks: list[Any], steps: int) -> list[str]:
    """Time a py-spy dump and a profiler trace, each during one ``fit`` of the configuration
    whose callbacks are ``fit_callbacks``; notes to print."""
    import keras

    ends: list[float] = []

    class StepClock(keras.callbacks.Callback):  # type: ignore[misc]
        def on_train_batch_end(self, batch: int, logs: dict[str, Any] | None = None) -> None:
            ends.append(time.perf_counter())

    hook = fit_callbacks[0].hook
    fit_callbacks.append(StepClock())  # removed again at the end
    notes = stack_dump_notes(run, ends, steps)
    ends.clear()
    timings, path = traced_run(run, hook)
    fit_callbacks.pop()
    notes.append(profiler_trace_note(timings, ends, path))
    return notes


def step_times(ends: Sequence[float], start: float, end: float) -> tuple[list[float], float]:
    """Durations of the steps (between the batch ``ends``) that overlap ``[start, end]``,
    and the median step."""
    durations = [(b - a, a, b) for a, b in itertools.pairwise(ends)]
    median = statistics.median(d for d, _, _ in durations)
    return [d for d, a, b in durations if b >= start and a <= end], median


def stack_dump_notes(run: Callable[[], object], ends: list[float], steps: int) -> list[str]:
    """Dump this process's stacks with py-spy, from a thread, halfway through one ``run``
    (``ends`` fills with its batch end times): its cost against the steps it overlapped."""
    import threading

    from driftwatch.capture.stack import dump_stacks

    window: list[float] = []

    def dump_halfway() -> None:
        while len(ends) < steps // 2:
            time.sleep(0.001)
        start = time.perf_counter()
        text = dump_stacks(os.getpid())
        window.extend([start, time.perf_counter(), float(len(text))])

    notes: list[str] = []
    thread = threading.Thread(target=dump_halfway)
    thread.start()
    run()
    thread.join()
    if len(window) == 3:
        overlapped, median = step_times(ends, window[0], window[1])
        notes.append(
            f"capture: a py-spy dump of this process took {(window[1] - window[0]) * 1e3:.0f} ms "
            f"({window[2] / 1024:.1f} KiB); the {len(overlapped)} steps it overlapped took "
            f"{max(overlapped, default=math.nan) * 1e3:.1f} ms at most against a median step of "
            f"{median * 1e3:.2f} ms"
        )
    return notes


TRACE_CALLS = ("_start", "_stop")
"""The hook's trace controller's calls that start and stop the TensorFlow Profiler."""


def traced_run(run: Callable[[], object], hook: Any) -> tuple[dict[str, float], Path]:
    """One ``run`` with a profiler trace requested through ``hook``'s request file, as the
    monitor does, its start and stop calls timed: when each began (``_start``, ``_stop``)
    and how long it took (``... seconds``); and the hook's channel."""
    from driftwatch.capture.capturer import TRACE_STEPS
    from driftwatch.channel.requests import TraceRequest, write_request

    traces = hook._traces
    timings: dict[str, float] = {}
    for name in TRACE_CALLS:
        original = getattr(traces, name)

        def timed(*args: Any, _original: Any = original, _name: str = name) -> Any:
            began = time.perf_counter()
            try:
                return _original(*args)
            finally:
                timings[_name] = began
                timings[_name + " seconds"] = time.perf_counter() - began

        setattr(traces, name, timed)
    path = hook._writer.path
    assert path is not None
    write_request(path, TraceRequest(1, TRACE_STEPS, "bench"))
    run()
    for name in TRACE_CALLS:
        delattr(traces, name)
    return timings, path


def profiler_trace_note(timings: dict[str, float], ends: Sequence[float], path: Path) -> str:
    """What the profiler trace cost (see ``traced_run``), against the steps it spanned."""
    from driftwatch.capture.capturer import TRACE_STEPS
    from driftwatch.channel.paths import traces_dir

    if "_start" not in timings or "_stop" not in timings:
        return f"capture: the profiler trace was not taken ({sorted(timings)})"
    traced, median = step_times(ends, timings["_start"], timings["_stop"])
    size = sum(f.stat().st_size for f in (traces_dir(path) / "1").rglob("*.xplane.pb"))
    started, stopped = timings["_start seconds"] * 1e3, timings["_stop seconds"] * 1e3
    return (
        f"capture: a profiler trace of {TRACE_STEPS} steps: start {started:.1f} ms, "
        f"stop (writes the trace, {size / 1024:.0f} KiB) {stopped:.1f} ms; "
        f"the {len(traced)} steps from start to stop took "
        f"{statistics.median(traced) * 1e3:.2f} ms median, {max(traced) * 1e3:.1f} ms at most, "
        f"against a median step of {median * 1e3:.2f} ms"
    )


LOOP_IN_SITU_ROW = "custom loop: recognised step (TrainStepRecognizer.called)"


def measure_loop_in_situ(run: Callable[[], object], runs: int) -> tuple[float, float, float]:
    """Time, inside real custom-loop runs, what the recognised train step costs after each
    call: ``TrainStepRecognizer.called`` (the hook's step path and the recognizer's
    bookkeeping; the patch's few loads and stores around the call are not in it), shimmed
    at the class for ``runs`` runs. (mean µs per step without descheduled calls, median,
    99th percentile), as ``measure_in_situ``."""
    from driftwatch.hook.custom_loop import TrainStepRecognizer

    clock = time.perf_counter
    original = TrainStepRecognizer.called
    calls: list[float] = []

    def timed_called(self: Any, function: Any, start: float, outputs: Any) -> None:
        begin = clock()
        original(self, function, start, outputs)
        calls.append(clock() - begin)

    TrainStepRecognizer.called = timed_called  # type: ignore[method-assign]
    try:
        for _ in range(runs):
            run()
    finally:
        TrainStepRecognizer.called = original  # type: ignore[method-assign]
    ordered = sorted(calls)
    kept = [value for value in calls if value <= PREEMPTED]
    return (
        sum(kept) / len(kept) * 1e6,
        statistics.median(ordered) * 1e6,
        ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))] * 1e6,
    )


def measure_in_situ(
    fit: Callable[[], object], callback: Any, fits: int
) -> dict[str, tuple[float, float, float]]:
    """Time the callback's per-step work inside real ``fit`` calls, after the timed rounds.

    Timing shims are put on the (shared) hook's ``step_started``/``step_ended`` and on the
    callback's ``on_train_batch_end`` (instance attributes, which the callback and its
    train-function wrapper look up on every call), then removed. Between two steps
    TensorFlow's work leaves caches, TLB and branch predictors cold, which no tight loop
    reproduces. Each shim adds two clock reads and a call (a few tenths of a µs).
    Returns, per part: (mean µs per step, median µs per call, 99th percentile µs per call);
    the mean leaves out calls longer than ``PREEMPTED`` (the process was descheduled: on a
    shared machine those are another process's time, not the hook's) and the "preempted"
    entry counts them (first field).
    """
    hook = callback.hook
    clock = time.perf_counter
    started: list[float] = []
    ended_by_wrapper: list[float] = []
    ended_in_batch_end: list[float] = []
    batch_end: list[float] = []
    inside_batch_end = False
    original_started = hook.step_started
    original_ended = hook.step_ended
    original_batch_end = callback.on_train_batch_end

    def timed_started(now: float, steps: int = 1) -> None:
        start = clock()
        original_started(now, steps)
        started.append(clock() - start)

    def timed_ended(now: float) -> None:
        start = clock()
        original_ended(now)
        (ended_in_batch_end if inside_batch_end else ended_by_wrapper).append(clock() - start)

    def timed_batch_end(batch: int, logs: dict[str, Any] | None = None) -> None:
        nonlocal inside_batch_end
        inside_batch_end = True
        start = clock()
        original_batch_end(batch, logs)
        batch_end.append(clock() - start)
        inside_batch_end = False

    hook.step_started = timed_started
    hook.step_ended = timed_ended
    callback.on_train_batch_end = timed_batch_end
    try:
        for _ in range(fits):
            fit()
    finally:
        del hook.step_started, hook.step_ended, callback.on_train_batch_end

    steps = len(started)

    def summary(parts: list[list[float]], calls: list[float]) -> tuple[float, float, float]:
        ordered = sorted(calls)
        kept = sum(value for part in parts for value in part if value <= PREEMPTED)
        return (
            kept / steps * 1e6,
            statistics.median(ordered) * 1e6,
            ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))] * 1e6,
        )

    everything_ended = ended_by_wrapper + ended_in_batch_end
    # One of each per step when callbacks run synchronously (they do with TensorFlow).
    per_step = list(zip(started, ended_by_wrapper, ended_in_batch_end, batch_end, strict=False))
    hook_calls = [start + wrapper + inside for start, wrapper, inside, _ in per_step]
    callback_calls = [start + wrapper + whole for start, wrapper, _, whole in per_step]
    preempted = sum(
        value > PREEMPTED for part in (started, everything_ended, batch_end) for value in part
    )
    return {
        "preempted": (float(preempted), 0.0, 0.0),
        "Hook.step_started": summary([started], started),
        "Hook.step_ended (2 calls a step)": summary([everything_ended], everything_ended),
        "on_train_batch_end (whole)": summary([batch_end], batch_end),
        "Hook per step (started + ended)": summary(
            [started, everything_ended],
            hook_calls,
        ),
        "DriftwatchCallback per step": summary(
            [started, ended_by_wrapper, batch_end],
            callback_calls,
        ),
    }


# -- micro: the hook's per-step path --------------------------------------------------------

# The rows the per-step goal is judged on (the callback row is reported for information).
HOOK_ROWS = (
    "Hook calls, probes off",
    "Hook calls, default probes",
    "with hook.step(), probes off",
    "with hook.step(), default probes",
    "Hook calls, cold caches",
    "custom loop: train step call, default probes",
    "custom loop: train step call, cold caches",
)
OTHER_FUNCTION_ROW = "custom loop: call of another tf.function"
PREEMPTED = 1e-3  # seconds: a per-step call this long was descheduled, see measure_in_situ
BASELINE_ROWS = (
    "empty loop",
    "bare train fn",
    "bare stand-in fn",
    "cold: nothing",
    "cold: bare train fn",
    "cold: bare stand-in fn",
)
EVICT_BYTES = 8 * 2**20


# Hot loops: the whole loop is timed; each returns µs per iteration.


def loop_empty(n: int) -> Callable[[], float]:
    def run() -> float:
        start = time.perf_counter()
        for _ in range(n):
            pass
        return (time.perf_counter() - start) / n * 1e6

    return run


def loop_calls(hook: Any, n: int) -> Callable[[], float]:
    def run() -> float:
        t = time.perf_counter()
        start = time.perf_counter()
        for _ in range(n):
            hook.step_started(t, 1)
            hook.step_ended(t)
        return (time.perf_counter() - start) / n * 1e6

    return run


def loop_with(hook: Any, n: int) -> Callable[[], float]:
    def run() -> float:
        start = time.perf_counter()
        for _ in range(n):
            with hook.step():
                pass
        return (time.perf_counter() - start) / n * 1e6

    return run


def loop_train_function(function: Callable[[Any], Any], n: int) -> Callable[[], float]:
    def run() -> float:
        start = time.perf_counter()
        for _ in range(n):
            function(None)
        return (time.perf_counter() - start) / n * 1e6

    return run


def cold(action: Callable[[int], object], n: int) -> Callable[[], float]:
    """Median µs of one ``action(i)`` right after reading an 8 MiB buffer, which evicts
    the caches as the ~1 ms of TensorFlow work between two real steps does. In a tight loop
    the hook's code and data stay in L1; under ``fit`` they do not."""
    scratch = np.ones(EVICT_BYTES // 8)

    def run() -> float:
        clock = time.perf_counter
        samples = []
        for i in range(n):
            scratch.sum()
            start = clock()
            action(i)
            samples.append(clock() - start)
        return statistics.median(samples) * 1e6

    return run


class FakeModel:
    """Just what ``DriftwatchCallback`` touches on a model, with a train function that does
    nothing, so that only the callback's own per-batch work is timed."""

    steps_per_execution = 1
    weights: list[Any] = []  # noqa: RUF012 - read only

    def __init__(self) -> None:
        self.train_function: Callable[[Any], Any] = bare_train_function


def bare_train_function(iterator: Any) -> Any:
    return None


class StandInFunction:
    """What the custom-loop patch touches on a ``tf.function``, with a call that does
    nothing, so that only the patch's own per-call work is timed."""

    python_function = staticmethod(bare_train_function)

    def __call__(self, iterator: Any) -> Any:
        return None

    def experimental_get_tracing_count(self) -> int:
        return 1


class PatchedStandIn(StandInFunction):
    """The same, its ``__call__`` patched as ``driftwatch run`` patches ``tf.function``'s."""

    _driftwatch_trains = False  # what the patch reads: set once the function computed gradients


@dataclass
class MicroRow:
    name: str
    baseline: str  # the row subtracted from this one ("": none, this is a baseline)
    runner: Callable[[], float]  # one measurement, in µs per step
    micros: list[float]


@dataclass
class MicroSubjects:
    """What the micro benchmark times, set up once: two hooks, the custom-loop stand-ins,
    the callback on a fake model."""

    quiet: Any  # a Hook with probes pushed out of reach
    default: Any  # a Hook with the default probes, watching a real tf.function
    plain_function: StandInFunction
    step_function: PatchedStandIn  # recognised as the train step
    other_function: PatchedStandIn
    callback: Any  # a DriftwatchCallback on model, its training begun
    model: FakeModel
    logs: dict[str, float]


def micro_subjects() -> MicroSubjects:
    """Build the hooks, the patched stand-ins and the callback, as ``run_micro`` uses them."""
    import tensorflow as tf

    from driftwatch.hook import custom_loop
    from driftwatch.hook.core import Hook
    from driftwatch.keras import DriftwatchCallback

    never = 10**15
    quiet = Hook(run="bench-micro", probe_every_steps=never, probe_every_seconds=float(never))
    default = Hook(run="bench-micro")
    traced = tf.function(lambda: tf.constant(0))
    traced()
    default.watch_function(traced)
    default.probe()  # the first probe resolves the devices: not part of the steady state

    loop_hook = Hook(run="bench-micro-loop")  # default probes
    loop_hook.probe()
    custom_loop.patch_function_call(PatchedStandIn, custom_loop.TrainStepRecognizer(loop_hook))
    plain_function = StandInFunction()
    step_function = PatchedStandIn()
    step_function._driftwatch_trains = True  # as if it had computed gradients when traced
    step_function(None)  # recognised as the train step
    other_function = PatchedStandIn()

    callback = DriftwatchCallback()  # the process's shared hook, default probes
    model = FakeModel()
    callback.set_model(model)
    callback.on_train_begin()
    return MicroSubjects(
        quiet,
        default,
        plain_function,
        step_function,
        other_function,
        callback,
        model,
        {"loss": 0.25},
    )


def hot_rows(s: MicroSubjects, n: int) -> list[MicroRow]:
    """The tight-loop variants (``n`` iterations a measurement) and their baselines."""
    callback, model, logs = s.callback, s.model, s.logs

    def callback_loop() -> float:
        train_function = model.train_function
        on_batch_end = callback.on_train_batch_end
        start = time.perf_counter()
        for step in range(n):
            train_function(None)
            on_batch_end(step, logs)
        return (time.perf_counter() - start) / n * 1e6

    return [
        MicroRow("empty loop", "", loop_empty(n), []),
        MicroRow("bare train fn", "", loop_train_function(bare_train_function, n), []),
        MicroRow(HOOK_ROWS[0], "empty loop", loop_calls(s.quiet, n), []),
        MicroRow(HOOK_ROWS[1], "empty loop", loop_calls(s.default, n), []),
        MicroRow(HOOK_ROWS[2], "empty loop", loop_with(s.quiet, n), []),
        MicroRow(HOOK_ROWS[3], "empty loop", loop_with(s.default, n), []),
        MicroRow("DriftwatchCallback per batch", "bare train fn", callback_loop, []),
        MicroRow("bare stand-in fn", "", loop_train_function(s.plain_function, n), []),
        MicroRow(HOOK_ROWS[5], "bare stand-in fn", loop_train_function(s.step_function, n), []),
        MicroRow(
            OTHER_FUNCTION_ROW, "bare stand-in fn", loop_train_function(s.other_function, n), []
        ),
    ]


def cold_rows(s: MicroSubjects, m: int) -> list[MicroRow]:
    """The one-call-at-a-time variants after evicting the caches (``m`` calls a
    measurement) and their baselines."""
    callback, model, logs = s.callback, s.model, s.logs
    quiet, plain_function, step_function = s.quiet, s.plain_function, s.step_function
    t = time.perf_counter()

    def nothing(step: int) -> None:
        pass

    def bare_step(step: int) -> None:
        bare_train_function(None)

    def hook_step(step: int) -> None:
        quiet.step_started(t, 1)
        quiet.step_ended(t)

    def callback_step(step: int) -> None:
        model.train_function(None)
        callback.on_train_batch_end(step, logs)

    def bare_stand_in(step: int) -> None:
        plain_function(None)

    def loop_step(step: int) -> None:
        step_function(None)

    return [
        MicroRow("cold: nothing", "", cold(nothing, m), []),
        MicroRow("cold: bare train fn", "", cold(bare_step, m), []),
        MicroRow(HOOK_ROWS[4], "cold: nothing", cold(hook_step, m), []),
        MicroRow(
            "DriftwatchCallback per batch, cold caches",
            "cold: bare train fn",
            cold(callback_step, m),
            [],
        ),
        MicroRow("cold: bare stand-in fn", "", cold(bare_stand_in, m), []),
        MicroRow(HOOK_ROWS[6], "cold: bare stand-in fn", cold(loop_step, m), []),
    ]


def measure_rows(rows: Sequence[MicroRow], repeats: int) -> None:
    """``repeats`` measurements of every row, the rows' order rotated each repeat."""
    by_name = {row.name: row for row in rows}
    names = [row.name for row in rows]
    for repeat in range(repeats):
        for name in rotated(names, repeat):
            by_name[name].micros.append(by_name[name].runner())
        print(f"micro repeat {repeat + 1}/{repeats} done", flush=True)


def subtract_baselines(rows: Sequence[MicroRow]) -> dict[str, tuple[float, float]]:
    """µs per step (median, best) of each row, its baseline's subtracted (repeat by
    repeat for the median)."""
    by_name = {row.name: row for row in rows}
    results: dict[str, tuple[float, float]] = {}
    for row in rows:
        if not row.baseline:
            results[row.name] = (statistics.median(row.micros), min(row.micros))
            continue
        base = by_name[row.baseline].micros
        diffs = [value - b for value, b in zip(row.micros, base, strict=True)]
        results[row.name] = (statistics.median(diffs), min(row.micros) - min(base))
    return results


def run_micro(settings: Settings) -> tuple[dict[str, tuple[float, float]], list[str]]:
    """µs per step (median, best) of each variant, baseline subtracted."""
    s = micro_subjects()
    rows = [
        *hot_rows(s, settings.micro_iterations),
        *cold_rows(s, settings.micro_cold_iterations),
    ]
    measure_rows(rows, settings.micro_repeats)
    s.callback.on_train_end()
    default = s.default
    notes = [
        f"the default-probe Hook probed about {default.global_step // default.probe_every_steps}"
        f" times (every {default.probe_every_steps} steps)",
    ]
    return subtract_baselines(rows), notes


# -- report ---------------------------------------------------------------------------------


def usable_cpus() -> int | None:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None


def environment(usable: int | None) -> list[str]:
    import keras
    import tensorflow as tf
    from keras.src import backend as keras_backend

    return [
        f"date: {time.strftime('%Y-%m-%d %H:%M:%S %Z')}",
        f"machine: {os.cpu_count()} CPUs ({usable or '?'} usable), {cpu_model()}, "
        f"{psutil.virtual_memory().total / 2**30:.1f} GiB RAM, "
        f"load average {' '.join(f'{v:.2f}' for v in os.getloadavg())}",
        f"python {platform.python_version()}, tensorflow {tf.__version__}, "
        f"keras {keras.__version__} (backend {keras.backend.backend()}, "
        f"IS_THREAD_SAFE={keras_backend.IS_THREAD_SAFE}: batch callbacks run "
        f"{'asynchronously' if keras_backend.IS_THREAD_SAFE else 'synchronously'})",
    ]


def macro_table(
    results: list[MacroResult], settings: Settings, clock: str, watched: str = "driftwatch"
) -> tuple[list[str], tuple[float, float, float]]:
    """The table for ``clock`` ("wall" or "cpu"), ratios to the first row, and the median
    per-round ratio of configuration ``watched`` with its 95% confidence interval."""
    steps = settings.steps_per_epoch * settings.epochs
    base = getattr(results[0], clock)
    base_median = statistics.median(base)
    title = "wall-clock" if clock == "wall" else "process CPU"
    lines = [
        f"| configuration | median {title} per fit (s) | ms/step | ratio of medians "
        "| median per-round ratio | its 95% CI | per-round ratio p25-p75 |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    driftwatch = (math.nan, math.nan, math.nan)
    for result in results:
        seconds: list[float] = getattr(result, clock)
        ratios = [t / b for t, b in zip(seconds, base, strict=True)]
        median = statistics.median(seconds)
        round_ratio = statistics.median(ratios)
        low, high = quartiles(ratios)
        ci_low, ci_high = median_confidence_interval(ratios)
        if result.name == watched:
            driftwatch = (round_ratio, ci_low, ci_high)
        lines.append(
            f"| {result.name} | {median:.3f} | {median / steps * 1e3:.3f} "
            f"| {median / base_median:.3f}x | {round_ratio:.3f}x "
            f"| {ci_low:.3f}-{ci_high:.3f} | {low:.3f}-{high:.3f} |"
        )
    return lines, driftwatch


def micro_table(results: dict[str, tuple[float, float]]) -> tuple[list[str], float]:
    lines = [
        "| per-step path | median µs/step | best µs/step |",
        "|---|---:|---:|",
    ]
    for name, (median, best) in results.items():
        suffix = " (baseline, not subtracted)" if name in BASELINE_ROWS else ""
        lines.append(f"| {name}{suffix} | {median:.3f} | {best:.3f} |")
    worst_hook = max(results[name][0] for name in HOOK_ROWS)
    return lines, worst_hook


def in_situ_table(results: dict[str, tuple[float, float, float]]) -> list[str]:
    lines = [
        "| part | mean µs per step | median µs per call | p99 µs per call |",
        "|---|---:|---:|---:|",
    ]
    for name, (mean, median, p99) in results.items():
        if name != "preempted":
            lines.append(f"| {name} | {mean:.3f} | {median:.3f} | {p99:.3f} |")
    return lines


def arguments(argv: Sequence[str] | None) -> tuple[argparse.Namespace, Settings]:
    """The command line, and the settings it selects (``--quick``, ``--rounds``)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--quick", action="store_true", help="a ~30 s smoke run")
    parser.add_argument("--rounds", type=int, help="override the number of rounds")
    parser.add_argument(
        "--no-pin", action="store_true", help="do not pin the process to one CPU (noisier)"
    )
    args = parser.parse_args(argv)
    settings = QUICK if args.quick else FULL
    if args.rounds is not None:
        settings = Settings(**{**settings.__dict__, "rounds": max(1, args.rounds)})
    return args, settings


def print_setup(settings: Settings, usable: int | None, pinned: int | None) -> None:
    """The environment, the CPU affinity and what the macro benchmark will run."""
    env = environment(usable)
    env.append(
        "affinity: not pinned (all usable CPUs)"
        if pinned is None
        else f"affinity: every thread pinned to CPU {pinned}"
    )
    for line in env:
        print(line)
    steps = settings.steps_per_epoch * settings.epochs
    print(
        f"macro: {settings.rounds} rounds x {6 + len(LOOP_NAMES)} configurations, "
        f"{steps} steps per fit "
        f"({settings.epochs} epochs x {settings.steps_per_epoch}), batch "
        f"{settings.batch_size}, Dense {settings.width}-{settings.width}-1 on "
        f"{FEATURES} features",
        flush=True,
    )


def split_macro(results: list[MacroResult]) -> tuple[list[MacroResult], list[MacroResult]]:
    """The ``fit`` configurations and the custom-loop ones (each with its own baseline)."""
    fits = [result for result in results if result.name not in LOOP_NAMES]
    loops = [result for result in results if result.name in LOOP_NAMES]
    return fits, loops


def print_tables(
    macro: MacroRun, micro: dict[str, tuple[float, float]], settings: Settings
) -> None:
    """The macro (wall clock and CPU time, fit and custom loop), micro and in-situ tables."""
    fits, loops = split_macro(macro.results)
    sections = [
        (
            "macro, wall clock of each fit call (the goal is judged on this):",
            macro_table(fits, settings, "wall")[0],
        ),
        (
            "macro, CPU time of the whole process during each fit (insensitive to other load):",
            macro_table(fits, settings, "cpu")[0],
        ),
        (
            "macro, custom loop (the same steps, a tf.function train step), wall clock:",
            macro_table(loops, settings, "wall", LOOP_NAMES[1])[0],
        ),
        (
            "macro, custom loop, CPU time of the whole process:",
            macro_table(loops, settings, "cpu", LOOP_NAMES[1])[0],
        ),
        (
            "micro, the hook's per-step path (baseline loop subtracted):",
            micro_table(micro)[0],
        ),
    ]
    print()
    for title, lines in sections:
        print(title)
        print("\n".join(lines))
        print()
    print("in situ, inside real fit calls (timing shims included):")
    print("\n".join(in_situ_table(macro.in_situ)))
    limit = f"{PREEMPTED * 1e3:.0f} ms"
    preempted = int(macro.in_situ["preempted"][0])
    print(f"({preempted} calls over {limit}, i.e. descheduled, left out of the means)")
    print()


RATIO_GOALS = (
    ("DriftwatchCallback", "no callback", "driftwatch"),
    ("DriftwatchCallback with capture armed", "no callback", ARMED),
    ("custom loop, step recognised", "no driftwatch", LOOP_NAMES[1]),
)
"""The goals judged on fit time: (what, against what, its row), the row's baseline being the
first row of its group (``none`` for the fit configurations, ``loop: none`` for the loops)."""


def ratio_goal_lines(macro: MacroRun, settings: Settings) -> list[str]:
    """One line per goal of ``RATIO_GOALS``: judged on the wall-clock median per-round
    ratio, the CPU-time ratio beside it."""
    fits, loops = split_macro(macro.results)
    lines = []
    for what, against, row in RATIO_GOALS:
        results = loops if row in LOOP_NAMES else fits
        _, (wall, low, high) = macro_table(results, settings, "wall", row)
        _, (cpu, _, _) = macro_table(results, settings, "cpu", row)
        lines.append(
            f"goal: {what} <= {FIT_RATIO_GOAL:.2f}x {against} "
            f"(wall-clock median per-round ratio {wall:.3f}x, 95% CI "
            f"{low:.3f}-{high:.3f}): {verdict(wall <= FIT_RATIO_GOAL)}"
            f"  [on CPU time: {cpu:.3f}x, {verdict(cpu <= FIT_RATIO_GOAL)}]"
        )
    return lines


def step_goal_line(macro: MacroRun, micro: dict[str, tuple[float, float]]) -> str:
    """The per-step goal, judged on the slowest micro ``Hook`` row; the in-situ figures
    (a real fit, a real custom loop) beside it."""
    _, worst_hook = micro_table(micro)
    in_situ_hook = macro.in_situ["Hook per step (started + ended)"][0]
    loop_in_situ = macro.in_situ[LOOP_IN_SITU_ROW][0]
    return (
        f"goal: hook per-step path <= {STEP_MICROSECONDS_GOAL:.0f} µs "
        f"(slowest Hook row {worst_hook:.3f} µs): {verdict(worst_hook <= STEP_MICROSECONDS_GOAL)}"
        f"  [in a real fit: {in_situ_hook:.3f} µs, "
        f"{verdict(in_situ_hook <= STEP_MICROSECONDS_GOAL)}; in a real custom loop: "
        f"{loop_in_situ:.3f} µs, {verdict(loop_in_situ <= STEP_MICROSECONDS_GOAL)}]"
    )


def report(
    macro: MacroRun,
    micro: dict[str, tuple[float, float]],
    micro_notes: list[str],
    settings: Settings,
    quick: bool,
) -> None:
    """The tables, the notes and the goals' verdicts."""
    print_tables(macro, micro, settings)
    for note in [*macro.notes, *micro_notes]:
        print(f"note: {note}")
    load = " ".join(f"{value:.2f}" for value in os.getloadavg())
    print(f"note: load average at the end: {load}")
    for line in ratio_goal_lines(macro, settings):
        print(line)
    if quick:
        print("      (quick mode: too few rounds to resolve 2%; run without --quick to judge)")
    print(step_goal_line(macro, micro))


def main(argv: Sequence[str] | None = None) -> int:
    args, settings = arguments(argv)
    usable = usable_cpus()
    pinned = None if args.no_pin else pin_to_one_cpu()
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    workdir = Path(tempfile.mkdtemp(prefix="driftwatch-bench-"))
    os.environ["DRIFTWATCH_RUNTIME_DIR"] = str(workdir / "channels")
    began = time.perf_counter()
    try:
        print_setup(settings, usable, pinned)
        macro = run_macro(settings, workdir)
        print(
            f"micro: {settings.micro_repeats} repeats x {settings.micro_iterations} "
            "iterations per variant",
            flush=True,
        )
        micro, micro_notes = run_micro(settings)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    report(macro, micro, micro_notes, settings, args.quick)
    print(f"total time: {time.perf_counter() - began:.0f} s{' (quick mode)' if args.quick else ''}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
