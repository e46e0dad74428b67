"""Custom loop whose plateau check re-sorts the whole loss history every step.

To lower the learning rate when training plateaus, after each step the loop appends the
loss to a Python list and compares the median of the last window with the median of
everything before it, with ``statistics.median`` over the whole history: host work per step
grows with the step count, and the steps slow down for as long as the run lasts. No
TensorBoard. Fix: keep a running statistic, or check every N steps over a bounded window.

python scenarios/loop_plateau_check.py [--seconds 20]
"""

from __future__ import annotations

import statistics

import keras

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

BATCH = 32
WINDOW = 100
"""Steps in the recent window the plateau check compares with the whole history."""


def main() -> None:
    args = options(__doc__)
    x, y = linear_problem()
    model = dense_net()
    optimizer = keras.optimizers.Adam(1e-3)
    train_step = regression_step(model, optimizer)

    dataset = shuffled_batches(x, y, BATCH)
    history: list[float] = []
    reductions = 0
    pace = Pace()
    deadline = Deadline(args.seconds)
    for xb, yb in dataset:
        history.append(float(train_step(xb, yb)))
        if len(history) > WINDOW:
            recent = statistics.median(history[-WINDOW:])
            if recent > 0.99 * statistics.median(history):  # sorts every loss so far
                optimizer.learning_rate.assign(optimizer.learning_rate * 0.999)
                reductions += 1
        pace.tick()
        if deadline.passed():
            break
    done(steps=len(history), steps_per_second=pace.rates(), reductions=reductions)


if __name__ == "__main__":
    main()
