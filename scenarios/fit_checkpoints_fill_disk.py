"""``model.fit`` writing a checkpoint every "epoch" into its logdir and keeping all of them.

A callback saves the model and its optimizer (``tf.train.CheckpointManager`` with
``max_to_keep=None``: keep them all; about 1.4 MB each, a 113k-parameter network and Adam's
two slots) every 0.25 s of training (a steady rate by wall time, standing in for the
checkpoint per epoch of a long run) into the logdir, and never removes one
(keras-team/keras-tuner#401, a search's checkpoints filling the disk): the logdir's
filesystem fills at about 5 MB a second until a save fails with ENOSPC, taking the job down.
The e2e tests give the logdir a filesystem of its own, a 512-MiB tmpfs, and run the program
from it. Fix: keep the newest few (``healthy_fit_checkpoints_keep_three``:
``max_to_keep=3``; ``ModelCheckpoint(save_best_only=True)``).

Not ``model.save_weights`` nor ``model.save``: in Keras 3.15 each call keeps about 72 KB of
host memory (600 saves in a loop: +40 MB; ``tf.train.Checkpoint``: flat), a slow leak of its
own that driftwatch rightly states at the end of a 45-s run (scenarios/README.md).

python scenarios/fit_checkpoints_fill_disk.py [--seconds 20]
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import keras
import tensorflow as tf

from _common import Deadline, Steady, StopAt, dense_net, done, linear_problem, options

PERIOD = 0.25
"""Seconds of training between two checkpoints."""
WIDTH = 320
"""Width of the network's two hidden layers: 113k parameters, and a checkpoint of 1.4 MB
(with Adam's two slots)."""


class Checkpoints(keras.callbacks.Callback):  # type: ignore[misc]
    """The model and its optimizer saved every ``PERIOD`` seconds by a
    ``tf.train.CheckpointManager`` keeping the newest ``keep`` (``None``: all)."""

    def __init__(self, directory: str, keep: int | None = None) -> None:
        super().__init__()
        self.directory = directory
        self.keep = keep
        self.steady = Steady(PERIOD)
        self.saved = 0
        self.manager: Any = None

    def on_train_batch_end(self, batch: int, logs: dict[str, Any] | None = None) -> None:
        if self.steady.due():  # one save, however many periods a slow step spanned
            if self.manager is None:  # once the optimizer has its slots
                checkpoint = tf.train.Checkpoint(model=self.model, optimizer=self.model.optimizer)
                self.manager = tf.train.CheckpointManager(
                    checkpoint, self.directory, max_to_keep=self.keep
                )
            self.manager.save()
            self.saved += 1


def train(keep: int | None) -> None:
    """Fits with ``Checkpoints(keep=keep)`` for ``--seconds``; prints what it did."""
    args = options(__doc__)
    x, y = linear_problem()
    model = dense_net(width=WIDTH)
    model.compile(optimizer=keras.optimizers.Adam(1e-3), loss="mse")
    checkpoints = Checkpoints(args.logdir, keep)
    deadline = Deadline(args.seconds)
    stop = StopAt(deadline)
    history = model.fit(
        x, y, batch_size=32, epochs=10_000, verbose=0, callbacks=[checkpoints, stop]
    )
    stats = os.statvfs(args.logdir)
    on_disk = sum(path.stat().st_size for path in Path(args.logdir).glob("ckpt-*"))
    done(
        epochs=len(history.history["loss"]),
        steps=len(stop.pace.ends),
        steps_per_second=stop.pace.rates(),
        checkpoints=checkpoints.saved,
        checkpoints_mb=round(on_disk / 1e6, 1),
        filesystem_used_mb=round((stats.f_blocks - stats.f_bavail) * stats.f_frsize / 1e6, 1),
        filesystem_mb=round(stats.f_blocks * stats.f_frsize / 1e6, 1),
    )


if __name__ == "__main__":
    train(keep=None)
