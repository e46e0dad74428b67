"""How much does driftwatch's in-process hook cost a training job?

Run: ``.venv/bin/python bench/hook_overhead.py`` (about 3-4 minutes on a 2-core box), or
``--quick`` for a ~30 s smoke run. It always exits 0: it is a measurement, not a test.

Macro benchmark
    ``model.fit`` of a small Keras MLP (16 features -> Dense 256 -> Dense 256 -> 1, batch
    128: about 1 ms per CPU step here), ``verbose=0``, the same data and the same number of
    steps, under four configurations:

    * ``none``: no callback (Keras still adds its ``History`` callback and converts the
      logs to Python floats every batch, as it does in every configuration);
    * ``driftwatch``: ``driftwatch.keras.DriftwatchCallback()`` with its default settings;
    * ``tensorboard``: ``keras.callbacks.TensorBoard(logdir, update_freq="batch")``;
    * ``naive-psutil``: a callback that, every batch, reads the process's memory, CPU times
      and I/O counters with psutil (and NVML memory, where a driver is present).

    Each configuration gets its own model, built identically (same seed) and compiled
    once, and its own callback instances, created once; one warm-up ``fit`` per
    configuration absorbs tracing. Then every round runs one ``fit`` of each configuration,
    one after another, with the order rotated by one place each round so that no
    configuration always runs first or last (on a shared, noisy machine this cancels
    drift). Each ``fit`` call is timed with ``time.perf_counter`` (wall clock). For each
    configuration the report gives the median time, the ratio of its median to the
    ``none`` median, and the median of the per-round ratios (configuration / ``none`` of
    the same round), which is the more robust figure when the machine's speed drifts, with
    the 25th-75th percentile of those per-round ratios as a measure of the noise.

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
    one-entry logs dict. An empty loop (and, for the callback, a loop calling the bare
    train function) is timed alongside and subtracted. All variants alternate, rotated,
    over several repeats; the report gives the median and best µs per step.

Goals: ``DriftwatchCallback`` at most 1.02x the ``none`` time (judged on the median of
per-round ratios), and the hook's per-step path at most 5 µs (judged on the slowest of the
``Hook`` rows).

All ``DriftwatchCallback`` instances in a process share one hook (``shared_hook``); its
channel files go to a temporary ``DRIFTWATCH_RUNTIME_DIR`` that is removed at the end.
"""

from __future__ import annotations

import argparse
import gc
import os
import platform
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
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
    micro_repeats: int


FULL = Settings(
    rounds=24,
    steps_per_epoch=500,
    epochs=2,
    batch_size=128,
    width=256,
    micro_iterations=1_000_000,
    micro_repeats=5,
)
QUICK = Settings(
    rounds=5,
    steps_per_epoch=100,
    epochs=2,
    batch_size=128,
    width=256,
    micro_iterations=200_000,
    micro_repeats=3,
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


def verdict(ok: bool) -> str:
    return "PASS" if ok else "FAIL"


# -- macro: model.fit under four configurations ---------------------------------------------


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


@dataclass
class MacroResult:
    name: str
    times: list[float]  # seconds per fit, one per round
    ratios: list[float]  # per round: this fit / the "none" fit of the same round


def run_macro(settings: Settings, workdir: Path) -> tuple[list[MacroResult], list[str]]:
    import keras

    from driftwatch.keras import DriftwatchCallback

    rng = np.random.default_rng(DATA_SEED)
    samples = settings.steps_per_epoch * settings.batch_size
    x = rng.standard_normal((samples, FEATURES)).astype(np.float32)
    y = (x[:, :1] * 0.5 + rng.standard_normal((samples, 1)) * 0.1).astype(np.float32)

    naive = naive_system_callback()
    factories: dict[str, Callable[[], list[Any]]] = {
        "none": list,
        "driftwatch": lambda: [DriftwatchCallback()],
        "tensorboard": lambda: [
            keras.callbacks.TensorBoard(str(workdir / "tensorboard"), update_freq="batch")
        ],
        "naive-psutil": lambda: [naive],
    }
    names = list(factories)
    models = {name: build_model(settings.width) for name in names}
    callbacks = {name: factory() for name, factory in factories.items()}

    def fit(name: str) -> float:
        gc.collect()
        start = time.perf_counter()
        models[name].fit(
            x,
            y,
            batch_size=settings.batch_size,
            epochs=settings.epochs,
            shuffle=False,
            verbose=0,
            callbacks=callbacks[name] or None,
        )
        return time.perf_counter() - start

    steps = settings.steps_per_epoch * settings.epochs
    print(f"warm-up: one fit per configuration ({steps} steps each)", flush=True)
    for name in names:
        seconds = fit(name)
        print(f"  {name:<13} {seconds:7.3f} s  ({seconds / steps * 1e3:.3f} ms/step)", flush=True)

    times: dict[str, list[float]] = {name: [] for name in names}
    for round_number in range(settings.rounds):
        order = rotated(names, round_number)
        for name in order:
            times[name].append(fit(name))
        line = "  ".join(f"{name} {times[name][-1]:.3f}" for name in names)
        print(f"round {round_number + 1:>2}/{settings.rounds}  {line}", flush=True)

    base = times["none"]
    results = [
        MacroResult(name, times[name], [t / b for t, b in zip(times[name], base, strict=True)])
        for name in names
    ]
    notes = []
    if naive.nvml_error is not None:
        notes.append(f"naive-psutil: NVML unavailable ({naive.nvml_error}); psutil reads only")
    notes.append(f"naive-psutil: {naive.samples} batches sampled in total")
    return results, notes


# -- micro: the hook's per-step path --------------------------------------------------------

# The rows the per-step goal is judged on (the callback row is reported for information).
HOOK_ROWS = (
    "Hook calls, probes off",
    "Hook calls, default probes",
    "with hook.step(), probes off",
    "with hook.step(), default probes",
)


def loop_empty(n: int) -> float:
    start = time.perf_counter()
    for _ in range(n):
        pass
    return time.perf_counter() - start


def loop_calls(hook: Any, n: int) -> Callable[[], float]:
    def run() -> float:
        t = time.perf_counter()
        start = time.perf_counter()
        for _ in range(n):
            hook.step_started(t, 1)
            hook.step_ended(t)
        return time.perf_counter() - start

    return run


def loop_with(hook: Any, n: int) -> Callable[[], float]:
    def run() -> float:
        start = time.perf_counter()
        for _ in range(n):
            with hook.step():
                pass
        return time.perf_counter() - start

    return run


def loop_train_function(function: Callable[[Any], Any], n: int) -> float:
    start = time.perf_counter()
    for _ in range(n):
        function(None)
    return time.perf_counter() - start


class FakeModel:
    """Just what ``DriftwatchCallback`` touches on a model, with a train function that does
    nothing, so that only the callback's own per-batch work is timed."""

    steps_per_execution = 1
    weights: list[Any] = []  # noqa: RUF012 - read only

    def __init__(self) -> None:
        self.train_function: Callable[[Any], Any] = bare_train_function


def bare_train_function(iterator: Any) -> Any:
    return None


@dataclass
class MicroRow:
    name: str
    baseline: str
    runner: Callable[[], float]
    seconds: list[float]


def run_micro(settings: Settings) -> tuple[dict[str, tuple[float, float]], list[str]]:
    """µs per step (median, best) of each variant, baseline subtracted."""
    import tensorflow as tf

    from driftwatch.hook.core import Hook
    from driftwatch.keras import DriftwatchCallback

    n = settings.micro_iterations
    never = 10**15
    quiet = Hook(run="bench-micro", probe_every_steps=never, probe_every_seconds=float(never))
    default = Hook(run="bench-micro")
    traced = tf.function(lambda: tf.constant(0))
    traced()
    default.watch_function(traced)
    default.probe()  # the first probe resolves the devices: not part of the steady state

    callback = DriftwatchCallback()  # the process's shared hook, default probes
    model = FakeModel()
    callback.set_model(model)
    callback.on_train_begin()
    logs = {"loss": 0.25}

    def callback_loop() -> float:
        train_function = model.train_function
        on_batch_end = callback.on_train_batch_end
        start = time.perf_counter()
        for step in range(n):
            train_function(None)
            on_batch_end(step, logs)
        return time.perf_counter() - start

    rows = [
        MicroRow("empty loop", "", lambda: loop_empty(n), []),
        MicroRow("bare train fn", "", lambda: loop_train_function(bare_train_function, n), []),
        MicroRow(HOOK_ROWS[0], "empty loop", loop_calls(quiet, n), []),
        MicroRow(HOOK_ROWS[1], "empty loop", loop_calls(default, n), []),
        MicroRow(HOOK_ROWS[2], "empty loop", loop_with(quiet, n), []),
        MicroRow(HOOK_ROWS[3], "empty loop", loop_with(default, n), []),
        MicroRow("DriftwatchCallback per batch", "bare train fn", callback_loop, []),
    ]
    names = [row.name for row in rows]
    by_name = {row.name: row for row in rows}
    for repeat in range(settings.micro_repeats):
        for name in rotated(names, repeat):
            by_name[name].seconds.append(by_name[name].runner())
        print(f"micro repeat {repeat + 1}/{settings.micro_repeats} done", flush=True)
    callback.on_train_end()

    results: dict[str, tuple[float, float]] = {}
    for row in rows:
        if not row.baseline:
            results[row.name] = (
                statistics.median(row.seconds) / n * 1e6,
                min(row.seconds) / n * 1e6,
            )
            continue
        base = by_name[row.baseline].seconds
        diffs = [(s - b) / n * 1e6 for s, b in zip(row.seconds, base, strict=True)]
        results[row.name] = (
            statistics.median(diffs),
            min(row.seconds) / n * 1e6 - min(base) / n * 1e6,
        )
    notes = [
        f"default Hook probes fired {default.global_step // default.probe_every_steps} times "
        f"(every {default.probe_every_steps} steps)",
    ]
    return results, notes


# -- report ---------------------------------------------------------------------------------


def environment() -> list[str]:
    import keras
    import tensorflow as tf
    from keras.src import backend as keras_backend

    affinity = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else "?"
    return [
        f"date: {time.strftime('%Y-%m-%d %H:%M:%S %Z')}",
        f"machine: {os.cpu_count()} CPUs ({affinity} usable), {cpu_model()}, "
        f"{psutil.virtual_memory().total / 2**30:.1f} GiB RAM, "
        f"load average {' '.join(f'{v:.2f}' for v in os.getloadavg())}",
        f"python {platform.python_version()}, tensorflow {tf.__version__}, "
        f"keras {keras.__version__} (backend {keras.backend.backend()}, "
        f"IS_THREAD_SAFE={keras_backend.IS_THREAD_SAFE}: batch callbacks run "
        f"{'asynchronously' if keras_backend.IS_THREAD_SAFE else 'synchronously'})",
    ]


def macro_table(results: list[MacroResult], settings: Settings) -> tuple[list[str], float]:
    steps = settings.steps_per_epoch * settings.epochs
    base_median = statistics.median(results[0].times)
    lines = [
        "| configuration | median fit (s) | ms/step | ratio of medians "
        "| median per-round ratio | per-round ratio p25-p75 |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    driftwatch_ratio = float("nan")
    for result in results:
        median = statistics.median(result.times)
        round_ratio = statistics.median(result.ratios)
        low, high = quartiles(result.ratios)
        if result.name == "driftwatch":
            driftwatch_ratio = round_ratio
        lines.append(
            f"| {result.name} | {median:.3f} | {median / steps * 1e3:.3f} "
            f"| {median / base_median:.3f}x | {round_ratio:.3f}x | {low:.3f}-{high:.3f} |"
        )
    return lines, driftwatch_ratio


def micro_table(results: dict[str, tuple[float, float]]) -> tuple[list[str], float]:
    lines = [
        "| per-step path | median µs/step | best µs/step |",
        "|---|---:|---:|",
    ]
    for name, (median, best) in results.items():
        suffix = " (baseline, not subtracted)" if name in ("empty loop", "bare train fn") else ""
        lines.append(f"| {name}{suffix} | {median:.3f} | {best:.3f} |")
    worst_hook = max(results[name][0] for name in HOOK_ROWS)
    return lines, worst_hook


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--quick", action="store_true", help="a ~30 s smoke run")
    parser.add_argument("--rounds", type=int, help="override the number of rounds")
    args = parser.parse_args(argv)
    settings = QUICK if args.quick else FULL
    if args.rounds is not None:
        settings = Settings(**{**settings.__dict__, "rounds": max(1, args.rounds)})

    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    workdir = Path(tempfile.mkdtemp(prefix="driftwatch-bench-"))
    os.environ["DRIFTWATCH_RUNTIME_DIR"] = str(workdir / "channels")
    began = time.perf_counter()
    try:
        env = environment()
        for line in env:
            print(line)
        steps = settings.steps_per_epoch * settings.epochs
        print(
            f"macro: {settings.rounds} rounds x 4 configurations, {steps} steps per fit "
            f"({settings.epochs} epochs x {settings.steps_per_epoch}), batch "
            f"{settings.batch_size}, Dense {settings.width}-{settings.width}-1 on "
            f"{FEATURES} features",
            flush=True,
        )
        macro, macro_notes = run_macro(settings, workdir)
        print(
            f"micro: {settings.micro_repeats} repeats x {settings.micro_iterations} "
            "iterations per variant",
            flush=True,
        )
        micro, micro_notes = run_micro(settings)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)

    macro_lines, driftwatch_ratio = macro_table(macro, settings)
    micro_lines, worst_hook = micro_table(micro)
    fit_ok = driftwatch_ratio <= FIT_RATIO_GOAL
    step_ok = worst_hook <= STEP_MICROSECONDS_GOAL
    print()
    print("\n".join(macro_lines))
    print()
    print("\n".join(micro_lines))
    print()
    for note in [*macro_notes, *micro_notes]:
        print(f"note: {note}")
    print(
        f"goal: DriftwatchCallback <= {FIT_RATIO_GOAL:.2f}x no callback "
        f"(median per-round ratio {driftwatch_ratio:.3f}x): {verdict(fit_ok)}"
    )
    print(
        f"goal: hook per-step path <= {STEP_MICROSECONDS_GOAL:.0f} µs "
        f"(slowest Hook row {worst_hook:.3f} µs): {verdict(step_ok)}"
    )
    print(f"total time: {time.perf_counter() - began:.0f} s{' (quick mode)' if args.quick else ''}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
