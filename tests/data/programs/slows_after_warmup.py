"""A custom training loop over tf.data that becomes slower after a warm-up, for a known reason.

``--why input``: the pipeline has a map (only then) calling a Python function
(``tf.py_function``) that sleeps 20 ms a batch once ``--warmup`` seconds have passed, as a
decoding step that starts hitting a slow store would; with no prefetch and no parallel calls,
the loop waits for each batch: an input-bound run.

``--why retracing``: the learning rate, a Python float, starts decaying every step after the
warm-up: tf.function traces the train step again at every step. The model is a linear
regression on raw TensorFlow variables and the function has no autograph, so a step is about
a millisecond before and a trace (tens of milliseconds) nearly all of it after. (The bundled
driftwatch/examples/retrace_python_scalar.py retraces from its first step: it has no faster
start to be slower than.)

The run ends after ``--slow-steps`` steps past the warm-up: a slowdown is judged on blocks of
100 steps (4 of them after the change to report it live), and a trace
takes 20 ms on a quiet machine but 300 ms on a busy one, so a time budget would leave too
few slow steps to judge exactly where the test is busiest.

Knows nothing of driftwatch.

python tests/data/programs/slows_after_warmup.py --why input|retracing --logdir DIR
    [--warmup 15] [--slow-steps 500]
"""

from __future__ import annotations

import argparse
import os
import time
from typing import Any

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np
import tensorflow as tf


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--why", choices=("input", "retracing"), required=True)
    parser.add_argument("--logdir", required=True)
    parser.add_argument("--warmup", type=float, default=15.0, help="seconds at full speed")
    parser.add_argument("--slow-steps", type=int, default=500, help="steps after the warm-up")
    args = parser.parse_args()
    slow_from = time.monotonic() + args.warmup
    slow_input = args.why == "input"

    def load(batch: Any) -> Any:
        if time.monotonic() >= slow_from:
            time.sleep(0.02)
        return batch

    rng = np.random.default_rng(0)
    x = rng.normal(size=(4096, 32)).astype("float32")
    y = (x @ rng.normal(size=(32, 1))).astype("float32")
    dataset = tf.data.Dataset.from_tensor_slices((x, y)).batch(64)
    if slow_input:
        dataset = dataset.map(lambda a, b: (tf.py_function(load, [a], tf.float32), b))
    dataset = dataset.repeat()
    weights = tf.Variable(tf.zeros((32, 1)))
    bias = tf.Variable(tf.zeros((1,)))

    @tf.function(autograph=False)  # type: ignore[untyped-decorator]
    def train_step(a: Any, b: Any, lr: float) -> Any:
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(tf.square(tf.ensure_shape(a, (None, 32)) @ weights + bias - b))
        grad_w, grad_b = tape.gradient(loss, [weights, bias])
        weights.assign_sub(lr * grad_w)
        bias.assign_sub(lr * grad_b)
        return loss

    writer = tf.summary.create_file_writer(args.logdir)
    lr = 0.01
    steps = slow_steps = 0
    for a, b in dataset:
        loss = train_step(a, b, lr)
        steps += 1
        if time.monotonic() >= slow_from:
            slow_steps += 1
            if not slow_input:
                lr *= 0.9999  # a new Python float every step: a new trace every step
        if steps % 10 == 0:
            with writer.as_default(step=steps):
                tf.summary.scalar("loss", loss)
        if slow_steps >= args.slow_steps:
            break
    writer.close()
    print(f"{steps} steps, {train_step.experimental_get_tracing_count()} traces")


if __name__ == "__main__":
    main()
