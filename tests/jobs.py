"""Real TensorFlow jobs under ``driftwatch run`` with its default flags, for the end-to-end
tests that judge what driftwatch said about them: run to their end, or stopped as soon as
driftwatch has said what a test judges."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import psutil
import pytest

from tests.conftest import EXAMPLES, REPO, TF_ENV, run_cli

ONE_THREAD = {**TF_ENV, "TF_NUM_INTRAOP_THREADS": "1", "TF_NUM_INTEROP_THREADS": "1"}
"""One TensorFlow thread, as in test_examples_e2e: the job keeps to one core."""
SCENARIOS = REPO / "scenarios"
SCENARIO_TIMEOUT = 150
"""Seconds a scenario (20 to 60 s of training, TensorFlow's start-up, driftwatch's end) may
take."""
POLL = 0.25
"""Seconds between two reads of a watched job's findings file."""
STOPPED = 128 + signal.SIGTERM
"""``driftwatch run``'s exit status for a job the test stopped with SIGTERM."""

Findings = list[dict[str, Any]]
Enough = Callable[[Findings], bool]
"""Whether the findings reported so far hold all a test judges (it may stop the job)."""


@dataclass(frozen=True)
class Watched:
    """What ``driftwatch run`` reported and printed for a job; ``stopped``: the test ended
    the job (SIGTERM) once driftwatch had said what it judges."""

    findings: Findings
    stdout: str
    stderr: str
    stopped: bool
    db: Path | None = None  # its history database, where the test gave one (--db)


def read_findings(path: Path) -> Findings:
    """The findings of a ``--findings`` file, as JSON objects; a line still being written is
    left for the next read."""
    if not path.exists():
        return []
    lines = path.read_text().split("\n")[:-1]  # the text after the last newline is unfinished
    return [json.loads(line) for line in lines if line]


def watch(
    args: list[str],
    findings: Path,
    env: dict[str, str],
    timeout: float,
    enough: Enough | None,
    cwd: Path | None = None,
) -> Watched:
    """``driftwatch run --findings findings *args`` (in ``cwd``, if given); once ``enough``
    says the findings so far hold what the test judges, the job gets SIGTERM (driftwatch
    watches it end and says what it found at the end, as always). Asserts driftwatch exits
    with the job's status: 0 at the job's own end, ``STOPPED`` when stopped, and no
    traceback."""
    command = [sys.executable, "-m", "driftwatch", "run", "--findings", str(findings), *args]
    out, err = findings.with_suffix(".stdout"), findings.with_suffix(".stderr")
    stopped = False
    with (
        out.open("w") as stdout,
        err.open("w") as stderr,
        subprocess.Popen(command, env=env, stdout=stdout, stderr=stderr, cwd=cwd) as job,
    ):
        deadline = time.monotonic() + timeout
        try:
            while job.poll() is None:
                if not stopped and enough is not None and enough(read_findings(findings)):
                    stopped = stop_job(job.pid, args[args.index("--") + 1 :])
                assert time.monotonic() < deadline, f"still running after {timeout} s"
                time.sleep(POLL)
        finally:
            if job.poll() is None:
                job.kill()
    said = err.read_text()
    # A job that ended by itself as the signal came exits 0.
    assert job.returncode in ((0, STOPPED) if stopped else (0,)), said[-2000:]
    assert "Traceback" not in said, said[-2000:]
    return Watched(read_findings(findings), out.read_text(), said, stopped)


def stop_job(driftwatch: int, command: list[str]) -> bool:
    """SIGTERM, as a scheduler stops a job, to the child of ``driftwatch`` that runs
    ``command`` (not to driftwatch, nor its other children: a stack dump under way); whether
    it was still there to get it."""
    for child in psutil.Process(driftwatch).children():
        with suppress(psutil.NoSuchProcess):
            if child.cmdline()[1:] == command[1:]:
                child.terminate()
                return True
    return False


def run_scenario(
    program: str, root: Path, enough: Enough | None = None, filesystem_mib: int = 0
) -> Watched:
    """``scenarios/program`` under ``driftwatch run``, its history in ``root/history.db``;
    with ``filesystem_mib``, its logdir is a tmpfs of that size (``small_filesystem``) and
    the job runs from it.

    No flag changes what driftwatch samples or judges; ``--db`` and ``--listen`` only keep
    the test off the user's history and off a port another driftwatch may hold."""
    logs = root / "logs"
    args = ["--db", str(root / "history.db"), "--listen", "127.0.0.1:0", "--"]
    args += [sys.executable, str(SCENARIOS / program), "--logdir", str(logs)]
    env = {**os.environ, **ONE_THREAD}  # the job keeps to one core, driftwatch has the other
    with small_filesystem(logs, filesystem_mib):
        cwd = logs if filesystem_mib else None
        watched = watch(args, root / "findings.jsonl", env, SCENARIO_TIMEOUT, enough, cwd)
    return replace(watched, db=root / "history.db")


@contextmanager
def small_filesystem(directory: Path, mib: int) -> Iterator[None]:
    """A tmpfs of ``mib`` MiB mounted at ``directory`` (made if missing) while in the block,
    unmounted after; nothing (``directory`` left as it is) when ``mib`` is 0. Skips the test
    where it cannot mount one (not root)."""
    if not mib:
        yield
        return
    directory.mkdir(parents=True, exist_ok=True)
    mount = ["mount", "-t", "tmpfs", "-o", f"size={mib}m", "tmpfs", str(directory)]
    try:
        mounted = subprocess.run(mount, capture_output=True, text=True, check=False, timeout=30)
    except OSError as err:  # no mount(8)
        pytest.skip(f"cannot mount a tmpfs here: {err}")
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.strip()}")
    try:
        yield
    finally:
        # Lazily: a process of the job still holding a file there lets go of it as it exits.
        subprocess.run(["umount", "--lazy", str(directory)], check=True, timeout=30)


@dataclass(frozen=True)
class FinishedRun:
    """A job that ran to its end under ``driftwatch run``: what driftwatch found, and the
    data home (``XDG_DATA_HOME``) that holds its history and its captures."""

    findings: list[dict[str, Any]]
    data_home: Path
    logdir: Path

    def cli(self, *args: str) -> subprocess.CompletedProcess[str]:
        """``driftwatch *args`` on this run's data home (``report``, for one)."""
        return run_cli(*args, env={"XDG_DATA_HOME": str(self.data_home)})


def run_job(
    program: Path,
    root: Path,
    *args: str,
    beside: Callable[[Path], None] | None = None,
    data_home: Path | None = None,
) -> FinishedRun:
    """``program`` (given ``--logdir`` and ``args``) under ``driftwatch run`` with default
    flags, its files under ``root``; ``beside`` is called with the job's logdir while it runs;
    ``data_home``: the history's home (else the environment's)."""
    findings = root / "findings.jsonl"
    logdir = root / "logs"
    home = data_home if data_home is not None else Path(os.environ["XDG_DATA_HOME"])
    command = [sys.executable, "-m", "driftwatch", "run", "--listen", "127.0.0.1:0"]
    command += ["--findings", str(findings), "--", sys.executable, str(program)]
    command += ["--logdir", str(logdir), *args]
    env = {**os.environ, **ONE_THREAD, "XDG_DATA_HOME": str(home)}
    with subprocess.Popen(
        command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    ) as job:
        if beside is not None:
            beside(logdir)
        _, err = job.communicate(timeout=400)
    assert job.returncode == 0, err[-2000:]
    assert "Traceback" not in err, err[-2000:]
    lines = findings.read_text().splitlines() if findings.exists() else []
    return FinishedRun([json.loads(line) for line in lines], home, logdir)


@contextmanager
def cpu_hog(processes: int) -> Iterator[None]:
    """``processes`` busy Python loops, stopped on leaving."""
    hogs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(processes)]
    try:
        yield
    finally:
        for hog in hogs:
            hog.kill()
            hog.wait()


def keras_job_slowed_by_a_cpu_hog(root: Path) -> FinishedRun:
    """``train_keras.py`` for 56 s, one TensorFlow thread, on this 2-core machine; 28 s after
    its first event file (warm-up and a baseline of 15 blocks of about a second, with time to
    spare: a 2x slowdown at 20 s can go unreported), 3 busy processes start beside it
    for 30 s: its steps get about half a core, about 2x slower."""

    def hog_after_warmup(logdir: Path) -> None:
        deadline = time.monotonic() + 60
        while not any(logdir.rglob("events.out.tfevents.*")) and time.monotonic() < deadline:
            time.sleep(0.2)
        time.sleep(28)
        with cpu_hog(3):
            time.sleep(30)

    home = root / "data-home"
    home.mkdir()
    return run_job(
        EXAMPLES / "train_keras.py",
        root,
        *("--epochs", "100000", "--seconds", "56"),
        beside=hog_after_warmup,
        data_home=home,
    )
