"""The ``driftwatch`` command as users run it: a real subprocess, real targets, real signals."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from driftwatch import __version__
from tests.conftest import (
    REPO,
    UNSHARE,
    WITHOUT_PTRACE,
    needs_pid_namespaces,
    run_cli,
    unused_pid,
)


def kernel_threads() -> Iterator[tuple[int, str]]:
    """The kernel threads this process sees (kthreadd, and its children), by PID and name."""
    for process in psutil.process_iter(["ppid", "name"]):
        if process.info["ppid"] == 2 or (process.pid == 2 and process.info["name"] == "kthreadd"):
            yield process.pid, process.info["name"]


def assert_one_line_error(result: subprocess.CompletedProcess[str], *needles: str) -> None:
    assert result.returncode != 0
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("driftwatch: error: "), lines[0]
    assert "Traceback" not in result.stderr + result.stdout
    for needle in needles:
        assert needle in lines[0]


def test_version() -> None:
    result = run_cli("--version")
    assert (result.returncode, result.stdout.strip()) == (0, f"driftwatch {__version__}")


def test_doctor_names_every_source() -> None:
    result = run_cli("doctor")
    assert result.returncode == 0, result.stderr
    names = {line.split()[1] for line in result.stdout.splitlines()}
    assert {
        "process",
        "nvml",
        "eventfiles",
        "tensorflow",
        "listener",
        "promtool",
        "py-spy",
        "traces",
    } <= names


def test_doctor_says_whose_stacks_it_can_dump_and_what_root_lacks() -> None:
    # Expected: root without SYS_PTRACE reads its own user's processes only, and doctor
    # says so for the process source and for stack dumps, naming the capability to add.
    result = subprocess.run(
        [*WITHOUT_PTRACE, sys.executable, "-m", "driftwatch", "doctor"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    lines = {line.split()[1]: line for line in result.stdout.splitlines()}
    for name in ("process", "py-spy"):
        assert "of user root only" in lines[name]
        assert "SYS_PTRACE" in lines[name]


def test_no_such_pid() -> None:
    pid = unused_pid()
    assert_one_line_error(run_cli("attach", str(pid)), f"no process with PID {pid}")


def test_zombie(zombie: subprocess.Popen[bytes]) -> None:
    assert_one_line_error(run_cli("attach", str(zombie.pid)), "zombie")


def test_busy_port(sleeper: subprocess.Popen[bytes], busy_port: int) -> None:
    result = run_cli("attach", str(sleeper.pid), "--listen", f"127.0.0.1:{busy_port}")
    assert_one_line_error(result, "already in use", "--listen")


def test_access_denied_says_what_to_do(nobodys_sleeper: subprocess.Popen[bytes]) -> None:
    result = subprocess.run(
        [*WITHOUT_PTRACE, sys.executable, "-m", "driftwatch", "attach", str(nobodys_sleeper.pid)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    # Already root: the hint names the capability that is missing, not sudo.
    assert_one_line_error(result, "permission denied", "as root", "SYS_PTRACE", "--cap-add")
    assert "sudo" not in result.stderr


def test_a_kernel_thread_is_named_as_one() -> None:
    (pid, name) = next(kernel_threads(), (None, None))
    if pid is None:
        pytest.skip("no kernel thread visible in this PID namespace")
    result = run_cli("attach", str(pid))
    assert_one_line_error(result, f"process {pid} ({name}) is a kernel thread")


@needs_pid_namespaces
def test_a_pid_outside_driftwatchs_own_pid_namespace_says_how_to_see_it() -> None:
    # Expected: inside a PID namespace of its own (a container without hostPID) this
    # process's PID names nothing; the error says to share the host's PID namespace.
    result = subprocess.run(
        [*UNSHARE, sys.executable, "-m", "driftwatch", "attach", str(os.getpid())],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        cwd=REPO,
    )
    assert_one_line_error(result, f"no process with PID {os.getpid()}", "hostPID: true")


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--interval", "0"], "--interval"),
        (["--interval", "nan"], "--interval"),
        (["--interval", "-3"], "--interval"),
        (["--interval", "fast"], "interval"),
        (["--listen", "nonsense"], "--listen"),
        (["--listen", "127.0.0.1:99999"], "--listen"),
        (["--listen", "192.0.2.1:0"], "no such address"),
        (["--logdir", "/nonexistent/logs"], "--logdir"),
        (["--rank", " "], "--rank"),
        (["--findings", "/nonexistent/dir/findings.jsonl"], "--findings"),
        (["--retention", "5"], "--retention"),
        (["--retention", "-2d"], "--retention"),
        (["--db", "/dev/null/history.db"], "cannot use the history /dev/null/history.db"),
        (["--bogus"], "--bogus"),
    ],
)
def test_bad_flags(sleeper: subprocess.Popen[bytes], args: list[str], needle: str) -> None:
    assert_one_line_error(run_cli("attach", str(sleeper.pid), *args), needle)


def test_bad_pid_argument_and_unknown_command() -> None:
    assert_one_line_error(run_cli("attach", "12abc"), "pid")
    assert_one_line_error(run_cli("attach"), "Missing argument")
    assert_one_line_error(run_cli("frobnicate"), "frobnicate")


@pytest.fixture
def attached(sleeper: subprocess.Popen[bytes], tmp_path: Path) -> Iterator[subprocess.Popen[str]]:
    """``driftwatch attach`` on a sleeping child, once it has printed two samples."""
    attach = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "driftwatch",
            "attach",
            str(sleeper.pid),
            "--interval",
            "0.1",
            "--listen",
            "127.0.0.1:0",
            "--findings",
            str(tmp_path / "f.jsonl"),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert attach.stdout is not None
    for _ in range(2):
        assert "RSS:" in attach.stdout.readline()
    yield attach
    attach.kill()
    attach.wait()


def test_target_exit_ends_attach_with_a_summary(
    attached: subprocess.Popen[str], sleeper: subprocess.Popen[bytes]
) -> None:
    sleeper.kill()
    out, err = attached.communicate(timeout=30)
    assert attached.returncode == 0, err
    assert re.search(rf"stopped: process {sleeper.pid} has exited", out)
    assert "findings: none" in out
    assert "Traceback" not in err


@pytest.mark.parametrize(("sig", "code"), [(signal.SIGTERM, 0), (signal.SIGINT, 130)])
def test_signals_stop_attach_with_a_summary(
    attached: subprocess.Popen[str], sig: signal.Signals, code: int
) -> None:
    attached.send_signal(sig)
    out, err = attached.communicate(timeout=30)
    assert attached.returncode == code, err
    assert f"stopped: driftwatch received {sig.name}" in out
    assert "Traceback" not in err
