"""The in-process hook: exact step timing and TensorFlow probes from inside the training job.

Importing this package does not import TensorFlow; probes import it when they first run.
"""

from driftwatch.hook.core import Hook

__all__ = ["Hook"]
