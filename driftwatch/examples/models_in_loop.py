"""Models built in a loop without clearing the session: a hyperparameter search that leaks.

Each trial builds, compiles and fits a new model. Without
``keras.backend.clear_session()`` between trials, Keras's global state (layer name
counters, the functions traced for every model, their graphs) keeps every old model
reachable, and host memory grows trial after trial, with the old models' variables in
TensorFlow's allocator. driftwatch reports ``host_memory_drift`` (leak class
``tensors_kept_alive`` when TF's allocator keeps statistics, as under ``driftwatch run
--cpu-allocator-stats``, or ``framework_state`` when that allocator's steps, one per model,
are too sparse for the window that found the leak; both advise clearing the session). Fix: call
``keras.backend.clear_session()`` at the start of each trial.

python driftwatch/examples/models_in_loop.py [--seconds 40]
"""

from __future__ import annotations

import itertools
import time

import keras
from common import TimeBudget, arguments, logdir, mlp, regression_data


def main() -> None:
    args = arguments(__doc__).parse_args()
    x, y = regression_data(samples=1024)
    directory = logdir(args)
    deadline = time.monotonic() + args.seconds
    grid = itertools.product([64, 128, 256], [1, 2, 3], [1e-3, 3e-3])
    for trial, (width, depth, learning_rate) in enumerate(itertools.cycle(grid)):
        if time.monotonic() >= deadline:
            break
        model = mlp(width=width, depth=depth)
        model.compile(optimizer=keras.optimizers.Adam(learning_rate), loss="mse")
        history = model.fit(
            x,
            y,
            batch_size=64,
            epochs=1,
            verbose=0,
            callbacks=[
                keras.callbacks.TensorBoard(f"{directory}/trial-{trial}"),
                TimeBudget(deadline - time.monotonic()),
            ],
        )
        print(
            f"trial {trial}: width {width}, depth {depth}, lr {learning_rate}: "
            f"loss {history.history['loss'][-1]:.3g}"
        )


if __name__ == "__main__":
    main()
