"""Real TensorFlow jobs under ``driftwatch run`` (default flags) that slow down for a known
reason: the slowdown finding names that reason as its top cause, with its numbers.

Judged on step times: plain ``tf`` tests, never ``paired``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from driftwatch.series import SERIES
from tests.conftest import EXAMPLES, REPO, TF_ENV

pytestmark = pytest.mark.tf

SLOWDOWNS = frozenset({"abrupt_slowdown", "gradual_slowdown"})
PROGRAMS = REPO / "tests" / "data" / "programs"
ENV = {**os.environ, **TF_ENV, "TF_NUM_INTRAOP_THREADS": "1", "TF_NUM_INTEROP_THREADS": "1"}
"""One TensorFlow thread, as in test_examples_e2e: the job keeps to one core."""


def run_job(
    program: Path, tmp_path: Path, *args: str, beside: Callable[[Path], None] | None = None
) -> list[dict[str, Any]]:
    """The findings of ``program`` under ``driftwatch run`` with default flags; ``beside``
    is called with the job's logdir while it runs."""
    findings = tmp_path / "findings.jsonl"
    logdir = tmp_path / "logs"
    command = [sys.executable, "-m", "driftwatch", "run", "--listen", "127.0.0.1:0"]
    command += ["--findings", str(findings), "--", sys.executable, str(program)]
    command += ["--logdir", str(logdir), *args]
    with subprocess.Popen(
        command, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    ) as job:
        if beside is not None:
            beside(logdir)
        _, err = job.communicate(timeout=400)
    assert job.returncode == 0, err[-2000:]
    if not findings.exists():
        return []
    return [json.loads(line) for line in findings.read_text().splitlines()]


def top_cause(findings: list[dict[str, Any]]) -> dict[str, Any]:
    """The top cause of the run's slowdown finding (the last reported)."""
    slow = [f for f in findings if f["kind"] in SLOWDOWNS]
    described = "; ".join(f"{f['kind']}: {f['evidence']}" for f in findings)
    assert slow, f"no slowdown reported: {described}"
    causes = slow[-1]["evidence"].get("causes")
    assert causes, f"the slowdown names no cause: {slow[-1]['message']}"
    return dict(causes[0])


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


def test_a_cpu_hog_started_beside_a_real_keras_job_is_named_host_contention(
    tmp_path: Path,
) -> None:
    # Expected: a 1-thread Keras job on a 2-core VM; after 20 s of steps, 3 busy processes
    # start beside it: the job gets about half a core (steps ~2x slower), the node's CPU
    # pressure goes from its background (0.1-0.3 s/s on a quiet VM) to near 1 s/s:
    # host_cpu_contention scores (0.9 - 0.3) / 0.1 = 6, plus the fall of the job's CPU time
    # (half: 2), above every other cause. On a saturated node (pressure near 1 s/s before),
    # the fall of the job's CPU time alone: 0.5 / 0.25 = 2 (a trial at load 13: 0.99 -> 1.00
    # s/s, 0.34 -> 0.19 cores, score 1.9 then 2.4; steps 1.2 -> 4.0 ms, 3.4x).
    def hog_after_warmup(logdir: Path) -> None:
        deadline = time.monotonic() + 60
        while not any(logdir.rglob("events.out.tfevents.*")) and time.monotonic() < deadline:
            time.sleep(0.2)
        time.sleep(20)
        with cpu_hog(3):
            time.sleep(30)

    program = EXAMPLES / "train_keras.py"
    findings = run_job(
        program, tmp_path, "--epochs", "100000", "--seconds", "48", beside=hog_after_warmup
    )
    top = top_cause(findings)
    assert top["cause"] == "host_cpu_contention", top
    numbers = top["numbers"]
    assert numbers["cpu_pressure_share_after"] > 0.5
    assert numbers["target_cpu_cores_after"] < 0.8 * numbers["target_cpu_cores_before"]


@pytest.mark.timeout(600)
def test_retracing_that_starts_after_a_warmup_is_named_retracing(tmp_path: Path) -> None:
    # Expected: 35 s at one learning rate (one trace), then a new Python float every step:
    # a trace per step (score (1 - 0) / 0.01 = 100), steps from about a millisecond to
    # 20-300 ms (a trace; the more the busier the machine). A slowdown is judged on blocks
    # of 100 steps: 15 of the fast ones to set a baseline (warm-up included), 3-4 slow ones
    # to report it live: the job ends after 500 slow steps (15 s on a quiet machine, over
    # 2 minutes at load 15: 270 ms a trace).
    args = ("--why", "retracing", "--warmup", "35", "--slow-steps", "500")
    findings = run_job(PROGRAMS / "slows_after_warmup.py", tmp_path, *args)
    top = top_cause(findings)
    assert top["cause"] == "retracing", top
    # Traces over steps since the onset: 1.03-1.06 in a trial on a quiet machine. (Counted
    # as the traces' rate times the mean step time, it read 0.30 at load 8-10, 0.046 in CI.)
    assert top["numbers"]["traces_per_step_after"] > 0.1


def test_a_slow_tf_data_map_in_a_custom_loop_is_named_input_wait(tmp_path: Path) -> None:
    # Expected: after 15 s the map sleeps 20 ms a batch, the train step stays ~1 ms: the
    # loop waits for input most of each step. With the hook's input-wait share that is
    # input_wait; without it (before s8-inputbound), the wait is time outside the train
    # step: host_time, its share from a few % to most of the step.
    args = ("--why", "input", "--warmup", "15", "--slow-steps", "1500")
    findings = run_job(PROGRAMS / "slows_after_warmup.py", tmp_path, *args)
    top = top_cause(findings)
    expected = "input_wait" if "input_wait_share" in SERIES else "host_time"
    assert top["cause"] == expected, top
    share = "input_wait_share" if expected == "input_wait" else "outside_step_share"
    assert top["numbers"][f"{share}_after"] > top["numbers"][f"{share}_before"] + 0.3
