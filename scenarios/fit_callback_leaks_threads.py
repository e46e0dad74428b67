"""``model.fit`` with a callback that starts an "uploader" thread now and then, which never
ends.

Every 100 ms of training (a steady rate by wall time, about 10 a second) the callback hands
the latest logs to a new background thread that uploads them and then waits on its queue for
more, forever: nothing ever puts more there, nothing joins it (tensorflow/tensorflow#37160,
threads piling up in a training process). The thread count climbs until the process cannot
start one ("can't start new thread": pids.max, RLIMIT_NPROC or threads-max). Fix: one
uploader thread, or one ``ThreadPoolExecutor``, created once (``healthy_fit_thread_pool_once``).

python scenarios/fit_callback_leaks_threads.py [--seconds 20]
"""

from __future__ import annotations

import json
import os
import queue
import threading
from typing import Any

import keras

from _common import Deadline, Steady, StopAt, dense_net, done, linear_problem, options

PERIOD = 0.1
"""Seconds of training between two uploader threads started."""


def upload_forever(pending: queue.Queue[dict[str, Any]], directory: str) -> None:
    """Uploads what comes on ``pending`` (here: appends it to a file), waiting for more."""
    while True:
        logs = pending.get()
        with open(os.path.join(directory, "uploaded.jsonl"), "a") as sink:
            sink.write(json.dumps(logs) + "\n")


class Uploads(keras.callbacks.Callback):  # type: ignore[misc]
    """The latest logs handed to a new uploader thread every ``PERIOD`` seconds."""

    def __init__(self, directory: str) -> None:
        super().__init__()
        self.directory = directory
        self.steady = Steady(PERIOD)
        self.started = 0

    def on_train_batch_end(self, batch: int, logs: dict[str, Any] | None = None) -> None:
        for _ in range(self.steady.due()):
            pending: queue.Queue[dict[str, Any]] = queue.Queue()
            uploader = threading.Thread(
                target=upload_forever, args=(pending, self.directory), daemon=True
            )
            uploader.start()
            pending.put({"batch": batch, **(logs or {})})
            self.started += 1


def main() -> None:
    args = options(__doc__)
    x, y = linear_problem()
    model = dense_net()
    model.compile(optimizer=keras.optimizers.Adam(1e-3), loss="mse")
    uploads = Uploads(args.logdir)
    deadline = Deadline(args.seconds)
    stop = StopAt(deadline)
    history = model.fit(x, y, batch_size=32, epochs=10_000, verbose=0, callbacks=[uploads, stop])
    done(
        epochs=len(history.history["loss"]),
        steps=len(stop.pace.ends),
        steps_per_second=stop.pace.rates(),
        uploaders=uploads.started,
        threads=threading.active_count(),
    )


if __name__ == "__main__":
    main()
