"""``model.fit`` on a tf.data pipeline that calls ``.repeat()`` before ``.cache()``.

The pipeline is meant to decode once and cache, but ``cache()`` sits after ``repeat()``:
the stream it caches never ends, so the cache never completes and keeps every element it
has ever seen, epoch after epoch. Host memory grows for the whole run (TensorFlow only warns
about a partially cached dataset when the iterator is destroyed). No TensorBoard. Fix:
``.cache()`` before ``.shuffle()`` and ``.repeat()``.

python scenarios/fit_repeat_before_cache.py [--seconds 20]
"""

from __future__ import annotations

import keras
import tensorflow as tf

from _common import Deadline, StopAt, byte_examples, decode, dense_net, done, options

SAMPLES = 4096
FEATURES = 1024
"""Each decoded example is FEATURES float32: 4 KiB."""
BATCH = 64


def main() -> None:
    args = options(__doc__)
    raw = byte_examples(SAMPLES, FEATURES)
    dataset = (
        tf.data.Dataset.from_tensor_slices(raw)
        .map(decode)
        .shuffle(SAMPLES)
        .repeat()
        .cache()  # after repeat(): caches an endless stream
        .batch(BATCH)
    )
    model = dense_net(inputs=FEATURES)
    model.compile(optimizer=keras.optimizers.Adam(1e-3), loss="mse")
    deadline = Deadline(args.seconds)
    stop = StopAt(deadline)
    history = model.fit(
        dataset, steps_per_epoch=SAMPLES // BATCH, epochs=10_000, verbose=0, callbacks=[stop]
    )
    steps = len(stop.pace.ends)
    done(
        steps=steps, cached_mb=steps * BATCH * FEATURES * 4 >> 20, loss=history.history["loss"][-1]
    )


if __name__ == "__main__":
    main()
