"""``model.fit`` on a Python generator that gets slower the longer it runs: it de-duplicates
each example against a list of every example it has kept.

A ``tf.data.Dataset.from_generator`` input reads records from a source that repeats some
(re-crawled pages, overlapping shards) and skips the repeats: it keeps the hash of every
record it yielded in a Python *list*, and ``key in seen`` scans that whole list for every
record. The scan grows with every example, so each batch takes longer to produce than the
last and the steps slow down steadily, all of it in the generator ("training gets slower
and slower, the GPU is idle"). No TensorBoard. Fix: a ``set`` (constant time a lookup), or
de-duplicate the data once, offline.

python scenarios/fit_generator_slows.py [--seconds 60]
"""

from __future__ import annotations

import gc
import hashlib
import time
from collections.abc import Iterator

import keras
import numpy as np
import tensorflow as tf

from _common import FEATURES, Deadline, StopAt, dense_net, done, options

SECONDS = 60.0
"""How long it trains by default: the scan's cost grows with the examples kept."""
BATCH = 32
REPEATS = 0.1
"""Share of the records that repeat one read shortly before."""


class Deduplicated:
    """Records from a source that repeats some, each repeat skipped: the hashes of the
    records yielded are kept in a list and every new record is looked up in it."""

    def __init__(self) -> None:
        self.rng = np.random.default_rng(0)
        self.weights = self.rng.normal(size=(FEATURES, 1)).astype("float32")
        self.seen: list[str] = []
        self.repeats = 0
        self.costs: list[tuple[float, float]] = []  # (when, seconds) each yielded record took

    def record(self, recent: list[np.ndarray]) -> np.ndarray:
        """The source's next record: now and then one it gave shortly before."""
        if recent and self.rng.random() < REPEATS:
            return recent[self.rng.integers(len(recent))]
        x = self.rng.normal(size=FEATURES).astype("float32")
        recent.append(x)
        del recent[:-1000]
        return x

    def __call__(self) -> Iterator[tuple[np.ndarray, np.ndarray]]:
        recent: list[np.ndarray] = []
        began = time.monotonic()  # the time spent waiting at ``yield`` is not counted
        while True:
            x = self.record(recent)
            key = hashlib.sha1(x.tobytes()).hexdigest()
            if key in self.seen:  # a list: every lookup compares with every kept hash
                self.repeats += 1
                continue
            self.seen.append(key)
            now = time.monotonic()
            self.costs.append((now, now - began))
            yield x, x @ self.weights
            began = time.monotonic()

    def batch_ms(self, start: float, end: float) -> str:
        """The generator's own time per batch in the first and the last 5 s of
        ``start``-``end``, in milliseconds."""
        first = [cost for when, cost in self.costs if start <= when <= start + 5.0]
        last = [cost for when, cost in self.costs if end - 5.0 <= when <= end]
        if not first or not last:
            return "n/a"
        return f"{BATCH * 1e3 * np.mean(first):.1f}->{BATCH * 1e3 * np.mean(last):.1f}ms"


def main() -> None:
    args = options(__doc__, SECONDS)
    records = Deduplicated()
    signature = (
        tf.TensorSpec((FEATURES,), tf.float32),
        tf.TensorSpec((1,), tf.float32),
    )
    dataset = tf.data.Dataset.from_generator(records, output_signature=signature).batch(BATCH)
    model = dense_net()
    model.compile(optimizer=keras.optimizers.Adam(1e-3), loss="mse")
    deadline = Deadline(args.seconds)
    stop = StopAt(deadline)
    history = model.fit(dataset, steps_per_epoch=200, epochs=10_000, verbose=0, callbacks=[stop])
    ends = stop.pace.ends
    done(
        epochs=len(history.history["loss"]),
        steps=len(stop.pace.ends),
        steps_per_second=stop.pace.rates(),
        step_ms=stop.pace.step_ms(),
        examples_kept=len(records.seen),
        repeats_skipped=records.repeats,
        generator_ms_per_batch=records.batch_ms(ends[0], ends[-1]),
    )


if __name__ == "__main__":
    main()
    # The iterator fit left in a reference cycle is freed here, while the interpreter is
    # whole: freed at interpreter shutdown instead, a from_generator iterator can deadlock
    # the exit (tensorflow/tensorflow#21277, #22632; see fit_generator_replay_buffer.py).
    gc.collect()
