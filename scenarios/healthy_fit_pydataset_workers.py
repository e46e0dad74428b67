"""Healthy: ``model.fit`` on a ``keras.utils.PyDataset`` read by 4 worker processes that keep
nothing.

Batches of 64 KiB made from a bank held in memory by 4 worker processes (``workers=4,
use_multiprocessing=True``), handed over and forgotten, none cached, to a model whose step
(about 40 ms: a 1024-wide network) is longer than a batch's hand-over, so the workers keep
its queue full and it never waits long for a batch. The workers start once, hold their share
of the queue and stay flat: a level, not a leak.

python scenarios/healthy_fit_pydataset_workers.py [--seconds 20]
"""

from __future__ import annotations

import keras
import numpy as np

from _common import Deadline, StopAt, dense_net, done, options

BATCH = 64
FEATURES = 256
"""A batch is BATCH x FEATURES float32: 64 KiB."""
WIDTH = 1024
"""Width of the model's two hidden layers."""
WORKERS = 4
BANK = np.random.default_rng(0).normal(size=(16, BATCH, FEATURES)).astype("float32")
"""The examples: 16 distinct batches, read in turn."""
TARGETS = BANK @ np.random.default_rng(1).normal(size=(FEATURES, 1)).astype("float32")


class Batches(keras.utils.PyDataset):  # type: ignore[misc]
    """Batches made by worker processes, handed over and forgotten."""

    def __init__(self) -> None:
        super().__init__(workers=WORKERS, use_multiprocessing=True, max_queue_size=10)

    def __len__(self) -> int:
        return 1_000_000

    def __getitem__(self, index: int) -> tuple[np.ndarray, np.ndarray]:
        return BANK[index % len(BANK)].copy(), TARGETS[index % len(BANK)].copy()


def main() -> None:
    args = options(__doc__)
    model = dense_net(width=WIDTH, inputs=FEATURES)
    model.compile(optimizer=keras.optimizers.Adam(1e-3), loss="mse")
    deadline = Deadline(args.seconds)
    stop = StopAt(deadline)
    model.fit(Batches(), epochs=1, verbose=0, callbacks=[stop])
    done(
        steps=len(stop.pace.ends),
        steps_per_second=stop.pace.rates(),
        step_ms=stop.pace.step_ms(),
        workers=WORKERS,
    )


if __name__ == "__main__":
    main()
