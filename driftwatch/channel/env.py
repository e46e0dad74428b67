"""The environment variables that the launcher, the hook and the monitors agree on."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

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
RANK_ENV = "DRIFTWATCH_RANK"
"""A process's rank within its job, over what ``TF_CONFIG`` or its launcher says."""
TF_CONFIG_ENV = "TF_CONFIG"
"""TensorFlow's cluster and task of a distributed job's process (JSON)."""
LAUNCHER_RANK_ENVS = ("HOROVOD_RANK", "OMPI_COMM_WORLD_RANK", "PMI_RANK", "SLURM_PROCID", "RANK")
"""Where launchers put a process's rank: Horovod, Open MPI, MPICH and Intel MPI, Slurm's
srun, torchrun; the first set is read."""


def run_name_from(environ: Mapping[str, str], argv: list[str], process_name: str) -> str:
    """The name of a run no flag named: ``$DRIFTWATCH_RUN`` of its environment, else its
    training script's name (``default_run_name``)."""
    return environ.get(RUN_ENV) or default_run_name(argv, process_name)


def rank_from(environ: Mapping[str, str]) -> str:
    """A process's rank within a distributed job: ``$DRIFTWATCH_RANK``, else the task of its
    ``TF_CONFIG`` (``worker:1``, as TensorFlow names it), else its launcher's rank variable
    (``LAUNCHER_RANK_ENVS``); ``""`` for a job of one process."""
    given = environ.get(RANK_ENV, "").strip()
    if given:
        return given
    task = _tf_config_task(environ.get(TF_CONFIG_ENV, ""))
    if task:
        return task
    return next((environ[name].strip() for name in LAUNCHER_RANK_ENVS if name in environ), "")


def tf_cluster_tasks(environ: Mapping[str, str]) -> int:
    """How many tasks the cluster of the process's ``TF_CONFIG`` has (0: none, or not
    JSON)."""
    cluster = _tf_config(environ.get(TF_CONFIG_ENV, "")).get("cluster", {})
    if not isinstance(cluster, dict):
        return 0
    return sum(len(tasks) for tasks in cluster.values() if isinstance(tasks, list))


def _tf_config(text: str) -> dict[str, Any]:
    """A ``TF_CONFIG`` as JSON; ``{}`` when there is none or it is not a JSON object
    (TensorFlow would refuse it, and the job says so itself)."""
    try:
        config = json.loads(text) if text.strip() else {}
    except ValueError:
        return {}
    return config if isinstance(config, dict) else {}


def _tf_config_task(text: str) -> str:
    """``type:index`` of the task a ``TF_CONFIG`` names; ``""`` when it names none (or is
    not JSON: TensorFlow would refuse it, and the job says so itself)."""
    task = _tf_config(text).get("task", {})
    if not isinstance(task, dict):
        return ""
    kind, index = task.get("type"), task.get("index", 0)
    return f"{kind}:{int(index)}" if isinstance(kind, str) and kind and _is_index(index) else ""


def _is_index(value: object) -> bool:
    """Whether ``value`` is a task index (an int, or digits as some launchers write it)."""
    return isinstance(value, int) or (isinstance(value, str) and value.isdigit())
