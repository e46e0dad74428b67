"""Custom loop that keeps every batch's predictions, as tensors, in a Python list.

To compute an epoch-level metric at the end, the loop appends each batch's output tensor to
a list; the epoch never ends within the run, so every tensor stays alive and host memory
climbs for as long as the loop runs (a common "memory leak in my custom training loop"
report). No TensorBoard. Fix: keep ``.numpy()`` summaries, or update a metric object.

python scenarios/loop_keeps_outputs.py [--seconds 20]
"""

from __future__ import annotations

from typing import Any

import keras
import tensorflow as tf

from _common import Deadline, dense_net, done, linear_problem, options, shuffled_batches

BATCH = 256
WIDTH = 512
"""Each batch's kept output is BATCH x WIDTH float32: 512 KiB."""


def main() -> None:
    args = options(__doc__)
    x, y = linear_problem()
    features = dense_net(width=WIDTH, outputs=WIDTH)
    head = keras.layers.Dense(1)
    optimizer = keras.optimizers.Adam(1e-3)

    @tf.function  # type: ignore[untyped-decorator]
    def train_step(xb: Any, yb: Any) -> tuple[Any, Any]:
        with tf.GradientTape() as tape:
            hidden = features(xb, training=True)
            loss = tf.reduce_mean(tf.square(head(hidden) - yb))
        variables = features.trainable_variables + head.trainable_variables
        optimizer.apply_gradients(zip(tape.gradient(loss, variables), variables, strict=True))
        return loss, hidden

    dataset = shuffled_batches(x, y, BATCH)
    outputs: list[Any] = []
    deadline = Deadline(args.seconds)
    for xb, yb in dataset:
        loss, hidden = train_step(xb, yb)
        outputs.append(hidden)  # kept until the "epoch" ends, which it never does
        if deadline.passed():
            break
    done(steps=len(outputs), loss=float(loss), kept_mb=len(outputs) * BATCH * WIDTH * 4 >> 20)


if __name__ == "__main__":
    main()
