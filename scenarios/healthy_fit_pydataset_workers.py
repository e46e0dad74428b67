"""Healthy: ``model.fit`` on a ``keras.utils.PyDataset`` read by 4 worker processes that keep
nothing.

The same batches as ``fit_workers_keep_batches`` (512 KiB each), read without delay by 4
worker processes (``workers=4, use_multiprocessing=True``) and handed over, none cached: the
workers start once, hold their share of the queue, and stay flat (a level, not a leak).

python scenarios/healthy_fit_pydataset_workers.py [--seconds 20]
"""

from __future__ import annotations

import keras
import numpy as np

from _common import Deadline, StopAt, done, options
from fit_workers_keep_batches import SHARDS, TARGETS, model

WORKERS = 4


class Batches(keras.utils.PyDataset):  # type: ignore[misc]
    """Batches made by worker processes, handed over and forgotten."""

    def __init__(self) -> None:
        super().__init__(workers=WORKERS, use_multiprocessing=True, max_queue_size=10)

    def __len__(self) -> int:
        return 1_000_000

    def __getitem__(self, index: int) -> tuple[np.ndarray, np.ndarray]:
        return SHARDS[index % len(SHARDS)].copy(), TARGETS[index % len(SHARDS)].copy()


def main() -> None:
    args = options(__doc__)
    net = model()
    deadline = Deadline(args.seconds)
    stop = StopAt(deadline)
    net.fit(Batches(), epochs=1, verbose=0, callbacks=[stop])
    done(steps=len(stop.pace.ends), steps_per_second=stop.pace.rates(), workers=WORKERS)


if __name__ == "__main__":
    main()
