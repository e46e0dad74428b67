"""``model.fit`` on a Python generator that keeps every batch it has yielded for "replay".

A ``tf.data.Dataset.from_generator`` input whose generator remembers each batch (NumPy
arrays) in a list, meaning to mix old batches back in later ("experience replay", "hard
example mining"), and never trims it. Every step adds a batch to the Python heap and host
memory climbs for as long as the run lasts; TensorFlow's allocator is not involved. No
TensorBoard. Fix: a bounded ``collections.deque(maxlen=N)``, or keep indices, not arrays.

python scenarios/fit_generator_replay_buffer.py [--seconds 20]
"""

from __future__ import annotations

import gc
from collections.abc import Iterator

import keras
import numpy as np
import tensorflow as tf

from _common import Deadline, StopAt, dense_net, done, options

BATCH = 128
FEATURES = 256
"""Each kept batch is BATCH x FEATURES float32 inputs and BATCH targets: about 128 KiB."""
REPLAY_EVERY = 4
"""One batch in REPLAY_EVERY is drawn from the replay list instead of fresh data."""


class ReplayStream:
    """Fresh synthetic batches, and now and then an old one drawn from everything seen."""

    def __init__(self) -> None:
        self.rng = np.random.default_rng(0)
        self.weights = self.rng.normal(size=(FEATURES, 1)).astype("float32")
        self.seen: list[tuple[np.ndarray, np.ndarray]] = []

    def __call__(self) -> Iterator[tuple[np.ndarray, np.ndarray]]:
        while True:
            if self.seen and self.rng.integers(REPLAY_EVERY) == 0:
                yield self.seen[self.rng.integers(len(self.seen))]
                continue
            x = self.rng.normal(size=(BATCH, FEATURES)).astype("float32")
            y = x @ self.weights
            self.seen.append((x, y))  # kept "for replay", never dropped
            yield x, y


def main() -> None:
    args = options(__doc__)
    stream = ReplayStream()
    signature = (
        tf.TensorSpec((BATCH, FEATURES), tf.float32),
        tf.TensorSpec((BATCH, 1), tf.float32),
    )
    dataset = tf.data.Dataset.from_generator(stream, output_signature=signature)
    model = dense_net(inputs=FEATURES)
    model.compile(optimizer=keras.optimizers.Adam(1e-3), loss="mse")
    deadline = Deadline(args.seconds)
    stop = StopAt(deadline)
    history = model.fit(dataset, steps_per_epoch=200, epochs=10_000, verbose=0, callbacks=[stop])
    kept = sum(x.nbytes + y.nbytes for x, y in stream.seen)
    done(
        epochs=len(history.history["loss"]),
        steps=len(stop.pace.ends),
        steps_per_second=stop.pace.rates(),
        kept_batches=len(stream.seen),
        kept_mb=kept >> 20,
    )


if __name__ == "__main__":
    main()
    # The iterator fit left in a reference cycle is freed here, while the interpreter is
    # whole: freed by the collection at interpreter shutdown instead, a from_generator
    # iterator can deadlock the exit (tensorflow/tensorflow#21277, #22632): rarely (not in 8
    # trials with and without driftwatch, yet in full test runs, this program's and another
    # from_generator program's), the main thread waits in the iterator's destructor for its
    # prefetch thread, with no Python frame left.
    gc.collect()
