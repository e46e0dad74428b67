"""Tensors kept alive in a Python list: a callback that keeps every batch's embeddings.

To plot later how the representation evolves, a callback runs a fixed probe batch through
the encoder after every batch and appends the result, a TensorFlow tensor, to a list.
Every tensor stays alive: host memory and TensorFlow's own allocator grow together.
driftwatch reports ``host_memory_drift`` (leak class ``tensors_kept_alive``; run it with
``driftwatch run --cpu-allocator-stats`` so that TensorFlow's CPU allocator keeps
statistics). Fix: keep what you need as NumPy (``.numpy()``), summarised, or every N steps.

python driftwatch/examples/tensors_kept_alive.py [--seconds 40]
"""

from __future__ import annotations

from typing import Any

import keras
import numpy as np
from common import arguments, fit, logdir, mlp, regression_data


class KeepEmbeddings(keras.callbacks.Callback):  # type: ignore[misc]
    """After each batch, embeds ``probe`` with the encoder and keeps the tensor."""

    def __init__(self, encoder: Any, probe: np.ndarray) -> None:
        super().__init__()
        self.encoder = encoder
        self.probe = probe
        self.embeddings: list[Any] = []

    def on_train_batch_end(self, batch: int, logs: dict[str, Any] | None = None) -> None:
        self.embeddings.append(self.encoder(self.probe, training=False))


def main() -> None:
    args = arguments(__doc__).parse_args()
    x, y = regression_data()
    model = mlp(width=512)
    model.compile(optimizer="adam", loss="mse")
    encoder = keras.Sequential(model.layers[:-1])  # shares the model's layers and weights
    fit(model, x, y, logdir(args), args.seconds, [KeepEmbeddings(encoder, x[:64])])


if __name__ == "__main__":
    main()
