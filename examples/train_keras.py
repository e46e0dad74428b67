"""A small, healthy Keras training run that logs to TensorBoard; knows nothing of driftwatch.

python examples/train_keras.py --logdir /tmp/tb --epochs 50
"""

from __future__ import annotations

import argparse
import os
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras
import numpy as np


def build_model(features: int) -> keras.Model:
    model = keras.Sequential(
        [
            keras.Input((features,)),
            keras.layers.Dense(64, activation="relu"),
            keras.layers.Dense(64, activation="relu"),
            keras.layers.Dense(1),
        ]
    )
    model.compile(optimizer="adam", loss="mse")
    return model


class SlowFrom(keras.callbacks.Callback):  # type: ignore[misc]
    """Adds ``seconds`` of host work to every step from ``step`` on."""

    def __init__(self, step: int, seconds: float) -> None:
        super().__init__()
        self.step = step
        self.seconds = seconds
        self.steps_done = 0

    def on_train_batch_end(self, batch: int, logs: dict[str, float] | None = None) -> None:
        self.steps_done += 1
        if self.steps_done >= self.step:
            time.sleep(self.seconds)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--logdir", required=True, help="TensorBoard log directory")
    parser.add_argument("--epochs", type=int, default=20)
    parser.add_argument("--samples", type=int, default=4096)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--log-every", type=int, default=10, help="log scalars every N batches")
    parser.add_argument("--slow-from-step", type=int, default=0, help="0: never slow down")
    parser.add_argument("--slow-seconds", type=float, default=0.002)
    args = parser.parse_args()

    rng = np.random.default_rng(0)
    features = 16
    x = rng.normal(size=(args.samples, features)).astype("float32")
    y = (x @ rng.normal(size=(features, 1)) + 0.1 * rng.normal(size=(args.samples, 1))).astype(
        "float32"
    )
    model = build_model(features)
    callbacks: list[keras.callbacks.Callback] = [
        keras.callbacks.TensorBoard(args.logdir, update_freq=args.log_every)
    ]
    if args.slow_from_step:
        callbacks.append(SlowFrom(args.slow_from_step, args.slow_seconds))
    model.fit(
        x,
        y,
        batch_size=args.batch_size,
        epochs=args.epochs,
        validation_split=0.1,
        verbose=0,
        callbacks=callbacks,
    )


if __name__ == "__main__":
    main()
