"""Custom loop predicting log-counts, logging its loss to TensorBoard; NaN near the end.

The model regresses ``log(count)``. The counts of the data read in the run's last seconds
include zeros: ``log(0)`` is ``-inf``, the loss is infinite, the gradients NaN, and from then
on every weight and every logged loss is NaN. The loss goes to TensorBoard every 10 steps
(``tf.summary.scalar``; the writer flushes when closed). Fix: ``log1p(count)``, or filter
the records; ``tf.debugging.check_numerics`` finds where it starts.

python scenarios/loop_summary_nan.py [--seconds 20]
"""

from __future__ import annotations

from typing import Any

import keras
import numpy as np
import tensorflow as tf

from _common import Deadline, dense_net, done, linear_problem, options

BATCH = 64
LAST_FILE = 3.0
"""Seconds before the end of the run when the loop reaches the file with zero counts."""


def main() -> None:
    args = options(__doc__)
    x, signal = linear_problem()
    counts = np.round(np.exp(1 + signal / 4)).astype("float32") + 1  # all at least 1
    late_counts = counts.copy()
    late_counts[::20] = 0.0  # the last file has empty counts
    model = dense_net()
    optimizer = keras.optimizers.Adam(1e-3)
    writer = tf.summary.create_file_writer(args.logdir)

    @tf.function  # type: ignore[untyped-decorator]
    def train_step(xb: Any, count: Any) -> Any:
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(tf.square(model(xb, training=True) - tf.math.log(count)))
        gradients = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(gradients, model.trainable_variables, strict=True))
        return loss

    steps = 0
    first_nan: float | None = None
    deadline = Deadline(args.seconds)
    while not deadline.passed():
        start = (steps * BATCH) % (len(x) - BATCH)
        source = late_counts if deadline.left() < LAST_FILE else counts
        loss = train_step(x[start : start + BATCH], source[start : start + BATCH])
        steps += 1
        if steps % 10 == 0:
            with writer.as_default(step=steps):
                tf.summary.scalar("loss", loss)
            if first_nan is None and not np.isfinite(loss.numpy()):
                first_nan = deadline.elapsed()
    writer.close()
    done(
        steps=steps,
        loss=float(loss),
        first_nan_logged_at="never" if first_nan is None else f"{first_nan:.1f}s",
    )


if __name__ == "__main__":
    main()
