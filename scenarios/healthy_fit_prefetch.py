"""Healthy: ``fit_slow_decoder`` fixed: the same images decoded with TensorFlow ops in a
parallel ``map``, cached once decoded, with ``prefetch``.

The images are stored predictively coded (each pixel as its difference from left + up -
upper-left, modulo 256); their decoding is the prediction's inverse, two cumulative sums
modulo 256, here in TensorFlow ops in ``map(num_parallel_calls=tf.data.AUTOTUNE)`` followed by
the resize to the model's input. The decoded images are cached (they are the same every
epoch: the first epoch decodes all 1024 in about half a second) and
``prefetch(tf.data.AUTOTUNE)`` keeps batches ready while the model trains: the step does not
wait for its input. The model and the batches are ``fit_slow_decoder``'s. No TensorBoard.

python scenarios/healthy_fit_prefetch.py [--seconds 40]
"""

from __future__ import annotations

from typing import Any

import keras
import tensorflow as tf

from _common import (
    Deadline,
    StopAt,
    done,
    image_classifier,
    options,
    predictive_coded_images,
)

SECONDS = 40.0
"""How long it trains by default, as its broken twin."""
SIDE = 128
"""Side of the stored images, in pixels."""
INPUT = 32
"""Side of the model's input: each decoded image is resized to it."""
SAMPLES = 1024
BATCH = 32


def decode(coded: Any, label: Any) -> tuple[Any, Any]:
    """One predictively coded image as [0, 1] pixels (the sums of its residuals over rows
    and columns, modulo 256), resized to the model's input."""
    sums = tf.cumsum(tf.cumsum(tf.cast(coded, tf.int32), axis=0), axis=1)
    pixels = tf.cast(tf.math.floormod(sums, 256), tf.float32) / 255.0
    return tf.image.resize(pixels[..., tf.newaxis], (INPUT, INPUT), method="area"), label


def main() -> None:
    args = options(__doc__, SECONDS)
    coded, labels = predictive_coded_images(SAMPLES, SIDE)
    dataset = (
        tf.data.Dataset.from_tensor_slices((coded, labels))
        .map(decode, num_parallel_calls=tf.data.AUTOTUNE)
        .cache()
        .shuffle(SAMPLES)
        .repeat()
        .batch(BATCH)
        .prefetch(tf.data.AUTOTUNE)
    )
    model = image_classifier(INPUT)
    model.compile(
        optimizer=keras.optimizers.Adam(1e-3),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        metrics=["accuracy"],
    )
    deadline = Deadline(args.seconds)
    stop = StopAt(deadline)
    history = model.fit(
        dataset, steps_per_epoch=SAMPLES // BATCH, epochs=10_000, verbose=0, callbacks=[stop]
    )
    done(
        epochs=len(history.history["loss"]),
        steps=len(stop.pace.ends),
        steps_per_second=stop.pace.rates(),
        step_ms=stop.pace.step_ms(),
        last_accuracy=f"{history.history['accuracy'][-1]:.3f}",
    )


if __name__ == "__main__":
    main()
