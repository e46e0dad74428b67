"""Hyper-parameter search that builds and fits a new Keras model per trial, never clearing.

Each trial builds a fresh model with ``keras.Sequential`` and fits it for two short epochs,
without ``keras.backend.clear_session()`` between trials: Keras' global state (layer name
counters, the graph-building scope) and each model's traced train function stay referenced,
so host memory grows trial after trial. Fit with no TensorBoard. Fix: call
``keras.backend.clear_session()`` (and ``gc.collect()``) before building each model.

python scenarios/fit_models_in_loop.py [--seconds 20]
"""

from __future__ import annotations

import keras

from _common import Deadline, dense_net, done, linear_problem, options

WIDTHS = (32, 64, 128, 256)
"""Layer widths the search cycles through."""


def main() -> None:
    args = options(__doc__)
    x, y = linear_problem(samples=2048)
    trials = 0
    best = float("inf")
    deadline = Deadline(args.seconds)
    while not deadline.passed():
        model = dense_net(width=WIDTHS[trials % len(WIDTHS)])
        model.compile(optimizer=keras.optimizers.Adam(1e-3), loss="mse")
        history = model.fit(x, y, batch_size=128, epochs=2, verbose=0)
        best = min(best, history.history["loss"][-1])
        trials += 1
    done(trials=trials, best_loss=best)


if __name__ == "__main__":
    main()
