"""driftwatch: early, evidence-backed warnings that a long training run is drifting.

``driftwatch.Hook`` times custom training loops; ``driftwatch.keras.DriftwatchCallback``
watches ``model.fit``. Neither import pulls in TensorFlow until it is used, and importing
``driftwatch`` itself imports no other driftwatch module: ``Hook`` and ``TlsConfig`` are
loaded when first asked for.
"""

from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.1.0"

_LAZY = {"Hook": "driftwatch.hook.core", "TlsConfig": "driftwatch.export.http"}
"""The module that defines each name this package offers without importing it up front."""

__all__ = ["Hook", "TlsConfig", "__version__"]


def __getattr__(name: str) -> Any:
    """``Hook`` and ``TlsConfig``, imported on first use (then cached in this module)."""
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_LAZY})
