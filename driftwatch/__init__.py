"""driftwatch: early, evidence-backed warnings that a long training run is drifting.

``driftwatch.Hook`` times custom training loops; ``driftwatch.keras.DriftwatchCallback``
watches ``model.fit``. Neither import pulls in TensorFlow until it is used.
"""

__version__ = "0.1.0"

from driftwatch.export.http import TlsConfig
from driftwatch.hook import Hook

__all__ = ["Hook", "TlsConfig", "__version__"]
