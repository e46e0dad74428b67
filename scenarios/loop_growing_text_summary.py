"""Custom loop that logs a growing text table to TensorBoard: each summary bigger than the last.

Every 5 steps the loop logs, with ``tf.summary.text``, a Markdown table of every loss and
weight norm logged so far (to read the history in TensorBoard's Text tab). Each summary
holds all the previous rows again, so the bytes written per step grow with the step count and the
event file grows ever faster. Fix: log scalars (``tf.summary.scalar``), or only the newest
rows.

python scenarios/loop_growing_text_summary.py [--seconds 20]
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
EVERY = 5
"""Steps between two text summaries."""


def main() -> None:
    args = options(__doc__)
    x, y = linear_problem()
    model = dense_net()
    optimizer = keras.optimizers.Adam(1e-3)
    writer = tf.summary.create_file_writer(args.logdir)
    train_step = regression_step(model, optimizer)

    dataset = shuffled_batches(x, y, BATCH)
    rows = ["| step | loss | weight norm | seconds |", "| ---: | ---: | ---: | ---: |"]
    steps = 0
    deadline = Deadline(args.seconds)
    for xb, yb in dataset:
        loss = train_step(xb, yb)
        steps += 1
        if steps % EVERY == 0:
            norm = float(tf.linalg.global_norm(model.trainable_variables))
            rows.append(f"| {steps} | {float(loss):.6f} | {norm:.6f} | {deadline.elapsed():.3f} |")
            with writer.as_default(step=steps):
                tf.summary.scalar("loss", loss)
                tf.summary.text("loss_table", "\n".join(rows))
        if deadline.passed():
            break
    writer.close()
    done(steps=steps, rows=len(rows) - 2)


if __name__ == "__main__":
    main()
