"""``driftwatch.keras.DriftwatchCallback``: the hook for ``model.fit`` (imports Keras)."""

from driftwatch.hook.keras import DriftwatchCallback

__all__ = ["DriftwatchCallback"]
