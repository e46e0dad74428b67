"""``model.fit`` whose steps get two to three times slower 60 % of the way through: a curriculum
callback turns on a heavy augmentation that runs in Python inside the input pipeline.

The pipeline maps each batch through ``tf.py_function(augment)``. At 60 % of the run a
callback switches ``augment`` from light noise to "strong" augmentation (random masking,
sorting-based rank noise, FFT round trips), done in NumPy under the GIL on the
tf.data thread: from then on the input pipeline, not the model, sets the pace and each step
takes about three times as long ("training suddenly got 3x slower after epoch N"). No
TensorBoard. Fix: do the augmentation in TensorFlow ops (``map`` with
``num_parallel_calls``), or ahead of time.

python scenarios/fit_augmentation_switch.py [--seconds 20]
"""

from __future__ import annotations

import gc
from typing import Any

import keras
import numpy as np
import tensorflow as tf

from _common import FEATURES, Deadline, StopAt, dense_net, done, linear_problem, options

BATCH = 64
HEAVY_FROM = 0.6
"""Share of the run after which the heavy augmentation is on."""
HEAVY_ROUNDS = 2
"""FFT round trips (of length 4096) of the heavy augmentation: about twice a light step's time
again (7 ms on an idle core), so that the slowdown shows on a loaded machine too."""


class Augmentation:
    """Light noise, or, once ``heavy``, masking, rank noise and FFT round trips in NumPy."""

    def __init__(self) -> None:
        self.heavy = False
        self.rng = np.random.default_rng(0)

    def __call__(self, x: Any) -> np.ndarray:
        batch: np.ndarray = x.numpy()
        batch = batch + 0.01 * self.rng.standard_normal(batch.shape).astype("float32")
        if self.heavy:
            mask = self.rng.random(batch.shape) > 0.1
            ranks = np.argsort(np.argsort(batch, axis=1), axis=1).astype("float32")
            batch = batch * mask + 1e-3 * ranks
            for _ in range(HEAVY_ROUNDS):
                batch = np.fft.irfft(np.fft.rfft(batch, n=4096, axis=1), axis=1)[:, :FEATURES]
        return batch.astype("float32")


class Curriculum(keras.callbacks.Callback):  # type: ignore[misc]
    """Turns the heavy augmentation on once HEAVY_FROM of the run has passed."""

    def __init__(self, deadline: Deadline, seconds: float, augmentation: Augmentation) -> None:
        super().__init__()
        self.switch_at = HEAVY_FROM * seconds
        self.deadline = deadline
        self.augmentation = augmentation
        self.step = 0
        self.switched_step = -1

    def on_train_batch_end(self, batch: int, logs: dict[str, Any] | None = None) -> None:
        self.step += 1
        if not self.augmentation.heavy and self.deadline.elapsed() >= self.switch_at:
            self.augmentation.heavy = True
            self.switched_step = self.step


def main() -> None:
    args = options(__doc__)
    x, y = linear_problem(samples=16384)
    augmentation = Augmentation()

    def augment(xb: Any, yb: Any) -> tuple[Any, Any]:
        augmented = tf.py_function(augmentation, [xb], tf.float32)
        augmented.set_shape(xb.shape)
        return augmented, yb

    dataset = (
        tf.data.Dataset.from_tensor_slices((x, y))
        .shuffle(len(x))
        .repeat()
        .batch(BATCH, drop_remainder=True)
        .map(augment)
    )
    model = dense_net()
    model.compile(optimizer=keras.optimizers.Adam(1e-3), loss="mse")
    deadline = Deadline(args.seconds)
    stop = StopAt(deadline)
    curriculum = Curriculum(deadline, args.seconds, augmentation)
    history = model.fit(
        dataset, steps_per_epoch=256, epochs=10_000, verbose=0, callbacks=[stop, curriculum]
    )
    ends = np.array(stop.pace.ends)
    switched = ends[curriculum.switched_step - 1] if curriculum.switched_step > 0 else ends[-1]
    before = ends[(ends < switched) & (ends >= switched - 4.0)]
    after = ends[(ends > switched) & (ends <= switched + 4.0)]
    done(
        epochs=len(history.history["loss"]),
        steps=len(ends),
        steps_per_second=stop.pace.rates(),
        heavy_from_s=f"{switched - ends[0]:.1f}",
        rate_4s_before=f"{len(before) / 4:.0f}/s",
        rate_4s_after=f"{len(after) / 4:.0f}/s",
    )
    # Without this the pipeline's iterator, blocked in tf.py_function, is torn down at
    # interpreter shutdown and the process hangs there (TensorFlow 2.21, Keras 3.15).
    del dataset
    gc.collect()


if __name__ == "__main__":
    main()
