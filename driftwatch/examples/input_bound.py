"""A ``fit`` that spends most of each step waiting for its input: Python preprocessing in
``tf.data``'s ``map``, one example at a time, nothing prefetched.

Each example (a signal of 4096 samples) is smoothed by a Python loop (an exponential moving
average, a recursive filter) called through ``tf.numpy_function`` in a sequential ``map``:
half a millisecond or more an example, 15 ms or more a batch, while the model's own step
takes one or two. The step waits for the rest: a faster accelerator would not help.
driftwatch reports ``input_bound`` (the share of each step spent waiting for the batch).
Fix: preprocess with TensorFlow ops in ``map(..., num_parallel_calls=tf.data.AUTOTUNE)``,
``cache()`` what is the same every epoch, and ``prefetch(tf.data.AUTOTUNE)``.

python driftwatch/examples/input_bound.py [--seconds 40]
"""

from __future__ import annotations

import gc
from typing import Any

import numpy as np
import tensorflow as tf
from common import TimeBudget, arguments, mlp

LENGTH = 4096
"""Samples in each raw signal."""
STRIDE = 128
"""Every STRIDE-th smoothed sample is kept: the model sees LENGTH // STRIDE features."""


def signals(samples: int = 512, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Random walks, float32, and their means (the regression target)."""
    rng = np.random.default_rng(seed)
    walks = np.cumsum(rng.normal(size=(samples, LENGTH)), axis=1) / np.sqrt(LENGTH)
    return walks.astype("float32"), walks.mean(axis=1, keepdims=True).astype("float32")


def smooth(signal: np.ndarray, weight: float = 0.05) -> np.ndarray:
    """The signal's exponential moving average, subsampled: a Python loop over every sample
    (each output depends on the one before, so it is written as a loop)."""
    level = 0.0
    smoothed = []
    for value in signal.tolist():
        level += weight * (value - level)
        smoothed.append(level)
    return np.asarray(smoothed[::STRIDE], dtype=np.float32)


def preprocess(signal: Any, target: Any) -> tuple[Any, Any]:
    features = tf.numpy_function(smooth, [signal], tf.float32)
    features.set_shape((LENGTH // STRIDE,))
    return features, target


def main() -> None:
    args = arguments(__doc__).parse_args()  # --logdir is accepted; nothing is logged
    x, y = signals()
    dataset = (
        tf.data.Dataset.from_tensor_slices((x, y))
        .shuffle(len(x))
        .repeat()
        .map(preprocess)  # sequential: one example at a time, in Python
        .batch(32)  # and no .prefetch(): the step waits for each batch
    )
    model = mlp(features=LENGTH // STRIDE)
    model.compile(optimizer="adam", loss="mse")
    model.fit(
        dataset,
        steps_per_epoch=len(x) // 32,
        epochs=1000,
        verbose=0,
        callbacks=[TimeBudget(args.seconds)],
    )
    # The pipeline's iterator, which calls into Python, is freed while the interpreter is
    # whole: freed at its shutdown, such an iterator can hang the exit.
    del dataset
    gc.collect()


if __name__ == "__main__":
    main()
