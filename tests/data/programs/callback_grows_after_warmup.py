"""A Keras fit whose callback's per-batch cost grows with the steps, after a warm-up.

The callback reads every batch's logs (batch, time, loss, metric), as a status page
showing the latest would, and from the end of the warm-up on keeps them all and rebuilds
the whole history, with a moving average of the loss, as one JSON document after each
batch, for that page to serve: as driftwatch/examples/growing_callback.py does with the
loss from its first batch, its cost grows by a microsecond or two a batch for each batch
kept. It reads the logs from the first batch so that the growing work is the only change
(reading the loss waits for each step's result). The document stays in memory (saved once,
at the end, in ``--logdir``): rewritten to a file after each batch, as the example does,
the job also waits on the disk and its CPU time falls, which on a busy node reads as
contention (docs/slowdowns.md, "Known misses").

The example's growth is fastest at its start (1.7 ms a step after 1 s, 5.5 ms
after 15 s, 9.3 ms after 42 s): most of it lands in a live detector's warm-up and baseline,
taken from the start. Here the steps keep their speed for ``--warmup`` seconds (the
baseline), then the callback's cost grows from nothing for ``--seconds`` more, as in a
long job whose baseline came before its history grew.

Knows nothing of driftwatch.

python tests/data/programs/callback_grows_after_warmup.py --logdir DIR [--warmup 20]
    [--seconds 10]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras
import numpy as np


class LogHistory(keras.callbacks.Callback):  # type: ignore[misc]
    """From ``warmup`` seconds after the fit starts, keeps every batch's logs and rebuilds
    the whole history's JSON document after each batch; stops the fit ``seconds`` after
    that."""

    def __init__(self, warmup: float, seconds: float) -> None:
        super().__init__()
        self.warmup = warmup
        self.seconds = seconds
        self.started = time.monotonic()
        self.batches: list[dict[str, float]] = []
        self.latest: dict[str, float] = {}  # the newest batch's logs, from the first batch
        self.document = "{}"  # what the status page serves

    def on_train_begin(self, logs: dict[str, Any] | None = None) -> None:
        self.started = time.monotonic()

    def on_train_batch_end(self, batch: int, logs: dict[str, Any] | None = None) -> None:
        elapsed = time.monotonic() - self.started
        if elapsed >= self.warmup + self.seconds:
            self.model.stop_training = True
        logged = {name: float(value) for name, value in (logs or {}).items()}
        self.latest = {"batch": batch, "time": time.time(), **logged}
        if elapsed < self.warmup:
            return
        self.batches.append(self.latest)
        losses = [b.get("loss", math.nan) for b in self.batches]
        self.document = json.dumps({"batches": self.batches, "smoothed": smooth(losses)})


def smooth(values: list[float], weight: float = 0.9) -> list[float]:
    """Exponential moving average of the whole series (recomputed from the start)."""
    smoothed: list[float] = []
    for value in values:
        smoothed.append(value if not smoothed else weight * smoothed[-1] + (1 - weight) * value)
    return smoothed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--logdir", required=True, help="where the history is saved")
    parser.add_argument("--warmup", type=float, default=20.0, help="seconds at full speed")
    parser.add_argument("--seconds", type=float, default=10.0, help="seconds after the warm-up")
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    x = rng.normal(size=(4096, 32)).astype("float32")
    y = (x @ rng.normal(size=(32, 1)) + 0.1 * rng.normal(size=(4096, 1))).astype("float32")
    model = keras.Sequential(
        [
            keras.Input((32,)),
            keras.layers.Dense(64, activation="relu"),
            keras.layers.Dense(64, activation="relu"),
            keras.layers.Dense(1),
        ]
    )
    model.compile(optimizer="adam", loss="mse", metrics=["mae"])
    history = LogHistory(args.warmup, args.seconds)
    model.fit(x, y, batch_size=32, epochs=100_000, verbose=0, callbacks=[history])
    Path(args.logdir).mkdir(parents=True, exist_ok=True)
    (Path(args.logdir) / "history.json").write_text(history.document)
    print(f"{len(history.batches)} batches kept, a document of {len(history.document)} bytes")


if __name__ == "__main__":
    main()
