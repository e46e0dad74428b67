"""A custom training loop over tf.data whose map becomes slow after a warm-up.

The map calls a Python function (``tf.py_function``) that sleeps 20 ms an element once
``--warmup`` seconds have passed, as a decoding or augmentation step that starts hitting a
slow store would; the pipeline has no prefetch and no parallel calls, so the loop waits for
each batch: an input-bound run. Knows nothing of driftwatch.

python tests/data/programs/slow_input_loop.py [--seconds 50] [--warmup 15]
"""

from __future__ import annotations

import argparse
import os
import time
from typing import Any

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras
import numpy as np
import tensorflow as tf


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--logdir", required=True)
    parser.add_argument("--seconds", type=float, default=50.0)
    parser.add_argument("--warmup", type=float, default=15.0)
    args = parser.parse_args()
    slow_from = time.monotonic() + args.warmup

    def load(x: Any) -> Any:
        if time.monotonic() >= slow_from:
            time.sleep(0.02)
        return x

    rng = np.random.default_rng(0)
    x = rng.normal(size=(4096, 32)).astype("float32")
    y = (x @ rng.normal(size=(32, 1))).astype("float32")
    dataset = (
        tf.data.Dataset.from_tensor_slices((x, y))
        .batch(64)
        .map(lambda a, b: (tf.py_function(load, [a], tf.float32), b))
        .repeat()
    )
    model = keras.Sequential(
        [keras.Input((32,)), keras.layers.Dense(64, activation="relu"), keras.layers.Dense(1)]
    )
    optimizer = keras.optimizers.SGD(0.01)

    @tf.function  # type: ignore[untyped-decorator]
    def train_step(a: Any, b: Any) -> Any:
        with tf.GradientTape() as tape:
            loss = keras.ops.mean(keras.ops.square(model(a, training=True) - b))
        optimizer.apply_gradients(
            zip(
                tape.gradient(loss, model.trainable_variables),
                model.trainable_variables,
                strict=True,
            )
        )
        return loss

    writer = tf.summary.create_file_writer(args.logdir)
    deadline = time.monotonic() + args.seconds
    for steps, (a, b) in enumerate(dataset, 1):
        loss = train_step(tf.ensure_shape(a, (None, 32)), b)
        if steps % 10 == 0:
            with writer.as_default(step=steps):
                tf.summary.scalar("loss", loss)
        if time.monotonic() >= deadline:
            break
    writer.close()


if __name__ == "__main__":
    main()
