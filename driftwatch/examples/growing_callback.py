"""A callback whose cost grows with the step count: it rewrites the whole loss history.

Saving "everything so far" after every batch (a loss history to JSON, a plot of all points,
a metric recomputed over every prediction) costs O(steps): free at the start, the bulk of
each step an hour later. driftwatch reports it as ``slow_callbacks`` (the share of each
step spent outside the train step grows). Fix: append, or save every N steps.

python driftwatch/examples/growing_callback.py [--seconds 40]
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import keras
from common import arguments, fit, logdir, mlp, regression_data


class LossHistory(keras.callbacks.Callback):  # type: ignore[misc]
    """Keeps every batch's loss and saves the whole history after each batch."""

    def __init__(self, path: Path) -> None:
        super().__init__()
        self.path = path
        self.losses: list[float] = []

    def on_train_batch_end(self, batch: int, logs: dict[str, Any] | None = None) -> None:
        self.losses.append(float((logs or {}).get("loss", float("nan"))))
        self.path.write_text(json.dumps({"loss": self.losses, "smoothed": smooth(self.losses)}))


def smooth(values: list[float], weight: float = 0.9) -> list[float]:
    """Exponential moving average of the whole series (recomputed from the start)."""
    smoothed: list[float] = []
    for value in values:
        smoothed.append(value if not smoothed else weight * smoothed[-1] + (1 - weight) * value)
    return smoothed


def main() -> None:
    args = arguments(__doc__).parse_args()
    directory = logdir(args)
    x, y = regression_data()
    model = mlp()
    model.compile(optimizer="adam", loss="mse")
    history = Path(directory) / "history.json"
    fit(model, x, y, directory, args.seconds, [LossHistory(history)])
    print(f"loss history: {history}")


if __name__ == "__main__":
    main()
