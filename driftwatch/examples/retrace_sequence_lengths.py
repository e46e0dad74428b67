"""tf.function retracing from variable sequence lengths: one trace per new batch shape.

Batches of token sequences padded only to their own longest sequence have a new shape
almost every step; a ``tf.function`` without an ``input_signature`` traces the step again
for each shape and keeps every trace. Steps are slow and host memory grows. TensorFlow
warns ("triggered tf.function retracing"); driftwatch reports ``host_memory_drift`` (leak
class ``retracing``). Fix: ``input_signature=[tf.TensorSpec([None, None], tf.int32), ...]``,
``reduce_retracing=True``, or pad to a few bucket lengths.

python driftwatch/examples/retrace_sequence_lengths.py [--seconds 40]
"""

from __future__ import annotations

from typing import Any

import keras
import numpy as np
import tensorflow as tf
from common import arguments, logdir, train_loop

VOCABULARY = 1000


def sequence_model() -> Any:
    """A small text classifier: embeddings, a convolution, pooling."""
    return keras.Sequential(
        [
            keras.Input((None,), dtype="int32"),
            keras.layers.Embedding(VOCABULARY, 32),
            keras.layers.Conv1D(64, 5, padding="same", activation="relu"),
            keras.layers.Conv1D(64, 5, padding="same", activation="relu"),
            keras.layers.GlobalAveragePooling1D(),
            keras.layers.Dense(1),
        ]
    )


def main() -> None:
    args = arguments(__doc__).parse_args()
    rng = np.random.default_rng(0)
    model = sequence_model()
    optimizer = keras.optimizers.Adam()

    @tf.function  # type: ignore[untyped-decorator]
    def train_step(tokens: Any, labels: Any) -> Any:
        with tf.GradientTape() as tape:
            logits = model(tokens, training=True)
            loss = keras.ops.mean(
                keras.losses.binary_crossentropy(labels, logits, from_logits=True)
            )
        grads = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(grads, model.trainable_variables, strict=True))
        return loss

    def step(i: int) -> Any:
        length = int(rng.integers(8, 2048))  # the batch's longest sequence
        tokens = rng.integers(0, VOCABULARY, size=(16, length), dtype="int32")
        labels = (tokens.mean(axis=1, keepdims=True) > VOCABULARY / 2).astype("float32")
        return train_step(tokens, labels)

    steps = train_loop(step, logdir(args), args.seconds)
    print(f"{steps} steps, {train_step.experimental_get_tracing_count()} traces")


if __name__ == "__main__":
    main()
