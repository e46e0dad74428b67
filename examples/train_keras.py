"""A small, healthy Keras training run that logs to TensorBoard; knows nothing of driftwatch.

python examples/train_keras.py --logdir /tmp/tb --epochs 50
"""

from __future__ import annotations

import argparse
import os

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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--logdir", required=True, help="TensorBoard log directory")
    parser.add_argument("--epochs", type=int, default=20)
    parser.add_argument("--samples", type=int, default=4096)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--log-every", type=int, default=10, help="log scalars every N batches")
    args = parser.parse_args()

    rng = np.random.default_rng(0)
    features = 16
    x = rng.normal(size=(args.samples, features)).astype("float32")
    y = (x @ rng.normal(size=(features, 1)) + 0.1 * rng.normal(size=(args.samples, 1))).astype(
        "float32"
    )
    model = build_model(features)
    model.fit(
        x,
        y,
        batch_size=args.batch_size,
        epochs=args.epochs,
        validation_split=0.1,
        verbose=0,
        callbacks=[keras.callbacks.TensorBoard(args.logdir, update_freq=args.log_every)],
    )


if __name__ == "__main__":
    main()
