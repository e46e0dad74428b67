"""Custom loop that keeps a copy of the weights every few steps, as ``tf.Variable``s, to
average them at the end (stochastic weight averaging done by hand).

Every SNAPSHOT_EVERY steps the loop appends ``[tf.Variable(w) for w in weights]`` to a list
meant to be averaged when training ends. Each snapshot is a full copy of the model in
TensorFlow's allocator and none is ever freed: host memory climbs by the model's size every
few steps for as long as the run lasts. No TensorBoard. Fix: keep one running average
(``keras.optimizers`` ``use_ema=True``, or ``avg.assign_add((w - avg) / n)``).

python scenarios/loop_weight_snapshots.py [--seconds 20]
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

WIDTH = 512
"""Two 512-wide hidden layers: about 1.1 MB of float32 weights per snapshot."""
SNAPSHOT_EVERY = 8
BATCH = 64


def main() -> None:
    args = options(__doc__)
    x, y = linear_problem()
    model = dense_net(width=WIDTH)
    train_step = regression_step(model, keras.optimizers.SGD(1e-3, momentum=0.9))
    snapshots: list[list[tf.Variable]] = []
    deadline = Deadline(args.seconds)
    pace = Pace()
    for step, (xb, yb) in enumerate(shuffled_batches(x, y, BATCH)):
        loss = train_step(xb, yb)
        pace.tick()
        if step % SNAPSHOT_EVERY == 0:
            snapshots.append([tf.Variable(weight) for weight in model.trainable_variables])
        if deadline.passed():
            break
    averaged = [tf.add_n(list(copies)) / len(snapshots) for copies in zip(*snapshots, strict=True)]
    for weight, average in zip(model.trainable_variables, averaged, strict=True):
        weight.assign(average)
    kept = sum(int(tf.size(v)) * 4 for v in snapshots[0]) * len(snapshots)
    done(
        steps=len(pace.ends),
        steps_per_second=pace.rates(),
        snapshots=len(snapshots),
        kept_mb=kept >> 20,
        loss=f"{float(loss):.4f}",
    )


if __name__ == "__main__":
    main()
