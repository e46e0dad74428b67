"""``driftwatch doctor``: which sources work on this machine, and why not."""

from __future__ import annotations

import importlib.metadata
import importlib.util
import os
import shutil
import socket
from dataclasses import dataclass

import psutil

from driftwatch.capture.stack import INSTALL_HINT, find_py_spy
from driftwatch.errors import ACCESS_HINT
from driftwatch.export.http import DEFAULT_HOST, DEFAULT_PORT
from driftwatch.sources import eventfiles, host, nvml
from driftwatch.target.access import (
    CAPABILITY_HINT,
    NO_ATTACH_HINT,
    NO_ATTACH_SCOPE,
    Privileges,
    privileges,
)


@dataclass(frozen=True, slots=True)
class Check:
    name: str
    ok: bool
    detail: str


def _own() -> Privileges:
    return privileges(os.getpid())


def _reach(facts: Privileges) -> str:
    """Whose processes this driftwatch may read, and what would widen that."""
    if facts.root and facts.ptrace_capable:
        return "every process on this machine"
    if facts.root:
        return f"processes of user root only ({CAPABILITY_HINT})"
    return f"processes of user {psutil.Process().username()} only ({ACCESS_HINT})"


def check_process_access() -> Check:
    """Whose processes driftwatch can read (root with CAP_SYS_PTRACE: everyone's)."""
    return Check("process", True, f"psutil {psutil.__version__}; can read {_reach(_own())}")


def check_package(name: str, purpose: str, extra: str) -> Check:
    """Whether an optional package is installed, without importing it."""
    if importlib.util.find_spec(name) is None:
        return Check(name, False, f"not installed (pip install 'driftwatch[{extra}]'): {purpose}")
    return Check(name, True, f"{importlib.metadata.version(name)}: {purpose}")


def check_py_spy() -> Check:
    """Whether stack dumps at drift can be taken, and of whose jobs (docs/capture.md)."""
    found = find_py_spy()
    if found is None:
        return Check("py-spy", False, f"not installed ({INSTALL_HINT}): no stack dumps at drift")
    facts = _own()
    if facts.ptrace_scope >= NO_ATTACH_SCOPE:
        return Check("py-spy", False, f"{found}: no stack dumps at drift: {NO_ATTACH_HINT}")
    return Check("py-spy", True, f"{found}: stack dumps at drift of {_reach(facts)}")


def check_traces() -> Check:
    """Whether profiler traces at drift can be taken: by the hook, inside a hooked job."""
    if importlib.util.find_spec("tensorflow") is None:
        return Check(
            "traces", False, "TensorFlow not installed here: the hook takes traces in the job"
        )
    return Check("traces", True, "TensorFlow Profiler traces at drift of jobs with the hook")


def check_port(host: str = DEFAULT_HOST, port: int = DEFAULT_PORT) -> Check:
    with socket.socket() as probe:
        try:
            probe.bind((host, port))
        except OSError as err:
            return Check("listener", False, f"{host}:{port} is not free ({err.strerror})")
    return Check("listener", True, f"{host}:{port} is free for /metrics")


def run_checks() -> list[Check]:
    nvml_ok, nvml_detail = nvml.describe()
    events_ok, events_detail = eventfiles.describe()
    host_ok, host_detail = host.describe()
    promtool = shutil.which("promtool")
    return [
        check_process_access(),
        Check("nvml", nvml_ok, nvml_detail),
        Check("eventfiles", events_ok, events_detail),
        Check("host", host_ok, host_detail),
        check_package("tensorflow", "the in-process hook can run", "tf"),
        check_port(),
        Check(
            "promtool",
            promtool is not None,
            promtool or "not found (apt-get install prometheus): only needed to check rules",
        ),
        check_py_spy(),
        check_traces(),
        Check("cpus", True, f"{os.cpu_count()} CPUs, {psutil.virtual_memory().total >> 20} MiB"),
    ]
