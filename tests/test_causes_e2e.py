"""Real TensorFlow jobs under ``driftwatch run`` (default flags) that slow down for a known
reason: the slowdown finding names that reason as its top cause, with its numbers.

Judged on step times: plain ``tf`` tests, never ``paired``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from driftwatch.detect.causes.scores import TRACES_STEP
from driftwatch.series import SERIES
from tests.conftest import REPO
from tests.jobs import FinishedRun, run_job

pytestmark = pytest.mark.tf

SLOWDOWNS = frozenset({"abrupt_slowdown", "gradual_slowdown"})
PROGRAMS = REPO / "tests" / "data" / "programs"


def top_cause(findings: list[dict[str, Any]]) -> dict[str, Any]:
    """The top cause of the run's slowdown finding (the last reported)."""
    slow = [f for f in findings if f["kind"] in SLOWDOWNS]
    described = "; ".join(f"{f['kind']}: {f['evidence']}" for f in findings)
    assert slow, f"no slowdown reported: {described}"
    causes = slow[-1]["evidence"].get("causes")
    assert causes, f"the slowdown names no cause: {slow[-1]['message']}"
    return dict(causes[0])


def test_a_cpu_hog_started_beside_a_real_keras_job_is_named_host_contention(
    keras_job_slowed_by_a_cpu_hog: FinishedRun,
) -> None:
    # Expected: a 1-thread Keras job on a 2-core VM; after 20 s of steps, 3 busy processes
    # start beside it: the job gets about half a core (steps ~2x slower), the node's CPU
    # pressure goes from its background (0.1-0.3 s/s on a quiet VM) to near 1 s/s:
    # host_cpu_contention scores (0.9 - 0.3) / 0.1 = 6, plus the fall of the job's CPU time
    # (half: 2), above every other cause. On a saturated node (pressure near 1 s/s before),
    # the fall of the job's CPU time alone: 0.5 / 0.25 = 2 (at load 13: 0.99 -> 1.00
    # s/s, 0.34 -> 0.19 cores, score 1.9 then 2.4; steps 1.2 -> 4.0 ms, 3.4x).
    # Judged on the run's report (its causes ranked again over all of the run at its end):
    # the findings file holds the finding as first told, ranked a few seconds after an
    # onset that a short-step run's block levels may date up to 4 s before the hog, so
    # its window can be half unhogged (the node's pressure there as low as 0.13 s/s, where
    # the report, ranked over the whole run, reads about 0.6).
    result = keras_job_slowed_by_a_cpu_hog.cli("report", "--json")
    assert result.returncode == 0, result.stderr
    top = top_cause(json.loads(result.stdout)["findings"])
    assert top["cause"] == "host_cpu_contention", top
    numbers = top["numbers"]
    assert numbers["cpu_pressure_share_after"] > 0.5
    assert numbers["target_cpu_cores_after"] < 0.8 * numbers["target_cpu_cores_before"]


def test_a_real_keras_callback_whose_cost_grows_is_named_host_time(tmp_path: Path) -> None:
    # Expected: a Keras fit of 0.8-0.9-ms steps, about 1 % of each outside the train step;
    # 20 s on (5 warm-up and 10 baseline blocks of about a second, and some to spare), the
    # callback starts keeping every batch's logs and rebuilding them all as JSON each batch:
    # steps 3x slower within 2 s, 6-8x by the end 10 s later. Told live, about 4 s after
    # the change: a slowdown of 1.5-3.9x when first stated (abrupt: the level triples within
    # the 5 blocks that tell a step from a ramp; or gradual, then stepping up; a long job's
    # hours-long climb would be gradual), whose top cause is callbacks and host work. Its
    # numbers when first stated are read since the onset, 2-4 blocks into the climb: the
    # share of each step outside the train step from about 1 % to 30-62 % (scores 2.9-6.1);
    # the report's, ranked again 10 s later where the run lasted that long, 65-79 % (6.1-6.9).
    # Contention: 0-3 on this shared 2-core VM, from other jobs; on top once in 25 runs (the
    # job's CPU 0.78 -> 0.38 cores, the node's pressure 0.63 -> 0.87 s/s). The bundled
    # growing_callback.py slows from its first step, mostly inside that warm-up and
    # baseline: its live reports sat at the first chunk's 1.4x bar, or came at its end
    # (docs/slowdowns.md, "Known misses").
    program = PROGRAMS / "callback_grows_after_warmup.py"
    run = run_job(program, tmp_path, "--warmup", "20", "--seconds", "10")
    findings = run.findings
    live = [f for f in findings if f["kind"] in SLOWDOWNS and "judged_at_end" not in f["evidence"]]
    assert live, f"not reported live: {[(f['kind'], f['evidence']) for f in findings]}"
    assert top_cause(findings)["cause"] == "host_time", top_cause(findings)
    result = run.cli("report", "--json")
    assert result.returncode == 0, result.stderr
    reported = [f for f in json.loads(result.stdout)["findings"] if f["kind"] in SLOWDOWNS]
    top = top_cause(sorted(reported, key=lambda f: float(f["since"])))
    assert top["cause"] == "host_time", top
    numbers = top["numbers"]
    assert numbers["outside_step_share_after"] > numbers["outside_step_share_before"] + 0.2


@pytest.mark.timeout(600)
def test_retracing_that_starts_after_a_warmup_is_named_retracing(tmp_path: Path) -> None:
    # Expected: 25 s at one learning rate (one trace), then a new Python float every step:
    # a trace per step (score (1 - 0) / 0.01 = 100), steps from about a millisecond to
    # 20-300 ms (a trace; the more the busier the machine). A slowdown is judged on blocks
    # of 100 steps: 15 of the fast ones to set a baseline (warm-up included), 4 slow ones
    # to report it live: the job ends after 500 slow steps (15 s on a quiet machine, over
    # 2 minutes at load 15: 270 ms a trace), 3 full blocks or more wherever in a block the
    # first falls, and the run's last steps, which close its last block at its end (without
    # them a run can end with 3 full blocks and 96 steps, and no slowdown at all;
    # docs/slowdowns.md, "Blocks").
    # First stated while the blocks still mix fast steps and traced ones (as low as 1.6x,
    # 0.5 -> 0.9 ms), its traces per step then read on the onset's first seconds (as low as
    # 0.03-0.05: the probe reads the tracing count every 100 steps or 10 s). The report's,
    # ranked again at the run's end over all of it: 0.88-1.06 where the onset is dated at
    # the first trace; about 0.1 where it is dated a second or two early and the untraced
    # steps, at about 2,000 a second, outnumber the 500 traced ones; as low as 0.03 where a
    # 1.6x slowdown from the host's load comes 10 s before the first trace and the traced
    # steps' 2.1x joins that finding (its onset kept; a rise under RESTEP_BAR is no new
    # step). Asked: the rise the ranker names a cause from
    # (TRACES_STEP, a score of 1), against under 1 in 100 before; the ranker's own numbers
    # are judged in tests/test_causes.py.
    args = ("--why", "retracing", "--warmup", "25", "--slow-steps", "500")
    run = run_job(PROGRAMS / "slows_after_warmup.py", tmp_path, *args)
    assert top_cause(run.findings)["cause"] == "retracing", top_cause(run.findings)
    result = run.cli("report", "--json")
    assert result.returncode == 0, result.stderr
    reported = [f for f in json.loads(result.stdout)["findings"] if f["kind"] in SLOWDOWNS]
    top = top_cause(sorted(reported, key=lambda f: float(f["since"])))
    assert top["cause"] == "retracing", top
    assert top["numbers"]["traces_per_step_before"] < 0.01
    assert top["numbers"]["traces_per_step_after"] >= TRACES_STEP


def test_a_slow_tf_data_map_in_a_custom_loop_is_named_input_wait(tmp_path: Path) -> None:
    # Expected: after 15 s the map sleeps 20 ms a batch, the train step stays ~1 ms: the
    # loop waits for input most of each step. With the hook's input-wait share that is
    # input_wait; without it (a build whose series lack input_wait_share), the wait is time
    # outside the train step: host_time, its share from a few % to most of the step.
    args = ("--why", "input", "--warmup", "15", "--slow-steps", "800")
    findings = run_job(PROGRAMS / "slows_after_warmup.py", tmp_path, *args).findings
    top = top_cause(findings)
    expected = "input_wait" if "input_wait_share" in SERIES else "host_time"
    assert top["cause"] == expected, top
    share = "input_wait_share" if expected == "input_wait" else "outside_step_share"
    assert top["numbers"][f"{share}_after"] > top["numbers"][f"{share}_before"] + 0.3
