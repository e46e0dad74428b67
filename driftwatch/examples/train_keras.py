"""A small, textbook Keras training run that logs to TensorBoard: the control.

It raises nothing but, at its end, the slow leak of Keras's TensorBoard callback (about 2 KB
a step with Keras 3.15, ``host_memory_drift``). Like every example, it knows nothing of
driftwatch.

python driftwatch/examples/train_keras.py [--logdir /tmp/tb] [--epochs 50] [--seconds 40]
"""

from __future__ import annotations

import math
import time
from typing import Any

import keras
from common import TimeBudget, arguments, logdir, mlp, regression_data


class SlowFrom(keras.callbacks.Callback):  # type: ignore[misc]
    """Adds ``seconds`` of host work to every step from ``step`` on (0: by step never), or
    from ``after`` seconds after the first step on (0: by time never)."""

    def __init__(self, step: int, seconds: float, after: float = 0.0) -> None:
        super().__init__()
        self.step = step
        self.seconds = seconds
        self.after = after
        self.steps_done = 0
        self.slow_at = math.inf  # monotonic time from which steps are slow, set by `after`

    def on_train_batch_end(self, batch: int, logs: dict[str, Any] | None = None) -> None:
        self.steps_done += 1
        if self.steps_done == 1 and self.after > 0:
            self.slow_at = time.monotonic() + self.after
        slow_by_step = 0 < self.step <= self.steps_done
        if slow_by_step or (self.after > 0 and time.monotonic() >= self.slow_at):
            time.sleep(self.seconds)


def main() -> None:
    parser = arguments(__doc__, seconds=600.0)
    parser.add_argument("--epochs", type=int, default=20)
    parser.add_argument("--samples", type=int, default=4096)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--log-every", type=int, default=10, help="log scalars every N batches")
    parser.add_argument("--slow-from-step", type=int, default=0, help="0: never slow down")
    parser.add_argument(
        "--slow-after-seconds",
        type=float,
        default=0.0,
        help="slow down this long after the first step (0: never; the same at any step rate)",
    )
    parser.add_argument("--slow-seconds", type=float, default=0.002)
    args = parser.parse_args()

    x, y = regression_data(args.samples)
    model = mlp()
    model.compile(optimizer="adam", loss="mse")
    callbacks: list[keras.callbacks.Callback] = [
        keras.callbacks.TensorBoard(logdir(args), update_freq=args.log_every),
        TimeBudget(args.seconds),
    ]
    if args.slow_from_step or args.slow_after_seconds:
        callbacks.append(SlowFrom(args.slow_from_step, args.slow_seconds, args.slow_after_seconds))
    model.fit(
        x,
        y,
        batch_size=args.batch_size,
        epochs=args.epochs,
        validation_split=0.1,
        verbose=0,
        callbacks=callbacks,
    )


if __name__ == "__main__":
    main()
