"""The environment variables that the launcher, the hook and the monitors agree on."""

from __future__ import annotations

from collections.abc import Mapping

from driftwatch.target.process import default_run_name

RUNTIME_DIR_ENV = "DRIFTWATCH_RUNTIME_DIR"
"""The directory that holds a process's channel, overriding every default."""
SHARED_DIR_ENV = "DRIFTWATCH_SHARED_DIR"
"""A directory every user may create their own channel directory in (shared with a node agent)."""
RUN_ENV = "DRIFTWATCH_RUN"
"""A run's name, shared by the ranks of one job; ``driftwatch run`` sets it for the job, so
the hook's name and the monitor's agree."""
DISABLE_ENV = "DRIFTWATCH_HOOK"
"""Set to ``0`` to turn the injection off for one job."""


def run_name_from(environ: Mapping[str, str], argv: list[str], process_name: str) -> str:
    """The name of a run no flag named: ``$DRIFTWATCH_RUN`` of its environment, else its
    training script's name (``default_run_name``)."""
    return environ.get(RUN_ENV) or default_run_name(argv, process_name)
