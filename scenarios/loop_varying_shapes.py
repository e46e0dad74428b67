"""Custom loop whose batches each have a new shape: variable-length sequences padded per batch.

Each batch is padded to its own longest sequence, so the time dimension differs from batch
to batch; a ``tf.function`` traces a new graph for every new shape and keeps them all. With
lengths up to a few thousand, new shapes keep coming for the whole run: steps stay slow and
host memory grows. No TensorBoard. Fix: ``input_signature`` with ``None`` dimensions,
``reduce_retracing=True``, or bucketing to a few fixed lengths.

python scenarios/loop_varying_shapes.py [--seconds 20]
"""

from __future__ import annotations

import keras
import numpy as np

from _common import Deadline, done, options, regression_step

BATCH = 16
CHANNELS = 8
MAX_LENGTH = 4000
"""Sequence lengths are drawn from 1 to MAX_LENGTH: thousands of distinct padded shapes."""


def main() -> None:
    args = options(__doc__)
    rng = np.random.default_rng(0)
    model = keras.Sequential(
        [
            keras.Input((None, CHANNELS)),
            keras.layers.Conv1D(16, 3, padding="same", activation="relu"),
            keras.layers.GlobalAveragePooling1D(),
            keras.layers.Dense(1),
        ]
    )
    optimizer = keras.optimizers.Adam(1e-3)
    train_step = regression_step(model, optimizer)

    steps = 0
    deadline = Deadline(args.seconds)
    while not deadline.passed():
        length = int(rng.integers(1, MAX_LENGTH + 1))  # the longest sequence of this batch
        xb = rng.normal(size=(BATCH, length, CHANNELS)).astype("float32")
        yb = xb.mean(axis=(1, 2))[:, None]
        loss = train_step(xb, yb)
        steps += 1
    done(steps=steps, traces=train_step.experimental_get_tracing_count(), loss=float(loss))


if __name__ == "__main__":
    main()
