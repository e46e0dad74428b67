"""The environment variables that the launcher, the hook and the monitors agree on."""

from __future__ import annotations

RUNTIME_DIR_ENV = "DRIFTWATCH_RUNTIME_DIR"
"""The directory that holds a process's channel, overriding every default."""
SHARED_DIR_ENV = "DRIFTWATCH_SHARED_DIR"
"""A directory every user may create their own channel directory in (shared with a node agent)."""
RUN_ENV = "DRIFTWATCH_RUN"
"""The run name ``driftwatch run`` chose, so the hook's and the monitor's agree."""
DISABLE_ENV = "DRIFTWATCH_HOOK"
"""Set to ``0`` to turn the injection off for one job."""
