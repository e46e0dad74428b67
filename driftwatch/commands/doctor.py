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
from driftwatch.export.http import DEFAULT_HOST, DEFAULT_PORT
from driftwatch.sources import eventfiles, host, nvml

CAP_SYS_PTRACE = 19


@dataclass(frozen=True, slots=True)
class Check:
    name: str
    ok: bool
    detail: str


def _effective_capabilities() -> int:
    with open("/proc/self/status", encoding="ascii") as status:
        for line in status:
            if line.startswith("CapEff:"):
                return int(line.split()[1], 16)
    return 0


def check_process_access() -> Check:
    """Whether driftwatch can read processes of other users (root with CAP_SYS_PTRACE)."""
    version = f"psutil {psutil.__version__}"
    try:
        can_ptrace = bool(_effective_capabilities() >> CAP_SYS_PTRACE & 1)
    except OSError as err:
        return Check("process", False, f"{version}; cannot read /proc: {err.strerror}")
    if can_ptrace:
        return Check("process", True, f"{version}; can read every process on this machine")
    user = psutil.Process().username()
    return Check(
        "process",
        True,
        f"{version}; can read processes of user {user} only "
        "(sudo, or the SYS_PTRACE capability in a container, to watch others)",
    )


def check_package(name: str, purpose: str, extra: str) -> Check:
    """Whether an optional package is installed, without importing it."""
    if importlib.util.find_spec(name) is None:
        return Check(name, False, f"not installed (pip install 'driftwatch[{extra}]'): {purpose}")
    return Check(name, True, f"{importlib.metadata.version(name)}: {purpose}")


def check_py_spy() -> Check:
    """Whether stack dumps at drift can be taken (docs/capture.md)."""
    found = find_py_spy()
    if found is None:
        return Check("py-spy", False, f"not installed ({INSTALL_HINT}): stack dumps at drift")
    return Check("py-spy", True, f"{found}: stack dumps at drift (needs what attach needs)")


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
        Check("cpus", True, f"{os.cpu_count()} CPUs, {psutil.virtual_memory().total >> 20} MiB"),
    ]
