"""Custom loop that makes its ``tf.function`` inside the loop: a new function every step.

The helper that builds the ``tf.function`` train step is called inside the loop body, so
each iteration makes a fresh function that traces again: every step pays a full trace, and
what each trace leaves behind in TensorFlow's runtime accumulates. Logs the loss to
TensorBoard every 10 steps. Fix: make the ``tf.function`` once, outside the loop.

python scenarios/loop_function_per_step.py [--seconds 20]
"""

from __future__ import annotations

import keras
import tensorflow as tf

from _common import (
    Deadline,
    dense_net,
    done,
    linear_problem,
    options,
    regression_step,
    shuffled_batches,
)

BATCH = 64


def main() -> None:
    args = options(__doc__)
    x, y = linear_problem()
    model = dense_net()
    optimizer = keras.optimizers.SGD(0.01)
    writer = tf.summary.create_file_writer(args.logdir)
    dataset = shuffled_batches(x, y, BATCH)
    steps = 0
    deadline = Deadline(args.seconds)
    for xb, yb in dataset:
        train_step = regression_step(model, optimizer)  # a new tf.function every step
        loss = train_step(xb, yb)
        steps += 1
        if steps % 10 == 0:
            with writer.as_default(step=steps):
                tf.summary.scalar("loss", loss)
        if deadline.passed():
            break
    writer.close()
    done(steps=steps, loss=float(loss))


if __name__ == "__main__":
    main()
