"""``model.fit`` that spends nearly every step waiting for its input: a hand-written Python
image decoder inside ``tf.data``'s ``map``, with no prefetch.

The images are stored predictively coded, as lossless formats store them (each pixel as its
difference from left + up - upper-left, modulo 256). The pipeline decodes them one example at
a time with a pure-Python loop over the pixels, wrapped in ``tf.numpy_function`` (about 4 ms
an image of 128 x 128 on an idle core), in a sequential ``map`` with no ``prefetch``: a batch
of 32 takes about 130 ms to decode, the model's own step (on images resized to 32 x 32) a
millisecond or two, and the step waits for the rest ("GPU utilization is low", "training is
slow whatever the model"). No TensorBoard. Fix: decode with TensorFlow ops (the prediction's
inverse is two cumulative sums) in ``map(num_parallel_calls=tf.data.AUTOTUNE)``, decode once
and cache, and ``prefetch`` (``healthy_fit_prefetch`` is this program so fixed).

python scenarios/fit_slow_decoder.py [--seconds 40]
"""

from __future__ import annotations

import gc
import time
from typing import Any

import keras
import numpy as np
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
"""How long it trains by default: about 300 steps of ~130 ms."""
SIDE = 128
"""Side of the stored images, in pixels."""
INPUT = 32
"""Side of the model's input: each decoded image is resized to it."""
SAMPLES = 1024
BATCH = 32


class Decoder:
    """The Python decoder of one predictively coded image; keeps the time spent in it."""

    def __init__(self) -> None:
        self.seconds = 0.0
        self.images = 0

    def __call__(self, coded: np.ndarray) -> np.ndarray:
        began = time.perf_counter()
        side = coded.shape[0]
        residuals = coded.tobytes()
        pixels = bytearray(side * side)
        for row in range(side):
            base = row * side
            left = upper_left = 0
            for column in range(side):
                up = pixels[base - side + column] if row else 0
                value = (residuals[base + column] + left + up - upper_left) & 0xFF
                pixels[base + column] = value
                left, upper_left = value, up
        image = np.frombuffer(bytes(pixels), np.uint8).reshape(side, side, 1)
        self.seconds += time.perf_counter() - began
        self.images += 1
        return image.astype(np.float32) / 255.0


def main() -> None:
    args = options(__doc__, SECONDS)
    coded, labels = predictive_coded_images(SAMPLES, SIDE)
    decoder = Decoder()

    def decode(image: Any, label: Any) -> tuple[Any, Any]:
        pixels = tf.numpy_function(decoder, [image], tf.float32)
        pixels.set_shape((SIDE, SIDE, 1))
        return tf.image.resize(pixels, (INPUT, INPUT), method="area"), label

    dataset = (
        tf.data.Dataset.from_tensor_slices((coded, labels))
        .shuffle(SAMPLES)
        .repeat()
        .map(decode)
        .batch(BATCH)
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
    trained = deadline.elapsed()
    per_image = decoder.seconds / max(decoder.images, 1)
    done(
        epochs=len(history.history["loss"]),
        steps=len(stop.pace.ends),
        step_ms=stop.pace.step_ms(),
        decode_ms_per_image=f"{1e3 * per_image:.2f}",
        decode_ms_per_batch=f"{1e3 * per_image * BATCH:.0f}",
        decoding_share_of_training=f"{decoder.seconds / trained:.0%}",
        last_accuracy=f"{history.history['accuracy'][-1]:.3f}",
    )
    # The pipeline's iterator, blocked in tf.numpy_function, is freed here while the
    # interpreter is whole, not at its shutdown (where such iterators can hang the exit).
    del dataset
    gc.collect()


if __name__ == "__main__":
    main()
