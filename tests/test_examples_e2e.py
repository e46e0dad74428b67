"""Each bundled example under ``driftwatch run`` yields the finding it exists to show, and
the healthy ones yield no warning: real TensorFlow jobs, the real monitor, real findings."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import EXAMPLES, UNTIMED_KINDS, run_cli
from tests.jobs import ONE_THREAD, Enough, read_findings, watch

pytestmark = pytest.mark.tf

SECONDS = "35"
"""How long each example trains: with TensorFlow's start-up, a test takes about a minute."""
TIMEOUT = 150
"""Seconds an example's run (its training, TensorFlow's start-up, driftwatch's end) may take."""
LEAK_SECONDS = "25"
"""A leaking example's run: growth that reaches the limit within the hour is told within
seconds of start-up's end, and its class once the hook has probed it."""


@dataclass(frozen=True)
class Scenario:
    example: str
    kinds: frozenset[str]  # at least one of these is reported; empty: a healthy run
    leak_classes: frozenset[str] = frozenset()  # one of these, for host_memory_drift
    advice: str = ""  # words the finding's message must contain
    info: str | None = None  # a kind a healthy run reports as information
    args: tuple[str, ...] = ("--seconds", SECONDS)
    alone: bool = False  # judged on growth per step: a neighbour halving the steps halves it

    def __str__(self) -> str:
        return self.example

    def param(self) -> Any:
        """The scenario as a test parameter, ``paired`` when judged on untimed kinds only
        and not ``alone``."""
        paired = self.kinds and self.kinds <= UNTIMED_KINDS and not self.alone
        return pytest.param(self, marks=[pytest.mark.paired] if paired else [], id=self.example)


def leak(example: str, *leak_classes: str, advice: str = "") -> Scenario:
    kinds, classes = frozenset({"host_memory_drift"}), frozenset(leak_classes)
    return Scenario(example, kinds, classes, advice, args=("--seconds", LEAK_SECONDS))


SCENARIOS = [
    leak("retrace_python_scalar", "retracing"),
    leak("retrace_sequence_lengths", "retracing"),
    # With default flags on a CPU, TensorFlow's allocator keeps no statistics worth reading
    # (GPU allocators do; --cpu-allocator-stats turns them on), so a leak of tensors may be
    # classed unknown, and the finding then names the flag.
    leak("models_in_loop", "tensors_kept_alive", "framework_state", "unknown"),
    leak("tensors_kept_alive", "tensors_kept_alive", "unknown"),
    Scenario("image_summaries", frozenset({"event_file_unrotated", "event_file_growth"})),
    Scenario("late_nan", frozenset({"nonfinite"}), args=()),
    # A Python map with no prefetch: fit's input wait, timed by the hook on sampled steps.
    Scenario("input_bound", frozenset({"input_bound"}), advice="num_parallel_calls"),
    # growing_callback alone is not run here: the demo test runs it with late_nan
    # (slow_and_diverging) and asserts its slow_callbacks; test_causes_e2e ranks the
    # slowdown of a callback whose cost grows.
    # The control, but for its TensorBoard callback's 2 KB a step (tensorflow/tensorflow#34876;
    # standalone 597 -> 650 MB linearly over 140 s): stated at the run's end.
    Scenario(
        "train_keras",
        frozenset({"host_memory_drift"}),
        args=("--epochs", "100000", "--seconds", SECONDS),
        alone=True,
    ),
]
HEALTHY = [
    # periodic_stall needs 4 recurring pauses of over 4 typical steps each: saves every 150
    # steps are about 10 in 35 s where a step takes 20 ms, each pausing about 130 ms.
    Scenario(
        "checkpoints",
        frozenset(),
        info="periodic_stall",
        args=("--seconds", SECONDS, "--every", "150"),
    ),
]


def driftwatch(*args: str) -> subprocess.CompletedProcess[str]:
    # One TensorFlow thread: the job keeps to one core and driftwatch has the other, so
    # the healthy runs' step times do not depend on the scheduler's whims.
    return run_cli(*args, timeout=TIMEOUT, env=ONE_THREAD)


def run_example(
    scenario: Scenario, tmp_path: Path, enough: Enough | None = None
) -> list[dict[str, Any]]:
    """The findings of ``scenario`` run under ``driftwatch run``, as JSON objects; the job is
    stopped once ``enough`` holds for the findings so far."""
    args = [
        "--listen",
        "127.0.0.1:0",
        "--",
        sys.executable,
        str(EXAMPLES / f"{scenario.example}.py"),
    ]
    args += ["--logdir", str(tmp_path), *scenario.args]
    env = {**os.environ, **ONE_THREAD}  # as driftwatch() gives it
    return watch(args, tmp_path / "findings.jsonl", env, TIMEOUT, enough).findings


def described(findings: list[dict[str, Any]]) -> str:
    return "; ".join(f"[{f['severity']}] {f['kind']}: {f['evidence']}" for f in findings)


@pytest.mark.parametrize("scenario", [scenario.param() for scenario in SCENARIOS])
def test_a_broken_example_is_caught(scenario: Scenario, tmp_path: Path) -> None:
    # Judged on the first finding of its kinds: the job is stopped once it is reported.
    def caught_one(findings: list[dict[str, Any]]) -> bool:
        return any(f["kind"] in scenario.kinds for f in findings)

    findings = run_example(scenario, tmp_path, caught_one)
    caught = [f for f in findings if f["kind"] in scenario.kinds]
    assert caught, f"expected one of {sorted(scenario.kinds)}, got: {described(findings)}"
    assert all(f["severity"] in ("warning", "critical") for f in caught)
    if scenario.leak_classes:
        leak_class = caught[0]["evidence"]["leak_class"]
        assert leak_class in scenario.leak_classes, described(caught)
        if leak_class == "unknown":  # no allocator statistics on a CPU: it says so
            assert "--cpu-allocator-stats" in caught[0]["message"], caught[0]["message"]
    assert scenario.advice in caught[0]["message"], caught[0]["message"]


@pytest.mark.parametrize("scenario", HEALTHY, ids=str)
def test_a_healthy_example_raises_no_warning(scenario: Scenario, tmp_path: Path) -> None:
    findings = run_example(scenario, tmp_path)
    loud = [f for f in findings if f["severity"] != "info"]
    assert not loud, described(loud)
    if scenario.info is not None:
        assert scenario.info in {f["kind"] for f in findings}, described(findings)


def test_the_demo_shows_two_problems_with_causes_and_fixes() -> None:
    result = driftwatch("demo")
    assert result.returncode == 0, result.stderr[-2000:]
    match = re.search(r"^findings: (\S+)$", result.stdout, re.MULTILINE)
    assert match, result.stdout[-2000:]
    findings = read_findings(Path(match.group(1)))
    kinds = {f["kind"] for f in findings}
    assert {"slow_callbacks", "nonfinite"} <= kinds, described(findings)
    summary = result.stdout[result.stdout.index("findings:") :]
    for said in ("non-finite", "log(0)", "outside the train step", "log less often"):
        assert said in summary  # what, and what to try


@pytest.mark.paired
def test_demo_lists_the_examples() -> None:
    result = driftwatch("demo", "--list")
    assert result.returncode == 0, result.stderr
    names = {line.split()[0] for line in result.stdout.splitlines()}
    demo_only = {"slow_and_diverging", "growing_callback"}  # run by the demo test
    assert names == {s.example for s in SCENARIOS + HEALTHY} | demo_only
    assert "common" not in names  # a helper module, not an example


@pytest.mark.paired
def test_demo_of_an_unknown_example_is_one_line() -> None:
    result = driftwatch("demo", "no_such_example")
    assert result.returncode == 1
    assert result.stderr.startswith("driftwatch: error: no example 'no_such_example'; there are: ")
    assert result.stderr.count("\n") == 1
