"""Custom loop that makes a new optimizer each epoch and passes it to its ``tf.function``.

To apply a new learning rate (and "reset" Adam's moments) the loop builds a fresh
``keras.optimizers.Adam`` every epoch of 20 steps and calls ``train_step(optimizer, x, y)``.
``tf.function`` keys its traces on Python objects by identity: each new optimizer traces
the step again, and each trace keeps a graph and the optimizer it captured (with its slot
variables) alive. Steps slow at every epoch start and host memory grows epoch after epoch.
No TensorBoard. Fix: one optimizer, with its ``learning_rate`` assigned (or a schedule), and
the step closing over it instead of taking it as an argument.

python scenarios/loop_optimizer_argument.py [--seconds 20]
"""

from __future__ import annotations

from typing import Any

import keras
import tensorflow as tf

from _common import Deadline, Pace, dense_net, done, linear_problem, options, shuffled_batches

STEPS_PER_EPOCH = 20
BATCH = 64


def main() -> None:
    args = options(__doc__)
    x, y = linear_problem()
    model = dense_net(width=128)

    @tf.function  # type: ignore[untyped-decorator]
    def train_step(optimizer: Any, xb: Any, yb: Any) -> Any:
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(tf.square(model(xb, training=True) - yb))
        gradients = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(gradients, model.trainable_variables, strict=True))
        return loss

    batches = iter(shuffled_batches(x, y, BATCH))
    deadline = Deadline(args.seconds)
    pace = Pace()
    epoch = 0
    while not deadline.passed():
        optimizer = keras.optimizers.Adam(1e-3 * 0.99**epoch)
        optimizer.build(model.trainable_variables)
        for _ in range(STEPS_PER_EPOCH):
            xb, yb = next(batches)
            loss = train_step(optimizer, xb, yb)
            pace.tick()
        epoch += 1
    done(
        epochs=epoch,
        steps=len(pace.ends),
        steps_per_second=pace.rates(),
        traces=train_step.experimental_get_tracing_count(),
        loss=f"{float(loss):.4f}",
    )


if __name__ == "__main__":
    main()
