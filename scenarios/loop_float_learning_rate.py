"""Custom loop that passes a decaying learning rate to its tf.function as a Python float.

A Python scalar argument is part of a ``tf.function``'s trace signature: every new value
traces (and keeps) a new concrete function, so each step pays a trace and host memory grows
with the step count (TensorFlow warns a few times about "excessive retracing", then falls
silent). Logs the loss to TensorBoard every 10 steps. Fix: pass ``tf.constant(lr)`` or keep
the rate in a ``tf.Variable`` / the optimizer's schedule.

python scenarios/loop_float_learning_rate.py [--seconds 20]
"""

from __future__ import annotations

from typing import Any

import tensorflow as tf

from _common import Deadline, dense_net, done, linear_problem, options, shuffled_batches

BATCH = 64


def main() -> None:
    args = options(__doc__)
    x, y = linear_problem()
    model = dense_net()
    writer = tf.summary.create_file_writer(args.logdir)

    @tf.function  # type: ignore[untyped-decorator]
    def train_step(xb: Any, yb: Any, learning_rate: float) -> Any:
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(tf.square(model(xb, training=True) - yb))
        for variable, gradient in zip(
            model.trainable_variables,
            tape.gradient(loss, model.trainable_variables),
            strict=True,
        ):
            variable.assign_sub(learning_rate * gradient)
        return loss

    dataset = shuffled_batches(x, y, BATCH)
    learning_rate = 0.01
    steps = 0
    deadline = Deadline(args.seconds)
    for xb, yb in dataset:
        loss = train_step(xb, yb, learning_rate)
        learning_rate *= 0.999  # a new Python float every step: a new trace every step
        steps += 1
        if steps % 10 == 0:
            with writer.as_default(step=steps):
                tf.summary.scalar("loss", loss)
        if deadline.passed():
            break
    writer.close()
    done(steps=steps, traces=train_step.experimental_get_tracing_count(), loss=float(loss))


if __name__ == "__main__":
    main()
