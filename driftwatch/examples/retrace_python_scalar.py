"""tf.function retracing from a Python scalar argument: a decaying learning rate as a float.

``train_step(x, y, lr)`` with ``lr`` a Python float: tf.function specialises on Python
values, so every new learning rate traces the step again and keeps one more graph alive.
Each step is slow and host memory grows by about a megabyte per step. TensorFlow warns
("triggered tf.function retracing"); driftwatch reports ``host_memory_drift`` (leak class
``retracing``). Fix: pass ``tf.constant(lr)`` (or keep it in a ``tf.Variable``).

python driftwatch/examples/retrace_python_scalar.py [--seconds 40]
"""

from __future__ import annotations

from typing import Any

import keras
import tensorflow as tf
from common import arguments, logdir, mlp, regression_data, train_loop


def main() -> None:
    args = arguments(__doc__).parse_args()
    x, y = regression_data()
    model = mlp(width=256)

    @tf.function  # type: ignore[untyped-decorator]
    def train_step(x: Any, y: Any, lr: float) -> Any:
        with tf.GradientTape() as tape:
            loss = keras.ops.mean(keras.ops.square(model(x, training=True) - y))
        grads = tape.gradient(loss, model.trainable_variables)
        for grad, variable in zip(grads, model.trainable_variables, strict=True):
            variable.assign_sub(lr * grad)
        return loss

    lr = 0.01

    def step(i: int) -> Any:
        nonlocal lr
        start = i * 64 % len(x)
        loss = train_step(x[start : start + 64], y[start : start + 64], lr)
        lr *= 0.999  # a new Python float every step: a new trace every step
        return loss

    steps = train_loop(step, logdir(args), args.seconds)
    print(f"{steps} steps, {train_step.experimental_get_tracing_count()} traces")


if __name__ == "__main__":
    main()
