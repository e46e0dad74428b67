"""What the scenarios share: their two options, synthetic data, a small model, a deadline.

The scenarios are plain TensorFlow/Keras programs that know nothing of driftwatch; each runs
on its own with ``python scenarios/NAME.py`` (Python puts this directory on the path).
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import tempfile
import time
from typing import Any

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras
import numpy as np
import tensorflow as tf

SECONDS = 20.0
"""How long a scenario trains unless told otherwise, in seconds."""
FEATURES = 32
"""Input features of the synthetic problems."""


def options(doc: str | None, seconds: float = SECONDS) -> argparse.Namespace:
    """The parsed command line: ``--logdir`` and ``--seconds`` (``seconds`` unless given)."""
    parser = argparse.ArgumentParser(description=doc)
    parser.add_argument(
        "--logdir", help="TensorBoard log directory (default: a new temporary directory)"
    )
    parser.add_argument(
        "--seconds", type=float, default=seconds, help="how long to train, in seconds"
    )
    args = parser.parse_args()
    if not args.logdir:
        args.logdir = tempfile.mkdtemp(prefix="scenario-")
    os.makedirs(args.logdir, exist_ok=True)
    return args


def linear_problem(samples: int = 8192, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Inputs and noisy targets of a linear regression, float32."""
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(samples, FEATURES)).astype("float32")
    y = x @ rng.normal(size=(FEATURES, 1)) + 0.1 * rng.normal(size=(samples, 1))
    return x, y.astype("float32")


def dense_net(width: int = 64, outputs: int = 1, inputs: int = FEATURES) -> Any:
    """Two ReLU layers and a linear head (not compiled)."""
    return keras.Sequential(
        [
            keras.Input((inputs,)),
            keras.layers.Dense(width, activation="relu"),
            keras.layers.Dense(width, activation="relu"),
            keras.layers.Dense(outputs),
        ]
    )


def shuffled_batches(x: np.ndarray, y: np.ndarray, batch: int) -> Any:
    """An endless ``tf.data`` stream of shuffled ``(x, y)`` batches."""
    return tf.data.Dataset.from_tensor_slices((x, y)).shuffle(len(x)).batch(batch).repeat()


def regression_step(model: Any, optimizer: Any) -> Any:
    """A ``tf.function`` that takes one optimizer step on the mean squared error; returns
    the loss."""

    @tf.function  # type: ignore[untyped-decorator]
    def train_step(x: Any, y: Any) -> Any:
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(tf.square(model(x, training=True) - y))
        gradients = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(gradients, model.trainable_variables, strict=True))
        return loss

    return train_step


def byte_examples(samples: int, features: int) -> np.ndarray:
    """Raw examples as stored on disk: ``samples`` rows of ``features`` random bytes."""
    return np.random.default_rng(0).integers(0, 256, size=(samples, features), dtype=np.uint8)


def predictive_coded_images(samples: int, side: int) -> tuple[np.ndarray, np.ndarray]:
    """Noisy grayscale images whose class (0-3) is the quadrant holding a bright square, stored
    the way lossless image formats store them (PNG's filters): each pixel as its difference
    from the prediction left + up - upper-left, modulo 256. The coded images (uint8,
    ``samples`` x ``side`` x ``side``) and their labels (int32)."""
    rng = np.random.default_rng(0)
    labels = rng.integers(4, size=samples)
    pixels = rng.integers(0, 80, size=(samples, side, side)).astype(np.int32)
    half, square = side // 2, side // 4
    for index, label in enumerate(labels):
        row, column = divmod(int(label), 2)
        top, left = row * half + square // 2, column * half + square // 2
        pixels[index, top : top + square, left : left + square] += 160
    padded = np.pad(pixels, ((0, 0), (1, 0), (1, 0)))  # zeros above and left of the image
    residual = padded[:, 1:, 1:] - padded[:, 1:, :-1] - padded[:, :-1, 1:] + padded[:, :-1, :-1]
    return (residual & 0xFF).astype(np.uint8), labels.astype(np.int32)


def image_classifier(side: int, classes: int = 4) -> Any:
    """A small classifier of ``side`` x ``side`` grayscale images: two dense layers (not
    compiled)."""
    return keras.Sequential(
        [
            keras.Input((side, side, 1)),
            keras.layers.Flatten(),
            keras.layers.Dense(32, activation="relu"),
            keras.layers.Dense(classes),
        ]
    )


def decode(raw: Any) -> tuple[Any, Any]:
    """One example's bytes as [0, 1] features and a target (a few FFTs stand in for the
    work of real decoding)."""
    features = tf.cast(raw, tf.float32) / 255.0
    spectrum = tf.abs(tf.signal.rfft(features))
    return features, tf.reduce_mean(spectrum[:8], keepdims=True)


class Deadline:
    """Wall-clock budget of a training run, started when made."""

    def __init__(self, seconds: float) -> None:
        self.start = time.monotonic()
        self.end = self.start + seconds
        print(f"training for {seconds:g} s", flush=True)

    def passed(self) -> bool:
        return time.monotonic() >= self.end

    def elapsed(self) -> float:
        return time.monotonic() - self.start

    def left(self) -> float:
        return self.end - time.monotonic()


class Pace:
    """When each step ended, to tell the step rate at the start from the one at the end."""

    def __init__(self) -> None:
        self.ends: list[float] = []

    def tick(self) -> None:
        self.ends.append(time.monotonic())

    def rates(self, span: float = 2.0) -> str:
        """Steps per second over the first and the last ``span`` seconds."""
        if len(self.ends) < 2:
            return "n/a"
        first = sum(1 for end in self.ends if end - self.ends[0] <= span)
        last = sum(1 for end in self.ends if self.ends[-1] - end <= span)
        return f"{first / span:.0f}->{last / span:.0f}/s"

    def step_ms(self, span: float = 5.0) -> str:
        """Mean step time over the first and the last ``span`` seconds, in milliseconds."""
        first = [end for end in self.ends if end - self.ends[0] <= span]
        last = [end for end in self.ends if self.ends[-1] - end <= span]
        if len(first) < 2 or len(last) < 2:
            return "n/a"
        early = (first[-1] - first[0]) / (len(first) - 1)
        late = (last[-1] - last[0]) / (len(last) - 1)
        return f"{early * 1e3:.1f}->{late * 1e3:.1f}ms"


class Steady:
    """A steady rate by wall time: one event every ``period`` seconds from the first call of
    ``due``, however fast or slow the steps that call it go (a busy host slows them)."""

    def __init__(self, period: float) -> None:
        self.period = period
        self.start = math.nan
        self.count = 0

    def due(self) -> int:
        """How many events are due now that have not been counted yet (they are now)."""
        now = time.monotonic()
        if math.isnan(self.start):
            self.start = now
        owed = int((now - self.start) / self.period) + 1 - self.count
        self.count += owed
        return owed


class StopAt(keras.callbacks.Callback):  # type: ignore[misc]
    """Stops ``fit`` at the first batch end past ``deadline``; keeps the steps' ``pace``."""

    def __init__(self, deadline: Deadline) -> None:
        super().__init__()
        self.deadline = deadline
        self.pace = Pace()

    def on_train_batch_end(self, batch: int, logs: dict[str, Any] | None = None) -> None:
        self.pace.tick()
        if self.deadline.passed():
            self.model.stop_training = True


def done(**numbers: object) -> None:
    """Prints what the run did, one ``name=value`` line."""
    print("done " + " ".join(f"{name}={value}" for name, value in numbers.items()), flush=True)
    sys.stdout.flush()


def fit_with_validation(args: argparse.Namespace, logger: Any) -> None:
    """Fits a small regression model in epochs of 512 batches, validating after each, with
    the ``logger`` callback, until ``args.seconds`` have passed; prints what it did."""
    train = 16384
    x, y = linear_problem(samples=train + 4096)
    model = dense_net()
    model.compile(optimizer=keras.optimizers.Adam(1e-3), loss="mse", metrics=["mae"])
    deadline = Deadline(args.seconds)
    stop = StopAt(deadline)
    history = model.fit(
        x[:train],
        y[:train],
        validation_data=(x[train:], y[train:]),
        batch_size=32,
        epochs=10_000,
        verbose=0,
        callbacks=[logger, stop],
    )
    done(
        epochs=len(history.history["val_loss"]),
        steps=len(stop.pace.ends),
        steps_per_second=stop.pace.rates(),
        step_ms=stop.pace.step_ms(),
    )
