"""Custom loop that writes image summaries every step into its one event file.

To watch reconstructions, an autoencoder's loop logs a grid of input and output images with
``tf.summary.image`` at every step instead of every few hundred. PNG-encoded noise barely
compresses, so the single event file grows by megabytes a second with no rotation in sight
(and TensorBoard slows to a crawl loading it). Fix: log images every N steps, fewer of
them, smaller.

python scenarios/loop_image_summaries.py [--seconds 20]
"""

from __future__ import annotations

from typing import Any

import keras
import numpy as np
import tensorflow as tf

from _common import Deadline, done, options

BATCH = 16
SIDE = 64
IMAGES = 8
"""Images logged per step (inputs and their reconstructions), SIDE x SIDE RGB."""


def main() -> None:
    args = options(__doc__)
    rng = np.random.default_rng(0)
    images = rng.uniform(size=(1024, SIDE, SIDE, 3)).astype("float32")
    autoencoder = keras.Sequential(
        [
            keras.Input((SIDE, SIDE, 3)),
            keras.layers.Conv2D(8, 3, strides=2, padding="same", activation="relu"),
            keras.layers.Conv2DTranspose(3, 3, strides=2, padding="same", activation="sigmoid"),
        ]
    )
    optimizer = keras.optimizers.Adam(1e-3)
    writer = tf.summary.create_file_writer(args.logdir)

    @tf.function  # type: ignore[untyped-decorator]
    def train_step(xb: Any) -> tuple[Any, Any]:
        with tf.GradientTape() as tape:
            reconstruction = autoencoder(xb, training=True)
            loss = tf.reduce_mean(tf.square(reconstruction - xb))
        variables = autoencoder.trainable_variables
        optimizer.apply_gradients(zip(tape.gradient(loss, variables), variables, strict=True))
        return loss, reconstruction

    dataset = tf.data.Dataset.from_tensor_slices(images).shuffle(1024).batch(BATCH).repeat()
    steps = 0
    deadline = Deadline(args.seconds)
    for xb in dataset:
        loss, reconstruction = train_step(xb)
        steps += 1
        with writer.as_default(step=steps):
            tf.summary.scalar("loss", loss)
            tf.summary.image("inputs", xb, max_outputs=IMAGES)
            tf.summary.image("reconstructions", reconstruction, max_outputs=IMAGES)
        if deadline.passed():
            break
    writer.close()
    done(steps=steps, loss=float(loss))


if __name__ == "__main__":
    main()
