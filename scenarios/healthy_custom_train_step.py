"""Healthy: a small convolutional classifier, a ``keras.Model`` subclass with its own
``train_step``, fed by a ``tf.data`` pipeline that augments images in TensorFlow ops.

The Keras pattern for custom training logic inside ``fit``: ``train_step`` overridden with a
``GradientTape``, metrics tracked in ``keras.metrics`` objects listed in ``metrics`` (so
``fit`` resets them each epoch), random flips and crops in ``map(num_parallel_calls)`` with
``prefetch``, ``ReduceLROnPlateau`` and ``EarlyStopping`` watching the loss. Nothing grows:
memory is flat after the first epoch, the step rate is steady. No TensorBoard.

python scenarios/healthy_custom_train_step.py [--seconds 20]
"""

from __future__ import annotations

from typing import Any

import keras
import numpy as np
import tensorflow as tf

from _common import Deadline, StopAt, done, options

SIDE = 16
CLASSES = 4
SAMPLES = 4096
BATCH = 32


class Classifier(keras.Model):  # type: ignore[misc]
    """A two-block CNN whose ``fit`` runs the hand-written ``train_step``."""

    def __init__(self) -> None:
        super().__init__()
        self.net = keras.Sequential(
            [
                keras.Input((SIDE, SIDE, 1)),
                keras.layers.Conv2D(16, 3, padding="same", activation="relu"),
                keras.layers.MaxPooling2D(),
                keras.layers.Conv2D(32, 3, padding="same", activation="relu"),
                keras.layers.GlobalAveragePooling2D(),
                keras.layers.Dense(CLASSES),
            ]
        )
        self.cross_entropy = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
        self.loss_tracker = keras.metrics.Mean(name="loss")
        self.accuracy = keras.metrics.SparseCategoricalAccuracy(name="accuracy")

    def call(self, images: Any, training: bool = False) -> Any:
        return self.net(images, training=training)

    @property
    def metrics(self) -> list[Any]:
        return [self.loss_tracker, self.accuracy]

    def train_step(self, data: Any) -> dict[str, Any]:
        images, labels = data
        with tf.GradientTape() as tape:
            logits = self(images, training=True)
            loss = self.cross_entropy(labels, logits)
        gradients = tape.gradient(loss, self.trainable_variables)
        self.optimizer.apply_gradients(zip(gradients, self.trainable_variables, strict=True))
        self.loss_tracker.update_state(loss)
        self.accuracy.update_state(labels, logits)
        return {metric.name: metric.result() for metric in self.metrics}


def images() -> tuple[np.ndarray, np.ndarray]:
    """Noisy images whose class is which quadrant holds a bright square."""
    rng = np.random.default_rng(0)
    labels = rng.integers(CLASSES, size=SAMPLES)
    pictures = 0.3 * rng.random((SAMPLES, SIDE, SIDE, 1)).astype("float32")
    half = SIDE // 2
    for index, label in enumerate(labels):
        row, column = divmod(int(label), 2)
        pictures[index, row * half + 2 : row * half + 6, column * half + 2 : column * half + 6] = 1
    return pictures, labels.astype("int32")


def augment(image: Any, label: Any) -> tuple[Any, Any]:
    padded = tf.image.pad_to_bounding_box(image, 1, 1, SIDE + 2, SIDE + 2)
    return tf.image.random_crop(padded, (SIDE, SIDE, 1)), label


def main() -> None:
    args = options(__doc__)
    pictures, labels = images()
    dataset = (
        tf.data.Dataset.from_tensor_slices((pictures, labels))
        .shuffle(SAMPLES)
        .repeat()
        .map(augment, num_parallel_calls=tf.data.AUTOTUNE)
        .batch(BATCH)
        .prefetch(tf.data.AUTOTUNE)
    )
    model = Classifier()
    model.compile(optimizer=keras.optimizers.Adam(3e-3))
    deadline = Deadline(args.seconds)
    stop = StopAt(deadline)
    callbacks = [
        keras.callbacks.ReduceLROnPlateau(monitor="loss", patience=3, factor=0.5),
        keras.callbacks.EarlyStopping(monitor="loss", patience=1000),
        stop,
    ]
    history = model.fit(dataset, steps_per_epoch=128, epochs=10_000, verbose=0, callbacks=callbacks)
    done(
        epochs=len(history.history["loss"]),
        steps=len(stop.pace.ends),
        steps_per_second=stop.pace.rates(),
        step_ms=stop.pace.step_ms(),
        last_loss=f"{history.history['loss'][-1]:.4f}",
        last_accuracy=f"{history.history['accuracy'][-1]:.3f}",
    )


if __name__ == "__main__":
    main()
