"""``model.fit`` on a record reader whose last shard lacks labels: NaN in the last second.

A ``keras.utils.PyDataset`` reads records shard after shard; in the shard it reaches in the
run's last second some labels are missing, stored as NaN. That batch's loss is NaN, the
update turns every weight NaN, and the job ends a second later. Fit with no TensorBoard:
only values seen inside the process tell. Fix: validate inputs
(``tf.debugging.check_numerics``, ``keras.callbacks.TerminateOnNaN``), impute missing values.

python scenarios/fit_nan_last_second.py [--seconds 20]
"""

from __future__ import annotations

from typing import Any

import keras
import numpy as np

from _common import Deadline, StopAt, dense_net, done, linear_problem, options

BATCH = 64
LAST_SHARD = 1.0
"""Seconds before the end of the run when the reader reaches the shard without labels."""


class Records(keras.utils.PyDataset):  # type: ignore[misc]
    """Batches of clean records until LAST_SHARD seconds are left, then the last shard's."""

    def __init__(self, deadline: Deadline) -> None:
        super().__init__()
        self.deadline = deadline
        self.x, self.y = linear_problem()
        self.unlabelled = self.y.copy()
        self.unlabelled[::50] = np.nan  # every 50th record of the last shard lacks its label

    def __len__(self) -> int:
        return 1_000_000  # one long epoch: the run ends on time, not on data

    def __getitem__(self, index: int) -> tuple[np.ndarray, np.ndarray]:
        start = (index * BATCH) % (len(self.x) - BATCH)
        y = self.unlabelled if self.deadline.left() < LAST_SHARD else self.y
        return self.x[start : start + BATCH], y[start : start + BATCH]


class LossLog(keras.callbacks.Callback):  # type: ignore[misc]
    """Remembers when the loss was first not finite, in seconds since the start."""

    def __init__(self, deadline: Deadline) -> None:
        super().__init__()
        self.deadline = deadline
        self.first_nan: float | None = None

    def on_train_batch_end(self, batch: int, logs: dict[str, Any] | None = None) -> None:
        if self.first_nan is None and not np.isfinite((logs or {}).get("loss", 0.0)):
            self.first_nan = self.deadline.elapsed()


def main() -> None:
    args = options(__doc__)
    model = dense_net()
    model.compile(optimizer=keras.optimizers.Adam(1e-3), loss="mse")
    deadline = Deadline(args.seconds)
    log = LossLog(deadline)
    history = model.fit(
        Records(deadline), epochs=1, verbose=0, callbacks=[log, StopAt(deadline)], shuffle=False
    )
    nan_at = "never" if log.first_nan is None else f"{log.first_nan:.1f}s"
    done(loss=history.history["loss"][-1], first_nan_at=nan_at, ran=f"{deadline.elapsed():.1f}s")


if __name__ == "__main__":
    main()
