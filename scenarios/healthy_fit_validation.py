"""Healthy: ``model.fit`` with validation after every epoch, logged by ``CSVLogger``.

Epochs of a couple of seconds, each followed by a short validation pass (a regular pause,
not a problem); the epoch's losses go to a CSV file in the log directory. (With the
TensorBoard callback instead, memory grows: see fit_validation_tensorboard.py.)

python scenarios/healthy_fit_validation.py [--seconds 20]
"""

from __future__ import annotations

from pathlib import Path

import keras

from _common import fit_with_validation, options


def main() -> None:
    args = options(__doc__)
    fit_with_validation(args, keras.callbacks.CSVLogger(str(Path(args.logdir) / "history.csv")))


if __name__ == "__main__":
    main()
