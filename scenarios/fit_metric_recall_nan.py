"""``model.fit`` with a hand-written recall metric that divides by the batch's positives.

``recall = sum(y * predicted) / sum(y)`` is fine while every batch holds positive labels.
Halfway through, the input reaches the newer shards, where the event being predicted has
become rare (0.5 % instead of 30 %): most batches of 64 hold no positive at all, the metric
is ``0 / 0 = NaN`` there, and Keras's running mean of it is NaN for the rest of each epoch.
The loss stays finite: only the metric (what ``EarlyStopping`` or ``ModelCheckpoint`` might
monitor) goes bad. No TensorBoard. Fix: ``keras.metrics.Recall`` (it accumulates counts over
the epoch), or divide by ``maximum(sum(y), 1)``.

python scenarios/fit_metric_recall_nan.py [--seconds 20]
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import Any

import keras
import numpy as np
import tensorflow as tf

from _common import FEATURES, Deadline, StopAt, dense_net, done, options

BATCH = 64
EARLY_RATE = 0.30
LATE_RATE = 0.005
"""Share of positive labels in the older and in the newer shards."""
LATE_FROM = 0.5
"""Share of the run after which the input reads the newer shards."""


def recall(y_true: Any, logits: Any) -> Any:
    """Share of this batch's positives predicted positive: NaN when it has none."""
    predicted = keras.ops.cast(logits > 0.0, "float32")
    return keras.ops.sum(y_true * predicted) / keras.ops.sum(y_true)


def shards(deadline: Deadline, seconds: float) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """Labelled batches: from the older shards, then, past LATE_FROM of the run, the newer."""
    rng = np.random.default_rng(0)
    direction = rng.normal(size=FEATURES).astype("float32")
    while True:
        rate = EARLY_RATE if deadline.elapsed() < LATE_FROM * seconds else LATE_RATE
        y = (rng.random((BATCH, 1)) < rate).astype("float32")
        x = rng.normal(size=(BATCH, FEATURES)).astype("float32") + y * direction
        yield x, y


class FirstNaN(keras.callbacks.Callback):  # type: ignore[misc]
    """When the logged recall was first NaN, in seconds of training."""

    def __init__(self, deadline: Deadline) -> None:
        super().__init__()
        self.deadline = deadline
        self.at: float | None = None
        self.nan_batches = 0

    def on_train_batch_end(self, batch: int, logs: dict[str, Any] | None = None) -> None:
        value = float((logs or {}).get("recall", 0.0))
        if not math.isfinite(value):
            self.nan_batches += 1
            if self.at is None:
                self.at = self.deadline.elapsed()


def main() -> None:
    args = options(__doc__)
    deadline = Deadline(args.seconds)
    signature = (
        tf.TensorSpec((BATCH, FEATURES), tf.float32),
        tf.TensorSpec((BATCH, 1), tf.float32),
    )
    dataset = tf.data.Dataset.from_generator(
        lambda: shards(deadline, args.seconds), output_signature=signature
    )
    model = dense_net()
    model.compile(
        optimizer=keras.optimizers.Adam(1e-3),
        loss=keras.losses.BinaryCrossentropy(from_logits=True),
        metrics=[recall],
    )
    stop = StopAt(deadline)
    first_nan = FirstNaN(deadline)
    history = model.fit(
        dataset, steps_per_epoch=256, epochs=10_000, verbose=0, callbacks=[stop, first_nan]
    )
    done(
        epochs=len(history.history["loss"]),
        steps=len(stop.pace.ends),
        steps_per_second=stop.pace.rates(),
        first_nan_s=f"{first_nan.at:.1f}" if first_nan.at is not None else "none",
        nan_batches=first_nan.nan_batches,
        last_loss=f"{history.history['loss'][-1]:.4f}",
        last_recall=history.history["recall"][-1],
    )


if __name__ == "__main__":
    main()
