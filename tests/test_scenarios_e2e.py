"""Every program of the failure suite (scenarios/) gets the verdict written down for it in
scenarios/verdicts.toml, under ``driftwatch run`` with default flags: real TensorFlow jobs
that know nothing of driftwatch, the real monitor, real findings."""

from __future__ import annotations

import re
import tomllib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import UNTIMED_KINDS
from tests.jobs import SCENARIOS, Watched, run_scenario

pytestmark = pytest.mark.tf

LOUD = frozenset({"warning", "critical"})
"""Severities a verdict counts: a healthy run raises none, a failing one at least one."""


@dataclass(frozen=True)
class Verdict:
    name: str
    program: str
    kinds: frozenset[str]  # at least one of these at warning or critical; empty: healthy
    leak_classes: frozenset[str]  # the leak classes a host_memory_drift may name; empty: any
    forbidden: frozenset[str]  # none of these at warning or critical
    missed: str  # why driftwatch does not yet get it right; empty: it must
    alone: bool  # run with no job beside it, though judged on growth alone
    top_cause: str  # the cause a caught slowdown or stall must rank first; empty: any
    filesystem_mib: int  # its logdir is a tmpfs of this size, and its working directory; 0: no
    whole_job: bool  # judged with the whole job's others, under the daemon and attach

    def __str__(self) -> str:
        return self.name

    def param(self) -> Any:
        """The verdict as a test parameter: a known miss is a strict xfail, so the test says
        when driftwatch starts getting it right."""
        if self.missed:
            marks = [pytest.mark.xfail(strict=True, reason=self.missed)]
        elif self.kinds and self.kinds | self.forbidden <= UNTIMED_KINDS and not self.alone:
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
            table.get("alone", False),
            table.get("top_cause", ""),
            table.get("filesystem_mib", 0),
            table.get("whole_job", False),
        )
        for name, table in tables.items()
    ]


VERDICTS = load_verdicts()
UNDER_RUN = [verdict for verdict in VERDICTS if not verdict.whole_job]
"""Judged here, one program at a time under ``driftwatch run``; the whole job's programs are
judged together, under the daemon and attach, by tests/test_whole_job_e2e.py."""
FAILING = [verdict for verdict in UNDER_RUN if verdict.kinds]
HEALTHY = [verdict for verdict in UNDER_RUN if not verdict.kinds]


def judged(verdict: Verdict, run: Watched) -> list[dict[str, Any]]:
    """The findings of ``verdict``'s run, printed with what its program did."""
    said = [line for line in run.stdout.splitlines() if line.startswith("done ")]
    ended = "stopped once caught" if run.stopped else "no done line"
    print(f"{verdict}: {said[-1] if said else ended}")  # what the program did
    print(f"{verdict}: {described(run.findings) or 'no findings'}")
    return run.findings


def described(findings: list[dict[str, Any]]) -> str:
    return "; ".join(f"[{f['severity']}] {f['kind']}: {f['evidence']}" for f in findings)


def loud(findings: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [finding for finding in findings if finding["severity"] in LOUD]


def right(finding: dict[str, Any], verdict: Verdict) -> bool:
    """Whether ``finding`` is one ``verdict`` asks for: one of its kinds, ranking its cause
    first where it names one, and for a host-memory leak one of its leak classes where it
    names some, or an honest ``unknown`` (see ``cannot_tell``)."""
    if finding["kind"] not in verdict.kinds:
        return False
    if verdict.top_cause and top_cause(finding) != verdict.top_cause:
        return False
    if finding["kind"] != "host_memory_drift" or not verdict.leak_classes:
        return True
    return finding["evidence"].get("leak_class") in verdict.leak_classes or cannot_tell(finding)


def top_cause(finding: dict[str, Any]) -> str:
    """The cause ``finding`` ranks first; empty where it ranks none."""
    causes = finding["evidence"].get("causes") or [{}]
    return str(causes[0].get("cause", ""))


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
    # A verdict that forbids nothing holds once one right finding is loud: the job is
    # stopped then. One that forbids a kind is judged on the whole run.
    def caught_one(findings: list[dict[str, Any]]) -> bool:
        return any(right(finding, verdict) for finding in loud(findings))

    enough = None if verdict.forbidden else caught_one
    run = run_scenario(verdict.program, tmp_path, enough, verdict.filesystem_mib)
    findings = loud(judged(verdict, run))
    caught = [finding for finding in findings if right(finding, verdict)]
    classes = f" (a leak as {sorted(verdict.leak_classes)})" if verdict.leak_classes else ""
    assert caught, f"expected one of {sorted(verdict.kinds)}{classes}, got: {described(findings)}"
    wrong = [finding for finding in findings if finding["kind"] in verdict.forbidden]
    assert not wrong, described(wrong)


HOST_SLOWED = 1.3
"""A healthy program's own mean step, its last 5 s over its first, from which the host did
not run it steadily (its summary line's ``step_ms``)."""


RUNS_ON_A_SLOWED_HOST = 3
"""Runs of a healthy program, at most, until one whose own steps kept their pace."""


def host_voided(findings: list[dict[str, Any]], slowed: float) -> bool:
    """Whether a run's findings are all timed ones and the host slowed the program's own
    steps by ``slowed`` (its last 5 s over its first) enough to void them."""
    return (
        bool(findings)
        and all(f["kind"] not in UNTIMED_KINDS for f in findings)
        and (slowed >= HOST_SLOWED)
    )


def own_slowdown(stdout: str) -> float:
    """The program's own mean step, last 5 s over first, from its summary line's
    ``step_ms=A->Bms`` (1.0 where it printed none)."""
    found = re.search(r"step_ms=([\d.]+)->([\d.]+)ms", stdout)
    return float(found[2]) / float(found[1]) if found and float(found[1]) > 0 else 1.0


@pytest.mark.parametrize("verdict", [verdict.param() for verdict in HEALTHY])
def test_a_healthy_scenario_raises_no_warning_with_default_flags(
    verdict: Verdict, healthy_scenario: Callable[[str], Watched], tmp_path: Path
) -> None:
    # A healthy program does the same work every step, so a slowdown is told only where the
    # host ran it slower. Its premise is a steady host; a host that slowed the program's own
    # timing (a busy neighbour on the same physical core leaves no trace in this VM: a
    # measured 1.9 -> 3.0 ms at 100 % CPU) voids that run's timed verdict, and it runs again
    # from the start. A slowdown told of a run whose own steps kept their pace fails; one told
    # of every run the host slowed is what the program's own clock measured, true, and the
    # test has no healthy run to judge.
    if verdict.filesystem_mib:  # a run of its own, on its filesystem
        run = run_scenario(verdict.program, tmp_path, filesystem_mib=verdict.filesystem_mib)
    else:  # the run other tests judge too
        run = healthy_scenario(verdict.program)
    findings = loud(judged(verdict, run))
    slowed = [own_slowdown(run.stdout)]
    while host_voided(findings, slowed[-1]) and len(slowed) < RUNS_ON_A_SLOWED_HOST:
        print(f"{verdict.name}: its own steps {slowed[-1]:.2f}x slower at the end: run again")
        again = tmp_path / f"again{len(slowed)}"
        again.mkdir()
        run = run_scenario(verdict.program, again, None, verdict.filesystem_mib)
        findings = loud(judged(verdict, run))
        slowed.append(own_slowdown(run.stdout))
    if host_voided(findings, slowed[-1]):
        pytest.skip(f"the host slowed every run: own steps {slowed} times slower at the end")
    assert not findings, described(findings)
