"""``model.fit`` with validation after every epoch and the TensorBoard callback.

A textbook ``fit``: epochs of a couple of seconds, validation after each, the TensorBoard
callback with its defaults. With TensorFlow 2.21 and Keras 3.15 the callback costs about
2 KB of host memory per training step, for good (measured: +1.2 MB/s, linear for a minute;
the same program without the callback stays flat), as in tensorflow/tensorflow#34876
("memory leak in fit() with callback ... only happens when a callback is assigned, any
callback eg: tensorboard").

python scenarios/fit_validation_tensorboard.py [--seconds 30]
"""

from __future__ import annotations

import keras

from _common import fit_with_validation, options

SECONDS = 30.0
"""How long it trains by default: where the host runs it at half this one's pace (230 steps
a second), the callback keeps 12 MiB in that time, over the 8 MiB stated at a short run's
end (docs/memory-start-and-end.md, "Steady growth to the end")."""


def main() -> None:
    args = options(__doc__, SECONDS)
    fit_with_validation(args, keras.callbacks.TensorBoard(args.logdir))


if __name__ == "__main__":
    main()
