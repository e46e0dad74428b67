"""Every program of the failure suite (scenarios/) gets the verdict written down for it in
scenarios/verdicts.toml, under ``driftwatch run`` with default flags: real TensorFlow jobs
that know nothing of driftwatch, the real monitor, real findings."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import REPO, TF_ENV, UNTIMED_KINDS

pytestmark = pytest.mark.tf

SCENARIOS = REPO / "scenarios"
LOUD = frozenset({"warning", "critical"})
"""Severities a verdict counts: a healthy run raises none, a failing one at least one."""
TIMEOUT = 150
"""Seconds a scenario (20 s of training, TensorFlow's start-up, driftwatch's end) may take."""


@dataclass(frozen=True)
class Verdict:
    name: str
    program: str
    kinds: frozenset[str]  # at least one of these at warning or critical; empty: healthy
    leak_classes: frozenset[str]  # the leak classes a host_memory_drift may name; empty: any
    forbidden: frozenset[str]  # none of these at warning or critical
    missed: str  # why driftwatch does not yet get it right; empty: it must

    def __str__(self) -> str:
        return self.name

    def param(self) -> Any:
        """The verdict as a test parameter: a known miss is a strict xfail, so the test says
        when driftwatch starts getting it right."""
        if self.missed:
            marks = [pytest.mark.xfail(strict=True, reason=self.missed)]
        elif self.kinds and self.kinds | self.forbidden <= UNTIMED_KINDS:
            marks = [pytest.mark.paired]
        else:
            marks = []
        return pytest.param(self, marks=marks, id=self.name)


def load_verdicts() -> list[Verdict]:
    tables = tomllib.loads((SCENARIOS / "verdicts.toml").read_text())
    return [
        Verdict(
            name,
            table["program"],
            frozenset(table["kinds"]),
            frozenset(table.get("leak_classes", ())),
            frozenset(table.get("forbidden", ())),
            table.get("missed", ""),
        )
        for name, table in tables.items()
    ]


VERDICTS = load_verdicts()
FAILING = [verdict for verdict in VERDICTS if verdict.kinds]
HEALTHY = [verdict for verdict in VERDICTS if not verdict.kinds]


def run_scenario(verdict: Verdict, tmp_path: Path) -> list[dict[str, Any]]:
    """The findings of ``verdict``'s program run under ``driftwatch run``, as JSON objects.

    No flag changes what driftwatch samples or judges; ``--db`` and ``--listen`` only keep
    the test off the user's history and off a port another driftwatch may hold."""
    findings = tmp_path / "findings.jsonl"
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "driftwatch",
            "run",
            "--findings",
            str(findings),
            "--db",
            str(tmp_path / "history.db"),
            "--listen",
            "127.0.0.1:0",
            "--",
            sys.executable,
            str(SCENARIOS / verdict.program),
            "--logdir",
            str(tmp_path / "logs"),
        ],
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
        check=False,
        # One TensorFlow thread: the job keeps to one core and driftwatch has the other.
        env={**os.environ, **TF_ENV, "TF_NUM_INTRAOP_THREADS": "1", "TF_NUM_INTEROP_THREADS": "1"},
    )
    assert result.returncode == 0, result.stderr[-2000:]
    reported = (
        [json.loads(line) for line in findings.read_text().splitlines()]
        if findings.exists()
        else []
    )
    said = [line for line in result.stdout.splitlines() if line.startswith("done ")]
    print(f"{verdict}: {said[-1] if said else 'no done line'}")  # what the program did
    print(f"{verdict}: {described(reported) or 'no findings'}")
    return reported


def described(findings: list[dict[str, Any]]) -> str:
    return "; ".join(f"[{f['severity']}] {f['kind']}: {f['evidence']}" for f in findings)


def loud(findings: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [finding for finding in findings if finding["severity"] in LOUD]


def right(finding: dict[str, Any], verdict: Verdict) -> bool:
    """Whether ``finding`` is one ``verdict`` asks for: one of its kinds, and for a
    host-memory leak one of its leak classes where it names some, or an honest ``unknown``
    (see ``cannot_tell``)."""
    if finding["kind"] not in verdict.kinds:
        return False
    if finding["kind"] != "host_memory_drift" or not verdict.leak_classes:
        return True
    return finding["evidence"].get("leak_class") in verdict.leak_classes or cannot_tell(finding)


def cannot_tell(finding: dict[str, Any]) -> bool:
    """A leak classed ``unknown`` because TensorFlow's CPU allocator keeps no statistics with
    default flags, saying so and naming the flag that turns them on: a class driftwatch
    cannot know is not asked of it; a wrong class fails."""
    return (
        finding["evidence"].get("leak_class") == "unknown"
        and "--cpu-allocator-stats" in finding["message"]
    )


def test_the_suite_has_a_verdict_for_every_program_and_enough_of_each() -> None:
    programs = {path.name for path in SCENARIOS.glob("*.py") if not path.name.startswith("_")}
    assert programs == {verdict.program for verdict in VERDICTS}
    assert len(FAILING) >= 12
    assert len(HEALTHY) >= 4


@pytest.mark.parametrize("verdict", [verdict.param() for verdict in FAILING])
def test_a_failing_scenario_is_caught_with_default_flags(verdict: Verdict, tmp_path: Path) -> None:
    findings = loud(run_scenario(verdict, tmp_path))
    caught = [finding for finding in findings if right(finding, verdict)]
    classes = f" (a leak as {sorted(verdict.leak_classes)})" if verdict.leak_classes else ""
    assert caught, f"expected one of {sorted(verdict.kinds)}{classes}, got: {described(findings)}"
    wrong = [finding for finding in findings if finding["kind"] in verdict.forbidden]
    assert not wrong, described(wrong)


@pytest.mark.parametrize("verdict", [verdict.param() for verdict in HEALTHY])
def test_a_healthy_scenario_raises_no_warning_with_default_flags(
    verdict: Verdict, tmp_path: Path
) -> None:
    findings = loud(run_scenario(verdict, tmp_path))
    assert not findings, described(findings)
