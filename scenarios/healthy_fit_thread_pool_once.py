"""Healthy: ``model.fit`` with a callback that hands uploads to one thread pool, created
once.

``fit_callback_leaks_threads`` fixed: every 100 ms of training the latest logs go to a
``ThreadPoolExecutor`` of 4 threads the callback created when training began (and shuts down
when it ends). The pool starts its threads as the first uploads come, then the thread count
stays where it is: a step, not a leak.

python scenarios/healthy_fit_thread_pool_once.py [--seconds 20]
"""

from __future__ import annotations

import json
import os
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import keras

from _common import Deadline, Steady, StopAt, dense_net, done, linear_problem, options

PERIOD = 0.1
"""Seconds of training between two uploads."""
THREADS = 4


def upload(logs: dict[str, Any], directory: str) -> None:
    """Uploads ``logs`` (here: appends them to a file)."""
    with open(os.path.join(directory, "uploaded.jsonl"), "a") as sink:
        sink.write(json.dumps(logs) + "\n")


class Uploads(keras.callbacks.Callback):  # type: ignore[misc]
    """The latest logs submitted to one pool every ``PERIOD`` seconds."""

    def __init__(self, directory: str) -> None:
        super().__init__()
        self.directory = directory
        self.steady = Steady(PERIOD)
        self.submitted = 0
        self.pool: ThreadPoolExecutor | None = None

    def on_train_begin(self, logs: dict[str, Any] | None = None) -> None:
        self.pool = ThreadPoolExecutor(THREADS, thread_name_prefix="uploader")

    def on_train_batch_end(self, batch: int, logs: dict[str, Any] | None = None) -> None:
        assert self.pool is not None
        for _ in range(self.steady.due()):
            self.pool.submit(upload, {"batch": batch, **(logs or {})}, self.directory)
            self.submitted += 1

    def on_train_end(self, logs: dict[str, Any] | None = None) -> None:
        assert self.pool is not None
        self.pool.shutdown()


def main() -> None:
    args = options(__doc__)
    x, y = linear_problem()
    model = dense_net()
    model.compile(optimizer=keras.optimizers.Adam(1e-3), loss="mse")
    uploads = Uploads(args.logdir)
    deadline = Deadline(args.seconds)
    stop = StopAt(deadline)
    threads = 0

    class Count(keras.callbacks.Callback):  # type: ignore[misc]
        def on_epoch_end(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
            nonlocal threads
            threads = max(threads, threading.active_count())

    history = model.fit(
        x, y, batch_size=32, epochs=10_000, verbose=0, callbacks=[uploads, stop, Count()]
    )
    done(
        epochs=len(history.history["loss"]),
        steps=len(stop.pace.ends),
        steps_per_second=stop.pace.rates(),
        uploads=uploads.submitted,
        most_threads=threads,
    )


if __name__ == "__main__":
    main()
