"""driftwatch: early, evidence-backed warnings that a long training run is drifting."""

__version__ = "0.1.0"
