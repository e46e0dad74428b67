"""``model.fit`` with a callback that runs a short command now and then and never waits
for it.

Every 100 ms of training (a steady rate by wall time, about 10 a second) the callback starts
a sync command (here ``true``) with ``subprocess.Popen`` and keeps the ``Popen`` in a
module-level list of syncs "to check later", which nothing does: each child exits at once and
stays a zombie, holding its PID, until the training process exits. Enough of them and the
job cannot start a thread or a process. (A ``Popen`` that is dropped is reaped by its
``__del__``: the list is what keeps these.) Fix: ``subprocess.run``, ``Popen.wait()``, or
``poll()`` the kept ones.

python scenarios/fit_callback_leaves_zombies.py [--seconds 20]
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path
from typing import Any

import keras

from _common import Deadline, Steady, StopAt, dense_net, done, linear_problem, options

PERIOD = 0.1
"""Seconds of training between two commands started."""
COMMAND = ["true"]
"""The command run: a sync to remote storage would do the same once it ended."""
PENDING: list[subprocess.Popen[bytes]] = []
"""The syncs started, kept to be checked on later (never)."""


class Syncs(keras.callbacks.Callback):  # type: ignore[misc]
    """``COMMAND`` started every ``PERIOD`` seconds, its ``Popen`` kept in ``PENDING``, never
    waited for."""

    def __init__(self) -> None:
        super().__init__()
        self.steady = Steady(PERIOD)

    def on_train_batch_end(self, batch: int, logs: dict[str, Any] | None = None) -> None:
        for _ in range(self.steady.due()):
            PENDING.append(subprocess.Popen(COMMAND))


def zombies() -> int:
    """Children of this process that exited and were not reaped."""
    count = 0
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            state, parent = stat.read_text().rpartition(")")[2].split()[:2]
        except OSError:
            continue
        count += state == "Z" and int(parent) == os.getpid()
    return count


def main() -> None:
    args = options(__doc__)
    x, y = linear_problem()
    model = dense_net()
    model.compile(optimizer=keras.optimizers.Adam(1e-3), loss="mse")
    syncs = Syncs()
    deadline = Deadline(args.seconds)
    stop = StopAt(deadline)
    history = model.fit(x, y, batch_size=32, epochs=10_000, verbose=0, callbacks=[syncs, stop])
    done(
        epochs=len(history.history["loss"]),
        steps=len(stop.pace.ends),
        steps_per_second=stop.pace.rates(),
        started=len(PENDING),
        zombies=zombies(),
    )


if __name__ == "__main__":
    main()
