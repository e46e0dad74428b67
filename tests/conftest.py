"""Shared fixtures: real child processes, the CLI as a subprocess, promtool."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

import psutil
import pytest

if TYPE_CHECKING:
    from tests.jobs import FinishedRun, Watched

REPO = Path(__file__).resolve().parent.parent
EXAMPLES = REPO / "driftwatch" / "examples"
UNTIMED_KINDS = frozenset(
    {
        "host_memory_drift",
        "tf_memory_drift",
        "event_file_growth",
        "event_file_unrotated",
        "nonfinite",
        "worker_memory_drift",
        "fd_exhaustion",
        "thread_exhaustion",
        "zombie_children",
        "disk_exhaustion",
    }
)
"""Finding kinds judged on how much memory, event files, descriptors, threads, zombies or
used disk grew, or on NaNs, never on step times: a test that expects or forbids only these
may share the machine with another (``paired``)."""
TF_ENV = {"TF_CPP_MIN_LOG_LEVEL": "2", "CUDA_VISIBLE_DEVICES": "", "PYTHONUNBUFFERED": "1"}


@pytest.fixture(autouse=True)
def _private_data_home(
    monkeypatch: pytest.MonkeyPatch, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """Keep every driftwatch the tests start off the user's own history database."""
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path_factory.mktemp("data-home")))


def wait_for(predicate: object, timeout: float, what: str, poll: float = 0.05) -> None:
    """Poll ``predicate()`` until true; fail the test with ``what`` after ``timeout`` seconds."""
    assert callable(predicate)
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout} s waiting for {what}")
        time.sleep(poll)


@pytest.fixture(scope="session")
def keras_job_slowed_by_a_cpu_hog(tmp_path_factory: pytest.TempPathFactory) -> FinishedRun:
    """One real Keras job slowed by a CPU hog beside it, run once for every test that judges
    it (its causes, its captures)."""
    from tests.jobs import keras_job_slowed_by_a_cpu_hog as run  # it imports this module

    return run(tmp_path_factory.mktemp("hogged"))


@pytest.fixture(scope="session")
def healthy_scenario(tmp_path_factory: pytest.TempPathFactory) -> Callable[[str], Watched]:
    """A healthy program of scenarios/ run to its end, once for every test that judges it
    (healthy_fit_validation.py: its verdict in test_scenarios_e2e, its goodput in
    test_goodput), by its file name."""
    from tests.jobs import run_scenario  # it imports this module

    runs: dict[str, Watched] = {}

    def run(program: str) -> Watched:
        if program not in runs:
            runs[program] = run_scenario(program, tmp_path_factory.mktemp(Path(program).stem))
        return runs[program]

    return run


def run_cli(
    *args: str, timeout: float = 60, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """``driftwatch *args``, with ``env`` added to the environment."""
    return subprocess.run(
        [sys.executable, "-m", "driftwatch", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
        env={**os.environ, **env} if env else None,
    )


def unused_pid() -> int:
    pid = 4_000_000
    while psutil.pid_exists(pid):
        pid -= 1
    return pid


@pytest.fixture
def sleeper() -> Iterator[subprocess.Popen[bytes]]:
    """A real child process that just sleeps; killed and reaped afterwards."""
    child = subprocess.Popen(["sleep", "300"])
    yield child
    child.kill()
    child.wait()


UNSHARE = ["unshare", "--pid", "--fork", "--mount-proc", "--kill-child"]


def _can_unshare() -> bool:
    try:
        done = subprocess.run([*UNSHARE, "true"], capture_output=True, timeout=10, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return done.returncode == 0


needs_pid_namespaces = pytest.mark.skipif(
    not _can_unshare(), reason="needs unshare(1) and the right to create PID namespaces (root)"
)


@contextmanager
def in_pid_namespace(
    code: str, *args: str, uid: int | None = None, env: dict[str, str] | None = None
) -> Iterator[tuple[subprocess.Popen[str], int]]:
    """Python ``code`` run with ``args`` in a new PID namespace, as in a container: its own
    PID there is 1; as user ``uid`` if given, with ``env`` added to the environment. Yields
    the ``unshare`` process (its stdin and stdout are the code's) and the code's PID as this
    namespace sees it; kills both afterwards."""
    as_user = (
        [] if uid is None else ["setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups"]
    )
    outer = subprocess.Popen(
        [*UNSHARE, *as_user, sys.executable, "-c", code, *args],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        cwd=REPO,
        env={**os.environ, **(env or {})},
        text=True,
    )
    try:
        wait_for(lambda: psutil.Process(outer.pid).children(), 10, "the contained process")
        (inner,) = psutil.Process(outer.pid).children()
        yield outer, inner.pid
    finally:
        outer.kill()  # --kill-child: the contained process dies with it
        outer.wait()


CONTAINED_HOOK = """
import subprocess, sys, time
if sys.argv[2:] == ["tmpfs"]:  # the channel directory on a mount only this namespace sees
    subprocess.run(["mount", "-t", "tmpfs", "-o", "mode=0700", "none", sys.argv[1]], check=True)
from driftwatch.hook.core import Hook
hook = Hook(run="contained", channel_dir=sys.argv[1] if len(sys.argv) > 1 else None)
for _ in range(3):
    with hook.step():
        time.sleep(0.01)
print("hooked", flush=True)
sys.stdin.readline()
"""
"""For ``in_pid_namespace``: a hooked job that steps 3 times, says "hooked" and waits; its
arguments: the channel directory, and ``tmpfs`` to mount one there first."""


WITHOUT_PTRACE = ["setpriv", "--bounding-set=-sys_ptrace", "--inh-caps=-sys_ptrace"]
"""Prefix for a command run as root but without CAP_SYS_PTRACE: it may not read processes of
other users, as an ordinary user may not."""


@pytest.fixture
def nobodys_sleeper() -> Iterator[subprocess.Popen[bytes]]:
    """A sleeping child process that belongs to user nobody."""
    child = subprocess.Popen(
        ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "sleep", "300"]
    )
    yield child
    child.kill()
    child.wait()


@pytest.fixture
def zombie() -> Iterator[subprocess.Popen[bytes]]:
    """A child that has exited but that we have not reaped yet."""
    child = subprocess.Popen(["true"])
    wait_for(
        lambda: psutil.Process(child.pid).status() == psutil.STATUS_ZOMBIE, 10, "a zombie child"
    )
    yield child
    child.wait()


@pytest.fixture
def busy_port() -> Iterator[int]:
    """A loopback port with a listener on it."""
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        yield listener.getsockname()[1]


@pytest.fixture(scope="session")
def promtool() -> str:
    """Path of promtool; installs Debian's prometheus package when missing (needs root)."""
    path = shutil.which("promtool")
    if path is None and os.geteuid() == 0:
        subprocess.run(["apt-get", "update", "-qq"], check=True)
        subprocess.run(
            ["apt-get", "install", "-y", "-qq", "--no-install-recommends", "prometheus"],
            check=True,
            env={**os.environ, "DEBIAN_FRONTEND": "noninteractive"},
        )
        path = shutil.which("promtool")
    if path is None:
        pytest.fail("promtool is missing and cannot be installed: apt-get install prometheus")
    return path


def promtool_check_rules(promtool: str, path: Path) -> subprocess.CompletedProcess[str]:
    """promtool's verdict on the rule file ``path``."""
    return subprocess.run(
        [promtool, "check", "rules", str(path)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def promtool_check_metrics(promtool: str, exposition: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [promtool, "check", "metrics"],
        input=exposition,
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )
