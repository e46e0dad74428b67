"""Healthy: a plain custom training loop, ``tf.function`` + ``GradientTape``, no TensorBoard.

Nothing is kept between steps but the model and the optimizer; the loss is printed every
1000 steps. Host memory rises once (imports, the first trace) and then stays flat.

python scenarios/healthy_loop.py [--seconds 20]
"""

from __future__ import annotations

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

BATCH = 64


def main() -> None:
    args = options(__doc__)
    x, y = linear_problem()
    model = dense_net()
    optimizer = keras.optimizers.Adam(1e-3)
    train_step = regression_step(model, optimizer)

    dataset = shuffled_batches(x, y, BATCH)
    pace = Pace()
    deadline = Deadline(args.seconds)
    for xb, yb in dataset:
        loss = train_step(xb, yb)
        pace.tick()
        if len(pace.ends) % 1000 == 0:
            print(f"step {len(pace.ends)}: loss {float(loss):.4f}", flush=True)
        if deadline.passed():
            break
    done(
        steps=len(pace.ends),
        steps_per_second=pace.rates(),
        step_ms=pace.step_ms(),
        traces=train_step.experimental_get_tracing_count(),
    )


if __name__ == "__main__":
    main()
