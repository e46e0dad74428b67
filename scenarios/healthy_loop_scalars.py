"""Healthy: a custom loop that logs scalars to TensorBoard every 50 steps.

``tf.summary.scalar`` for the loss, the learning rate and the weight norm every 50 steps,
into one event file that grows by a few bytes per logged step at a constant rate; the
learning rate decays inside the optimizer (a schedule), not through Python values.

python scenarios/healthy_loop_scalars.py [--seconds 20]
"""

from __future__ import annotations

import keras
import tensorflow as tf

from _common import (
    Deadline,
    Pace,
    dense_net,
    done,
    linear_problem,
    options,
    regression_step,
    shuffled_batches,
)

BATCH = 64
EVERY = 50
"""Steps between two logged scalars."""


def main() -> None:
    args = options(__doc__)
    x, y = linear_problem()
    model = dense_net()
    schedule = keras.optimizers.schedules.ExponentialDecay(1e-3, 1000, 0.9)
    optimizer = keras.optimizers.Adam(schedule)
    writer = tf.summary.create_file_writer(args.logdir)
    train_step = regression_step(model, optimizer)

    dataset = shuffled_batches(x, y, BATCH)
    pace = Pace()
    deadline = Deadline(args.seconds)
    for step, (xb, yb) in enumerate(dataset, start=1):
        loss = train_step(xb, yb)
        pace.tick()
        if step % EVERY == 0:
            with writer.as_default(step=step):
                tf.summary.scalar("loss", loss)
                tf.summary.scalar("learning_rate", schedule(step))
                tf.summary.scalar("weight_norm", tf.linalg.global_norm(model.trainable_variables))
        if deadline.passed():
            break
    writer.close()
    done(
        steps=len(pace.ends),
        steps_per_second=pace.rates(),
        step_ms=pace.step_ms(),
        traces=train_step.experimental_get_tracing_count(),
    )


if __name__ == "__main__":
    main()
