"""Real TensorFlow jobs run to their end under ``driftwatch run`` with its default flags, for
the end-to-end tests that judge what driftwatch said about them."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tests.conftest import EXAMPLES, TF_ENV, run_cli

ONE_THREAD = {**TF_ENV, "TF_NUM_INTRAOP_THREADS": "1", "TF_NUM_INTEROP_THREADS": "1"}
"""One TensorFlow thread, as in test_examples_e2e: the job keeps to one core."""


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
    spare: at 20 s a CI run's 2x slowdown went unreported), 3 busy processes start beside it
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
