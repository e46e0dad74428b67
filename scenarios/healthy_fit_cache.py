"""Healthy: ``model.fit`` on a tf.data pipeline cached in memory after an expensive decode.

``map(decode).cache().shuffle().repeat()``: the first pass decodes every example and fills
the cache (host memory rises by about 100 MB in the first 5 seconds), every later epoch reads
from it and memory stays flat: a one-off level rise, not a leak. No TensorBoard.

python scenarios/healthy_fit_cache.py [--seconds 20]
"""

from __future__ import annotations

import keras
import tensorflow as tf

from _common import Deadline, StopAt, byte_examples, decode, dense_net, done, options

SAMPLES = 16384
FEATURES = 1024
"""Each decoded example is FEATURES float32 (4 KiB): a cache of 64 MiB."""
BATCH = 64


def main() -> None:
    args = options(__doc__)
    raw = byte_examples(SAMPLES, FEATURES)
    dataset = (
        tf.data.Dataset.from_tensor_slices(raw)
        .map(decode)
        .cache()
        .shuffle(4096)
        .repeat()
        .batch(BATCH)
    )
    model = dense_net(inputs=FEATURES)
    model.compile(optimizer=keras.optimizers.Adam(1e-3), loss="mse")
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
        cache_mb=SAMPLES * FEATURES * 4 >> 20,
    )


if __name__ == "__main__":
    main()
