"""Two problems in one short run: a callback that gets slower and a loss that turns NaN.

The default of ``driftwatch demo``: a callback whose cost grows with the step count
(``slow_callbacks``, see growing_callback.py) and a hand-written log loss that turns
non-finite about halfway (``nonfinite``, see late_nan.py).

python driftwatch/examples/slow_and_diverging.py [--epochs 150]
"""

from __future__ import annotations

from pathlib import Path

from common import arguments, fit, logdir
from growing_callback import LossHistory
from late_nan import diverging_classifier, separable_data

EPOCHS = 60
LEARNING_RATE = 5e-5
"""Diverges about halfway, before the growing callback has made the steps too slow."""


def main() -> None:
    parser = arguments(__doc__, seconds=55.0)
    parser.add_argument("--epochs", type=int, default=EPOCHS, help="it diverges about halfway")
    args = parser.parse_args()
    directory = logdir(args)
    x, y = separable_data()
    model = diverging_classifier(LEARNING_RATE)
    history = [LossHistory(Path(directory) / "history.json")]
    fit(model, x, y, directory, args.seconds, history, epochs=args.epochs)


if __name__ == "__main__":
    main()
