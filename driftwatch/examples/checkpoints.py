"""A healthy run that saves a checkpoint every N steps: expected pauses, not a problem.

Each save (the model, and a backup of the training state to resume from after a preemption)
stops training for a moment at a regular interval. driftwatch reports it as
information only (``periodic_stall``: period and share of wall time), and nothing else.
It logs no TensorBoard summaries: Keras's TensorBoard callback keeps about 2 KB a step, a
slow leak that driftwatch rightly reports at a run's end (``train_keras`` shows it).

python driftwatch/examples/checkpoints.py [--seconds 40] [--every 300]
"""

from __future__ import annotations

import os

import keras
from common import arguments, fit, logdir, mlp, regression_data


def main() -> None:
    parser = arguments(__doc__)
    parser.add_argument("--every", type=int, default=300, help="steps between checkpoints")
    args = parser.parse_args()
    directory = logdir(args)
    x, y = regression_data()
    model = mlp(width=1024)
    model.compile(optimizer="adam", loss="mse")
    checkpoint = keras.callbacks.ModelCheckpoint(
        os.path.join(directory, "checkpoint.keras"), save_freq=args.every
    )
    backup = keras.callbacks.BackupAndRestore(os.path.join(directory, "backup"), args.every)
    fit(model, x, y, directory, args.seconds, [checkpoint, backup], tensorboard=False)


if __name__ == "__main__":
    main()
