"""Image summaries written every step into one event file.

A callback logs a few reconstructed images at the end of every batch; each is a PNG of
tens of kilobytes, and TensorBoard never rotates event files: the single file grows by
gigabytes per hour, as does every upload of it. driftwatch reports ``event_file_unrotated``
(and ``event_file_growth``). Fix: log images every N steps
(``tf.summary.record_if(step % N == 0)``), fewer and smaller, or in their own directory.

python driftwatch/examples/image_summaries.py [--seconds 40]
"""

from __future__ import annotations

from typing import Any

import keras
import numpy as np
import tensorflow as tf
from common import TimeBudget, arguments, logdir

SIDE = 32


class LogReconstructions(keras.callbacks.Callback):  # type: ignore[misc]
    """Writes the model's reconstructions of ``images`` as image summaries every batch."""

    def __init__(self, directory: str, images: np.ndarray) -> None:
        super().__init__()
        self.writer = tf.summary.create_file_writer(directory)
        self.images = images
        self.step = 0

    def on_train_batch_end(self, batch: int, logs: dict[str, Any] | None = None) -> None:
        self.step += 1
        reconstructed = self.model(self.images, training=False)
        with self.writer.as_default(step=self.step):
            tf.summary.image("reconstructions", reconstructed, max_outputs=len(self.images))

    def on_train_end(self, logs: dict[str, Any] | None = None) -> None:
        self.writer.close()


def autoencoder() -> Any:
    """A small convolutional autoencoder for SIDE x SIDE colour images."""
    return keras.Sequential(
        [
            keras.Input((SIDE, SIDE, 3)),
            keras.layers.Conv2D(16, 3, strides=2, padding="same", activation="relu"),
            keras.layers.Conv2DTranspose(3, 3, strides=2, padding="same", activation="sigmoid"),
        ]
    )


def main() -> None:
    args = arguments(__doc__).parse_args()
    images = np.random.default_rng(0).random((2048, SIDE, SIDE, 3), dtype="float32")
    model = autoencoder()
    model.compile(optimizer="adam", loss="mse")
    model.fit(
        images,
        images,
        batch_size=32,
        epochs=1000,
        verbose=0,
        callbacks=[LogReconstructions(logdir(args), images[:8]), TimeBudget(args.seconds)],
    )


if __name__ == "__main__":
    main()
