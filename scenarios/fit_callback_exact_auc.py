"""``model.fit`` with a callback that recomputes an exact AUC over every prediction so far.

To follow ranking quality live, a callback scores a held-out batch after every training
batch, appends the scores to everything it scored before, and recomputes the exact ROC AUC
(a full sort) over all of them: the callback's cost grows with the step count until it is
most of each step. Logs to TensorBoard through the Keras callback. Fix: evaluate a fixed
set every N steps, or use ``keras.metrics.AUC`` (bucketed, constant cost).

python scenarios/fit_callback_exact_auc.py [--seconds 20]
"""

from __future__ import annotations

from typing import Any

import keras
import numpy as np

from _common import Deadline, StopAt, dense_net, done, linear_problem, options

BATCH = 64
HELD_OUT = 256
"""Held-out examples scored after each batch."""


def roc_auc(labels: np.ndarray, scores: np.ndarray) -> float:
    """The exact area under the ROC curve (Mann-Whitney U over the ranks)."""
    ranks = np.empty(len(scores))
    ranks[np.argsort(scores, kind="stable")] = np.arange(1, len(scores) + 1)
    positives = int(labels.sum())
    negatives = len(labels) - positives
    return float((ranks[labels].sum() - positives * (positives + 1) / 2) / (positives * negatives))


class LiveAUC(keras.callbacks.Callback):  # type: ignore[misc]
    """Scores ``x`` after each batch and logs the AUC of everything scored so far."""

    def __init__(self, x: np.ndarray, labels: np.ndarray) -> None:
        super().__init__()
        self.x, self.labels = x, labels
        self.scores: list[np.ndarray] = []
        self.auc = float("nan")

    def on_train_batch_end(self, batch: int, logs: dict[str, Any] | None = None) -> None:
        self.scores.append(np.asarray(self.model(self.x, training=False)).ravel())
        labels = np.tile(self.labels, len(self.scores))
        self.auc = roc_auc(labels, np.concatenate(self.scores))


def main() -> None:
    args = options(__doc__)
    x, y = linear_problem()
    labels = (y > 0).astype("float32")
    model = dense_net(outputs=1)
    model.compile(
        optimizer=keras.optimizers.Adam(1e-3),
        loss=keras.losses.BinaryCrossentropy(from_logits=True),
    )
    live = LiveAUC(x[:HELD_OUT], labels[:HELD_OUT].ravel() > 0)
    deadline = Deadline(args.seconds)
    stop = StopAt(deadline)
    model.fit(
        x[HELD_OUT:],
        labels[HELD_OUT:],
        batch_size=BATCH,
        epochs=10_000,
        verbose=0,
        callbacks=[keras.callbacks.TensorBoard(args.logdir, update_freq=50), live, stop],
    )
    done(steps=len(live.scores), steps_per_second=stop.pace.rates(), auc=round(live.auc, 3))


if __name__ == "__main__":
    main()
