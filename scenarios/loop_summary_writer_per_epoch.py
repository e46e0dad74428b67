"""A custom loop that creates a new ``tf.summary`` file writer every epoch and never closes
it.

Each epoch (here 100 ms of training, a steady rate by wall time: about 10 epochs a second,
short stand-ins for a long run's epochs) calls ``tf.summary.create_file_writer`` again and
keeps the writer in a dict by epoch (meant to show each epoch as a run in TensorBoard). A
TensorFlow 2 writer is closed when its last reference goes; these are all kept, so every one
holds its event file open: one more descriptor and one more event file each epoch
(keras-team/keras#6774, tensorflow/tensorflow#20606), until the process reaches its
RLIMIT_NOFILE. Fix: one writer created before the loop (``healthy_loop_scalars``), or
``writer.close()``.

python scenarios/loop_summary_writer_per_epoch.py [--seconds 20]
"""

from __future__ import annotations

import os
import time
from typing import Any

import keras
import tensorflow as tf

from _common import (
    Deadline,
    Pace,
    dense_net,
    done,
    linear_problem,
    options,
    regression_step,
    shuffled_batches,
)

BATCH = 64
EPOCH_SECONDS = 0.1
"""Seconds of training in one epoch."""


def main() -> None:
    args = options(__doc__)
    x, y = linear_problem()
    model = dense_net()
    optimizer = keras.optimizers.Adam(1e-3)
    train_step = regression_step(model, optimizer)
    batches = iter(shuffled_batches(x, y, BATCH))
    writers: dict[int, Any] = {}
    pace = Pace()
    deadline = Deadline(args.seconds)
    epoch = 0
    while not deadline.passed():
        epoch += 1
        # Epoch e ends EPOCH_SECONDS * e after the start, whatever the steps' pace.
        epoch_end = deadline.start + EPOCH_SECONDS * epoch
        loss = None
        while loss is None or time.monotonic() < epoch_end:
            loss = train_step(*next(batches))
            pace.tick()
        writers[epoch] = tf.summary.create_file_writer(os.path.join(args.logdir, "train"))
        with writers[epoch].as_default(step=epoch):
            tf.summary.scalar("loss", loss)
        writers[epoch].flush()
    done(
        epochs=epoch,
        steps=len(pace.ends),
        steps_per_second=pace.rates(),
        writers=len(writers),
        event_files=len(os.listdir(os.path.join(args.logdir, "train"))),
        descriptors=len(os.listdir("/proc/self/fd")),
    )


if __name__ == "__main__":
    main()
