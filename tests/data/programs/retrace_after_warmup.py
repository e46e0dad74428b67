"""A custom loop whose learning-rate schedule starts decaying, as a Python float, after a
warm-up: from then on tf.function traces the train step again at every step.

The model is a plain linear regression on raw TensorFlow variables, so that a step is about
a millisecond before and a trace (tens of milliseconds; no autograph, to keep it short) is
nearly all of it after: the steps become many times slower at once. A slowdown is judged on
blocks of 100 steps, 8 of them after the change at the least: the run retraces long enough
for about a thousand steps. The bundled
driftwatch/examples/retrace_python_scalar.py retraces from its first step (a Keras model: a
trace of ~150 ms a step), so it has no faster start to be slower than. Knows nothing of
driftwatch.

python tests/data/programs/retrace_after_warmup.py --logdir DIR [--seconds 100] [--warmup 20]
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
    parser.add_argument("--logdir", required=True)
    parser.add_argument("--seconds", type=float, default=100.0)
    parser.add_argument("--warmup", type=float, default=20.0)
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    x = tf.constant(rng.normal(size=(4096, 32)).astype("float32"))
    y = x @ tf.constant(rng.normal(size=(32, 1)).astype("float32"))
    weights = tf.Variable(tf.zeros((32, 1)))
    bias = tf.Variable(tf.zeros((1,)))

    @tf.function(autograph=False)  # type: ignore[untyped-decorator]
    def train_step(a: Any, b: Any, lr: float) -> Any:
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(tf.square(a @ weights + bias - b))
        grad_w, grad_b = tape.gradient(loss, [weights, bias])
        weights.assign_sub(lr * grad_w)
        bias.assign_sub(lr * grad_b)
        return loss

    writer = tf.summary.create_file_writer(args.logdir)
    lr = 0.01
    start = time.monotonic()
    decay_from, deadline = start + args.warmup, start + args.seconds
    steps = 0
    while time.monotonic() < deadline:
        first = steps * 64 % 4096
        loss = train_step(x[first : first + 64], y[first : first + 64], lr)
        if time.monotonic() >= decay_from:
            lr *= 0.9999  # a new Python float every step: a new trace every step
        steps += 1
        if steps % 10 == 0:
            with writer.as_default(step=steps):
                tf.summary.scalar("loss", loss)
    writer.close()
    print(f"{steps} steps, {train_step.experimental_get_tracing_count()} traces")


if __name__ == "__main__":
    main()
