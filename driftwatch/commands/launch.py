"""``driftwatch run``: start the job with the hook injected, pass its stderr through, and
forward the signals driftwatch receives to it."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from types import FrameType
from typing import IO

from driftwatch.channel.env import DISABLE_ENV, RANK_ENV, RUN_ENV
from driftwatch.errors import UsageError
from driftwatch.series import Sample

INJECT_DIR = Path(__file__).parent.parent / "hook" / "inject"
RETRACING_WARNING = re.compile(rb"triggered tf\.function retracing")
DRAIN_SECONDS = 2.0
"""How long the end of a run waits for the rest of the job's stderr, in seconds."""
FORWARDED_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2)


def child_environment(base: dict[str, str], hook: bool, run: str, rank: str = "") -> dict[str, str]:
    """The job's environment: its run name and rank (where it has one) for the hook, and
    ``PYTHONPATH`` led by the injection directory unless opted out."""
    env = dict(base)
    env[RUN_ENV] = run
    if rank:
        env[RANK_ENV] = rank
    if not hook:
        env[DISABLE_ENV] = "0"
        return env
    paths = [str(INJECT_DIR), *filter(None, env.get("PYTHONPATH", "").split(os.pathsep))]
    env["PYTHONPATH"] = os.pathsep.join(paths)
    return env


class StderrPump:
    """Copies the job's stderr to ours unchanged, counting TensorFlow's retracing warnings."""

    name = "stderr"

    def __init__(self, stream: IO[bytes], sink: IO[bytes]) -> None:
        self.retracing_warnings = 0
        self._stream = stream
        self._sink = sink
        self._thread = threading.Thread(target=self._pump, name="driftwatch-stderr", daemon=True)
        self._thread.start()

    def _pump(self) -> None:
        for line in iter(self._stream.readline, b""):
            self._sink.write(line)
            self._sink.flush()
            if RETRACING_WARNING.search(line):
                self.retracing_warnings += 1

    def sample(self, now: float) -> list[Sample]:
        return [Sample("retracing_warnings_total", float(self.retracing_warnings), now)]

    def drain(self, now: float) -> list[Sample]:
        """The count once the job's stderr has reached its end (or after ``DRAIN_SECONDS``:
        a child the job left behind may hold the pipe open)."""
        self._thread.join(DRAIN_SECONDS)
        return self.sample(now)

    def close(self) -> None:
        """Wait for the job's last words (its stderr closes when it exits)."""
        self._thread.join(timeout=5)


def launch(command: Sequence[str], env: dict[str, str]) -> subprocess.Popen[bytes]:
    """Start the job with stdin and stdout inherited and stderr piped through us."""
    try:
        return subprocess.Popen(list(command), env=env, stderr=subprocess.PIPE)
    except FileNotFoundError as err:
        raise UsageError(f"cannot run {command[0]!r}: no such file or command") from err
    except PermissionError as err:
        raise UsageError(f"cannot run {command[0]!r}: permission denied") from err


@contextmanager
def forwarding_signals(child: subprocess.Popen[bytes]) -> Iterator[list[int]]:
    """Forward signals to the job; yields the list of signals forwarded so far.

    Ctrl-C in a terminal already reaches the job, which shares our process group: SIGINT is
    forwarded only when it cannot have come from the terminal (our stdin is not a tty).
    """
    forwarded: list[int] = []
    from_terminal = sys.stdin is not None and sys.stdin.isatty()

    def handler(signum: int, frame: FrameType | None) -> None:
        forwarded.append(signum)
        if signum == signal.SIGINT and from_terminal:
            return
        if child.poll() is None:
            child.send_signal(signum)

    previous = {sig: signal.signal(sig, handler) for sig in FORWARDED_SIGNALS}
    try:
        yield forwarded
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)


def exit_code(returncode: int) -> int:
    """The job's exit status as a shell reports it (128 + N when killed by signal N)."""
    return 128 - returncode if returncode < 0 else returncode


def how_it_ended(pid: int, returncode: int) -> str:
    """How the job's process ended, from its ``returncode`` (negative: killed by that
    signal), as the summary's reason: a native abort leaves no message of its own."""
    if returncode < 0:
        try:
            name = signal.Signals(-returncode).name
        except ValueError:  # a real-time signal has no name
            return f"process {pid} was killed by signal {-returncode}"
        return f"process {pid} was killed by {name} (signal {-returncode})"
    if returncode:
        return f"process {pid} exited with status {returncode}"
    return f"process {pid} has exited"
