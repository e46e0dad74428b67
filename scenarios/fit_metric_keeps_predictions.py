"""``model.fit`` with a hand-written exact metric that keeps every prediction of the epoch.

To report an exact median absolute error, a custom ``keras.metrics.Metric`` concatenates
each batch's errors onto a variable and takes the median of all of them. Its state is only
reset when an epoch starts, and the epoch here is the whole run (a large dataset): the
variable grows by a batch every step, host memory with it, and every step's median costs
more than the last. Logs to TensorBoard through the Keras callback. Fix: a streaming
estimate (a histogram), or compute exact values in evaluation only.

python scenarios/fit_metric_keeps_predictions.py [--seconds 20]
"""

from __future__ import annotations

from typing import Any

import keras
import tensorflow as tf

from _common import Deadline, StopAt, dense_net, done, linear_problem, options

BATCH = 256


class MedianAbsoluteError(keras.metrics.Metric):  # type: ignore[misc]
    """The exact median of every absolute error seen since the last reset."""

    def __init__(self, name: str = "median_absolute_error") -> None:
        super().__init__(name=name)
        self.errors = tf.Variable(
            tf.zeros([0]), shape=tf.TensorShape([None]), trainable=False, validate_shape=False
        )

    def update_state(self, y_true: Any, y_pred: Any, sample_weight: Any = None) -> None:
        errors = tf.reshape(tf.abs(y_true - y_pred), [-1])
        self.errors.assign(tf.concat([self.errors, errors], axis=0))

    def result(self) -> Any:
        ordered = tf.sort(self.errors)
        return ordered[tf.size(ordered) // 2]

    def reset_state(self) -> None:
        self.errors.assign(tf.zeros([0]))


def main() -> None:
    args = options(__doc__)
    x, y = linear_problem(samples=1 << 20)  # a large dataset: one epoch outlasts the run
    model = dense_net()
    metric = MedianAbsoluteError()
    model.compile(optimizer=keras.optimizers.Adam(1e-3), loss="mse", metrics=[metric])
    deadline = Deadline(args.seconds)
    stop = StopAt(deadline)
    model.fit(
        x,
        y,
        batch_size=BATCH,
        epochs=1,
        verbose=0,
        callbacks=[keras.callbacks.TensorBoard(args.logdir, update_freq=20), stop],
    )
    kept = int(tf.size(metric.errors))
    done(errors_kept=kept, kept_mb=kept * 4 >> 20, steps=stop.pace.rates())


if __name__ == "__main__":
    main()
