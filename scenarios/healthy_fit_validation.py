"""Healthy: ``model.fit`` with validation after every epoch and the TensorBoard callback.

Epochs of about 2 s, each followed by a short validation pass (a regular pause, not a
problem); the TensorBoard callback logs every 20 batches and at each epoch's end.

python scenarios/healthy_fit_validation.py [--seconds 20]
"""

from __future__ import annotations

import keras

from _common import Deadline, StopAt, dense_net, done, linear_problem, options

BATCH = 32
TRAIN = 16384
"""Training examples: an epoch of 512 batches."""


def main() -> None:
    args = options(__doc__)
    x, y = linear_problem(samples=TRAIN + 4096)
    model = dense_net()
    model.compile(optimizer=keras.optimizers.Adam(1e-3), loss="mse", metrics=["mae"])
    deadline = Deadline(args.seconds)
    stop = StopAt(deadline)
    history = model.fit(
        x[:TRAIN],
        y[:TRAIN],
        validation_data=(x[TRAIN:], y[TRAIN:]),
        batch_size=BATCH,
        epochs=10_000,
        verbose=0,
        callbacks=[keras.callbacks.TensorBoard(args.logdir, update_freq=20), stop],
    )
    done(
        epochs=len(history.history["val_loss"]),
        steps=len(stop.pace.ends),
        steps_per_second=stop.pace.rates(),
        val_loss=round(history.history["val_loss"][-1], 4),
    )


if __name__ == "__main__":
    main()
