"""Stack dumps of every Python thread of a process, with py-spy (the ``capture`` extra).

``py-spy dump --pid PID`` reads the target's memory from outside (ptrace), so it needs what
``attach`` needs to read a process, and a little more: the same user, or root, and in a
container the SYS_PTRACE capability.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

from driftwatch.errors import CaptureUnavailable, TargetGone
from driftwatch.target.access import denied
from driftwatch.target.process import is_stopped

STACK_TIMEOUT_SECONDS = 30.0
"""A py-spy dump that takes longer is killed (it pauses the target while it reads it)."""
PY_SPY = "py-spy"
INSTALL_HINT = "pip install py-spy"
_DENIED = ("permission denied", "operation not permitted")
_GONE = ("no such process", "failed to find process", "failed to open process")


def find_py_spy() -> str | None:
    """The py-spy binary: on ``PATH``, else beside this Python (a virtual environment's
    ``bin``, where its wheel installs it); None if neither has it."""
    found = shutil.which(PY_SPY)
    if found:
        return found
    beside = Path(sys.executable).parent / PY_SPY
    return str(beside) if os.access(beside, os.X_OK) else None


def dump_stacks(pid: int, binary: str | None = None) -> str:
    """py-spy's dump of every Python thread of process ``pid``: it stops the process while it
    reads it, and reads a process already stopped (SIGSTOP, a tracer) as it is.

    ``CaptureUnavailable`` when py-spy is missing or fails, ``TargetAccessDenied`` (saying,
    as ``attach`` does, what to change) when it may not read the process, ``TargetGone`` when
    the process is gone.
    """
    binary = binary or find_py_spy()
    if binary is None:
        raise CaptureUnavailable(f"no stack dump: py-spy is not installed ({INSTALL_HINT})")
    command = [binary, "dump", "--pid", str(pid)]
    if is_stopped(pid):  # py-spy cannot stop it again, and it holds still as it is
        command.append("--nonblocking")
    try:
        done = subprocess.run(
            command,
            capture_output=True,
            text=True,
            errors="replace",
            timeout=STACK_TIMEOUT_SECONDS,
            check=False,
        )
    except subprocess.TimeoutExpired as err:
        raise CaptureUnavailable(
            f"no stack dump of process {pid}: py-spy took over {STACK_TIMEOUT_SECONDS:.0f} s"
        ) from err
    except OSError as err:
        raise CaptureUnavailable(f"no stack dump: cannot run {binary}: {err.strerror}") from err
    if done.returncode == 0 and done.stdout.strip():
        return done.stdout
    said = (done.stderr or done.stdout).strip()
    lowered = said.lower()
    if any(words in lowered for words in _DENIED):
        raise denied(pid, "the Python stacks (py-spy)", attaching=True)
    if any(words in lowered for words in _GONE):
        raise TargetGone(pid, f"process {pid} is gone")
    first = said.splitlines()[0] if said else f"exit status {done.returncode}"
    raise CaptureUnavailable(f"no stack dump of process {pid}: py-spy said: {first}")
