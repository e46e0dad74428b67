"""``model.fit`` with a callback that opens a log file per batch and never closes it.

A debugging callback writes each batch's logs to a file of its own in the logdir and keeps
the file object ("to flush at the end"), so nothing ever closes it: one more open descriptor
every 50 ms of training (a steady rate by wall time, about 20 a second), until the process
reaches its RLIMIT_NOFILE (``ulimit -n``) and every ``open``, socket and ``tf.io`` call fails
with EMFILE ("Too many open files"). Fix: ``with open(...) as f:``, or one file opened once.

python scenarios/fit_callback_leaks_log_files.py [--seconds 20]
"""

from __future__ import annotations

import json
import os
from typing import IO, Any

import keras

from _common import Deadline, Steady, StopAt, dense_net, done, linear_problem, options

PERIOD = 0.05
"""Seconds of training between two log files opened."""


class BatchFiles(keras.callbacks.Callback):  # type: ignore[misc]
    """Each batch's logs in a file of its own, kept open."""

    def __init__(self, directory: str) -> None:
        super().__init__()
        self.directory = directory
        self.steady = Steady(PERIOD)
        self.files: list[IO[str]] = []

    def on_train_batch_end(self, batch: int, logs: dict[str, Any] | None = None) -> None:
        for _ in range(self.steady.due()):
            path = os.path.join(self.directory, f"batch-{len(self.files):06d}.log")
            log = open(path, "w")  # noqa: SIM115 - the bug: never closed
            log.write(json.dumps({"batch": batch, **(logs or {})}) + "\n")
            log.flush()
            self.files.append(log)


def main() -> None:
    args = options(__doc__)
    x, y = linear_problem()
    model = dense_net()
    model.compile(optimizer=keras.optimizers.Adam(1e-3), loss="mse")
    files = BatchFiles(args.logdir)
    deadline = Deadline(args.seconds)
    stop = StopAt(deadline)
    history = model.fit(x, y, batch_size=32, epochs=10_000, verbose=0, callbacks=[files, stop])
    done(
        epochs=len(history.history["loss"]),
        steps=len(stop.pace.ends),
        steps_per_second=stop.pace.rates(),
        files_open=len(files.files),
        descriptors=len(os.listdir("/proc/self/fd")),
    )


if __name__ == "__main__":
    main()
