"""``model.fit`` on a ``keras.utils.PyDataset`` read by 2 worker processes, each keeping
every batch it makes in a module-level dict.

The dataset reads its batches (1 MiB each) from slow storage (160 ms a batch, a steady pace
by wall time: about 6 batches a second a worker) in 2 worker processes (``workers=2,
use_multiprocessing=True``), and caches each batch it made in a module-level dict "for the
next epoch". Each worker process has its own copy of that dict, which the training process
never sees and which nothing frees (keras-team/keras#8946): the workers' memory climbs by
about 13 MB a second between them while the training process stays flat, until the machine
or the container runs out of memory. Fix: no cache in the workers (or a bounded one), or
shorter-lived workers (a new epoch starts new ones).

python scenarios/fit_workers_keep_batches.py [--seconds 20]
"""

from __future__ import annotations

import time
from typing import Any

import keras
import numpy as np

from _common import Deadline, StopAt, done, options

BATCH = 128
FEATURES = 2048
"""A batch is BATCH x FEATURES float32: 1 MiB."""
READ_SECONDS = 0.16
"""Seconds a worker takes to read one batch (its storage's latency)."""
WORKERS = 2
SHARDS = np.random.default_rng(0).normal(size=(16, BATCH, FEATURES)).astype("float32")
"""What storage holds: 16 distinct batches, read in turn."""
TARGETS = SHARDS @ np.random.default_rng(1).normal(size=(FEATURES, 1)).astype("float32")
CACHE: dict[int, tuple[np.ndarray, np.ndarray]] = {}
"""The cache: module-level, so each worker process fills its own."""


class ShardBatches(keras.utils.PyDataset):  # type: ignore[misc]
    """Batches "read from storage" by worker processes, each cached where it was made."""

    def __init__(self) -> None:
        super().__init__(workers=WORKERS, use_multiprocessing=True, max_queue_size=10)
        self.next_read = 0.0  # per process: when this worker's storage answers next

    def __len__(self) -> int:
        return 1_000_000

    def __getitem__(self, index: int) -> tuple[np.ndarray, np.ndarray]:
        now = time.monotonic()
        self.next_read = max(self.next_read, now) + READ_SECONDS
        time.sleep(self.next_read - now)
        if index in CACHE:
            return CACHE[index]
        x, y = SHARDS[index % len(SHARDS)].copy(), TARGETS[index % len(SHARDS)].copy()
        CACHE[index] = (x, y)  # the bug: kept in the worker, never read back, never freed
        return x, y


def model() -> Any:
    net = keras.Sequential(
        [keras.Input((FEATURES,)), keras.layers.Dense(16, activation="relu"), keras.layers.Dense(1)]
    )
    net.compile(optimizer=keras.optimizers.Adam(1e-3), loss="mse")
    return net


def main() -> None:
    args = options(__doc__)
    net = model()
    deadline = Deadline(args.seconds)
    stop = StopAt(deadline)
    net.fit(ShardBatches(), epochs=1, verbose=0, callbacks=[stop])
    done(
        steps=len(stop.pace.ends),
        steps_per_second=stop.pace.rates(),
        workers=WORKERS,
        kept_mb_at_least=round(len(stop.pace.ends) * BATCH * FEATURES * 4 / 2**20),
    )


if __name__ == "__main__":
    main()
