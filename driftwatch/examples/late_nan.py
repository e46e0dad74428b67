"""A hand-written log loss that turns non-finite late in training.

``-(y log p + (1 - y) log(1 - p))`` on a sigmoid output is fine while the model is unsure.
On separable data the logits keep growing; once one saturates, ``p`` is exactly 1.0 in
float32, ``log(1 - p)`` is ``-inf``, ``0 * -inf`` is NaN, and from then on so is every
weight. driftwatch reports ``nonfinite``. Fix: compute the loss from logits
(``keras.losses.BinaryCrossentropy(from_logits=True)``), or clip ``p`` away from 0 and 1.

python driftwatch/examples/late_nan.py [--epochs 150]
"""

from __future__ import annotations

from typing import Any

import keras
import numpy as np
from common import FEATURES, arguments, fit, logdir, mlp

EPOCHS = 150
LEARNING_RATE = 2e-5
"""With these, the loss turns NaN about halfway through training."""


def log_loss(y_true: Any, p: Any) -> Any:
    """Binary cross-entropy as the textbook writes it: unsafe at p = 0 or 1."""
    return -keras.ops.mean(y_true * keras.ops.log(p) + (1 - y_true) * keras.ops.log(1 - p))


def separable_data(samples: int = 4096, seed: int = 1) -> tuple[np.ndarray, np.ndarray]:
    """Two classes split by a hyperplane: a classifier can grow ever more confident."""
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(samples, FEATURES)).astype("float32")
    y = (x @ rng.normal(size=(FEATURES, 1)) > 0).astype("float32")
    return x, y


def diverging_classifier(learning_rate: float) -> Any:
    """A classifier trained with ``log_loss`` on sigmoid outputs."""
    model = mlp()
    model.add(keras.layers.Activation("sigmoid"))
    model.compile(optimizer=keras.optimizers.Adam(learning_rate), loss=log_loss)
    return model


def main() -> None:
    parser = arguments(__doc__, seconds=55.0)
    parser.add_argument("--epochs", type=int, default=EPOCHS, help="it diverges about halfway")
    parser.add_argument("--learning-rate", type=float, default=LEARNING_RATE)
    args = parser.parse_args()
    x, y = separable_data()
    model = diverging_classifier(args.learning_rate)
    history = fit(model, x, y, logdir(args), args.seconds, epochs=args.epochs)
    print("loss per epoch:", " ".join(f"{v:.3g}" for v in history.history["loss"]))


if __name__ == "__main__":
    main()
