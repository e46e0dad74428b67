"""Custom training loops get the hook with no code change: real TensorFlow jobs, run under
``driftwatch run`` (or with the autolog installed), read back from the history and the hook."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from driftwatch.history.reader import HistoryReader, StoredBucket
from tests.conftest import TF_ENV

pytestmark = [pytest.mark.tf, pytest.mark.paired]

ONE_THREAD = {"TF_NUM_INTRAOP_THREADS": "1", "TF_NUM_INTEROP_THREADS": "1"}

MODEL = """
import sys, time
import numpy as np
import tensorflow as tf
import keras

keras.utils.set_random_seed(0)
model = keras.Sequential(
    [keras.Input((8,)), keras.layers.Dense(16, activation="relu"), keras.layers.Dense(1)]
)
optimizer = keras.optimizers.SGD(0.01)
x = tf.constant(np.random.default_rng(0).normal(size=(32, 8)).astype("float32"))
y = tf.zeros((32, 1))


def loss_and_update(x, y, lr=0.01):
    with tf.GradientTape() as tape:
        loss = tf.reduce_mean((model(x) - y) ** 2) * lr / 0.01
    grads = tape.gradient(loss, model.trainable_variables)
    optimizer.apply_gradients(zip(grads, model.trainable_variables))
    return loss
"""

CUSTOM_LOOP = (
    MODEL
    + """
@tf.function
def train_step(x, y):
    return {"loss": loss_and_update(x, y)}


@tf.function
def evaluate(x):  # called as often as the train step, but trains nothing
    return tf.reduce_mean(model(x))


steps = 0
end = time.monotonic() + float(sys.argv[1])
while time.monotonic() < end:
    train_step(x, y)
    evaluate(x)
    steps += 1
print("steps", steps)
"""
)

RETRACING_LOOP = (
    MODEL
    + """
@tf.function
def train_step(x, y, lr):
    return loss_and_update(x, y, lr)


steps = 0
end = time.monotonic() + float(sys.argv[1])
while time.monotonic() < end:
    train_step(x, y, 0.01 / (1 + steps))  # a Python float: a new trace every call
    steps += 1
print("steps", steps)
"""
)

NAN_AT_THE_END = (
    MODEL
    + """
@tf.function
def train_step(x, y):
    return loss_and_update(x, y)


end = time.monotonic() + float(sys.argv[1])
while time.monotonic() < end:
    train_step(x, y)
for _ in range(3):  # the loss turns NaN in the job's last moments
    train_step(x, y * float("nan"))
"""
)

FIT = (
    MODEL
    + """
model.compile(optimizer="sgd", loss="mse")
data = np.random.default_rng(1).normal(size=(20 * 8, 8)).astype("float32")
model.fit(data, data[:, :1], batch_size=8, epochs=3, verbose=0)
print("steps", 3 * 20)
"""
)


def run_under_driftwatch(
    program: str, tmp_path: Path, *args: str, env: dict[str, str] | None = None
) -> tuple[str, Path]:
    """Run ``program`` under ``driftwatch run`` with its defaults (a free port for its
    metrics, as parallel tests share this machine), ``env`` added to its environment; its
    stdout and the history database."""
    script = tmp_path / "train.py"
    script.write_text(program)
    db = tmp_path / "h.db"
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "driftwatch",
            "run",
            "--listen",
            "127.0.0.1:0",
            "--findings",
            str(tmp_path / "findings.jsonl"),
            "--db",
            str(db),
            "--",
            sys.executable,
            str(script),
            *args,
        ],
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
        env={**os.environ, **TF_ENV, **ONE_THREAD, **(env or {})},
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return result.stdout, db


def steps_run(stdout: str) -> int:
    (line,) = [line for line in stdout.splitlines() if line.startswith("steps ")]
    return int(line.split()[1])


def history_series(db: Path) -> dict[str, list[StoredBucket]]:
    reader = HistoryReader(db)
    try:
        run = reader.run(None)
        return {name: buckets for (name, labels), buckets in reader.series(run.id).items()}
    finally:
        reader.close()


def last(buckets: list[StoredBucket]) -> float:
    return [b.last for b in buckets if b.last == b.last][-1]


def findings(tmp_path: Path) -> list[dict[str, Any]]:
    path = tmp_path / "findings.jsonl"
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def test_a_custom_loop_gets_step_times_without_code_change(tmp_path: Path) -> None:
    stdout, db = run_under_driftwatch(CUSTOM_LOOP, tmp_path, "4")
    steps = steps_run(stdout)
    series = history_series(db)
    assert steps > 20, stdout
    # One record per period between two calls of the train step (start to start): the last
    # call's period never closes. The evaluate function, called as often, is not a step.
    assert last(series["train_step"]) == steps - 1
    step_seconds = [b.mean for b in series["step_seconds"] if b.mean == b.mean]
    assert step_seconds
    assert all(0 < s < 1 for s in step_seconds), step_seconds
    assert "step_gap_seconds" in series
    assert last(series["tracing_count"]) == 0  # traced once, before its first step ended
    assert "hook_nonfinite_total" not in series


def test_a_retracing_custom_loop_has_its_tracing_count_rising(tmp_path: Path) -> None:
    stdout, db = run_under_driftwatch(RETRACING_LOOP, tmp_path, "4")
    steps = steps_run(stdout)
    series = history_series(db)
    assert steps > 5, stdout
    assert last(series["train_step"]) == steps - 1
    # Every call traced anew; the first trace is the normal one.
    assert last(series["tracing_count"]) == steps - 1


def test_a_custom_loop_whose_loss_turns_nan_at_the_end_is_reported(tmp_path: Path) -> None:
    _, db = run_under_driftwatch(NAN_AT_THE_END, tmp_path, "3")
    series = history_series(db)
    assert last(series["hook_nonfinite_total"]) >= 1
    assert "nonfinite" in {f["kind"] for f in findings(tmp_path)}


def test_a_fit_under_run_is_counted_once(tmp_path: Path) -> None:
    stdout, db = run_under_driftwatch(FIT, tmp_path)
    steps = steps_run(stdout)
    series = history_series(db)
    # The callback times fit's train function (and its epochs); the custom-loop recognizer,
    # which would recognise that function too, stays out of it.
    assert last(series["train_step"]) == steps - 1
    assert [b.last for b in series["epoch_seconds"]]


# -- the recognizer's choices, with the autolog installed in a plain job --------------------

REPORT = """
from driftwatch.hook import custom_loop
state = custom_loop.recognizer()
hook = state.hook
print("RESULT", json.dumps({
    "steps": hook.global_step if hook else 0,
    "traces": state.traces.experimental_get_tracing_count() if state.traces else 0,
    "step": getattr(state.step, "__name__", None),
}))
"""


def run_with_autolog(program: str, tmp_path: Path, reporter: str = REPORT) -> dict[str, Any]:
    """Run ``program`` with the autolog installed, as ``driftwatch run`` injects it; what
    ``reporter`` prints of it (by default what the recognizer made of it)."""
    script = "from driftwatch.hook.autolog import install\ninstall()\nimport json\n"
    script += program + reporter
    result = subprocess.run(
        [sys.executable, "-c", script],
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
        env={**os.environ, **TF_ENV, **ONE_THREAD, "DRIFTWATCH_RUNTIME_DIR": str(tmp_path)},
    )
    assert result.returncode == 0, result.stderr[-3000:]
    (line,) = [line for line in result.stdout.splitlines() if line.startswith("RESULT ")]
    report: dict[str, Any] = json.loads(line.removeprefix("RESULT "))
    return report


def test_an_inference_job_of_predict_and_evaluate_calls_is_timed_by_their_callback(
    tmp_path: Path,
) -> None:
    # Expected: with no fit at all, each predict and evaluate call gets the callback, whose
    # steps are their batches (3 predicts of 10 batches, an evaluate of 5); the custom-loop
    # recognizer, which would see their step functions' calls, counts none of them.
    program = """
import numpy as np
import keras
from driftwatch.hook import core
model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(1)])
model.compile(loss="mse")
x = np.zeros((80, 8), "float32")
for _ in range(3):
    model.predict(x, batch_size=8, verbose=0)
model.evaluate(x, x[:, :1], batch_size=16, verbose=0)
"""
    reporter = """
from driftwatch.hook import custom_loop
print("RESULT", json.dumps({
    "callback_steps": core._shared.global_step,
    "recognised": custom_loop.recognizer().hook is not None,
}))
"""
    seen = run_with_autolog(program, tmp_path, reporter)
    assert seen == {"callback_steps": 35, "recognised": False}


def test_a_step_made_anew_every_iteration_stays_the_step_and_counts_as_retracing(
    tmp_path: Path,
) -> None:
    program = (
        MODEL
        + """
for _ in range(12):
    @tf.function  # a new Python function and tf.function each time: traced every time
    def train_step(x, y):
        return loss_and_update(x, y)

    train_step(x, y)
"""
    )
    report = run_with_autolog(program, tmp_path)
    assert report == {"steps": 12, "traces": 12, "step": "train_step"}


TWO_TRAINING_FUNCTIONS = (
    MODEL
    + """
@tf.function
def first_step(x, y):
    return loss_and_update(x, y)

@tf.function
def second_step(x, y):
    return loss_and_update(x, -y)
"""
)


def test_of_two_alternating_training_functions_the_first_is_the_step(tmp_path: Path) -> None:
    program = """
for _ in range(150):  # as a GAN's critic and generator: one step of each per iteration
    first_step(x, y)
    second_step(x, y)
"""
    report = run_with_autolog(TWO_TRAINING_FUNCTIONS + program, tmp_path)
    assert report == {"steps": 150, "traces": 1, "step": "first_step"}


def test_a_new_training_phase_takes_over_as_the_step(tmp_path: Path) -> None:
    program = """
for _ in range(10):  # pre-training, then fine-tuning
    first_step(x, y)
for _ in range(130):
    second_step(x, y)
"""
    report = run_with_autolog(TWO_TRAINING_FUNCTIONS + program, tmp_path)
    # The first 99 fine-tuning calls wait in case pre-training resumes; the rest are steps.
    assert report == {"steps": 10 + 130 - 99, "traces": 1, "step": "second_step"}


def test_a_loop_that_times_itself_with_a_hook_is_not_counted_twice(tmp_path: Path) -> None:
    program = (
        MODEL
        + """
import driftwatch

hook = driftwatch.Hook()

@tf.function
def train_step(x, y):
    return loss_and_update(x, y)

for _ in range(10):
    with hook.step():
        train_step(x, y)
assert hook.global_step == 10
"""
    )
    assert run_with_autolog(program, tmp_path) == {"steps": 0, "traces": 0, "step": None}
