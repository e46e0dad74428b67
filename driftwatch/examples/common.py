"""What the examples share: arguments, data, a small model, a time budget.

The examples are ordinary TensorFlow/Keras programs that know nothing of driftwatch; each
runs on its own with ``python driftwatch/examples/NAME.py`` (Python puts this directory on
the path). They ship in the package as data for ``driftwatch demo``: driftwatch never imports
them.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from collections.abc import Callable, Sequence
from typing import Any

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras
import numpy as np
import tensorflow as tf

FEATURES = 32


def arguments(doc: str | None, seconds: float = 40.0) -> argparse.ArgumentParser:
    """A parser with the options every example has: where to log and for how long."""
    parser = argparse.ArgumentParser(description=doc)
    parser.add_argument(
        "--logdir", help="TensorBoard log directory (default: a new temporary directory)"
    )
    parser.add_argument(
        "--seconds", type=float, default=seconds, help="stop training after this long"
    )
    return parser


def logdir(args: argparse.Namespace) -> str:
    """The ``--logdir`` given, else a new temporary directory."""
    return str(args.logdir) if args.logdir else tempfile.mkdtemp(prefix="driftwatch-example-")


def regression_data(
    samples: int = 4096, features: int = FEATURES, seed: int = 0
) -> tuple[np.ndarray, np.ndarray]:
    """A noisy linear regression problem: inputs and targets, float32."""
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(samples, features)).astype("float32")
    weights = rng.normal(size=(features, 1))
    y = (x @ weights + 0.1 * rng.normal(size=(samples, 1))).astype("float32")
    return x, y


def mlp(features: int = FEATURES, width: int = 64, depth: int = 2, outputs: int = 1) -> Any:
    """A plain multi-layer perceptron (not compiled)."""
    layers: list[Any] = [keras.Input((features,))]
    layers += [keras.layers.Dense(width, activation="relu") for _ in range(depth)]
    layers.append(keras.layers.Dense(outputs))
    return keras.Sequential(layers)


class TimeBudget(keras.callbacks.Callback):  # type: ignore[misc]
    """Stops ``fit`` once ``seconds`` have passed since the callback was made."""

    def __init__(self, seconds: float) -> None:
        super().__init__()
        self.deadline = time.monotonic() + seconds

    def on_train_batch_end(self, batch: int, logs: dict[str, Any] | None = None) -> None:
        if time.monotonic() >= self.deadline:
            self.model.stop_training = True


def fit(
    model: Any,
    x: np.ndarray,
    y: np.ndarray,
    directory: str,
    seconds: float,
    callbacks: Sequence[Any] = (),
    epochs: int = 1000,
    tensorboard: bool = True,
) -> Any:
    """``model.fit`` in batches of 32 for at most ``seconds``, logging to TensorBoard in
    ``directory`` unless ``tensorboard`` is false."""
    logging = [keras.callbacks.TensorBoard(directory, update_freq=10)] if tensorboard else []
    return model.fit(
        x,
        y,
        batch_size=32,
        epochs=epochs,
        verbose=0,
        callbacks=[*logging, *callbacks, TimeBudget(seconds)],
    )


def train_loop(step: Callable[[int], Any], directory: str, seconds: float) -> int:
    """Calls ``step(i)`` (it returns the loss) for ``seconds``, logging the loss every 10
    steps as a TensorBoard scalar; returns the number of steps."""
    writer = tf.summary.create_file_writer(directory)
    steps = 0
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        loss = step(steps)
        steps += 1
        if steps % 10 == 0:
            with writer.as_default(step=steps):
                tf.summary.scalar("loss", loss)
    writer.close()
    return steps
