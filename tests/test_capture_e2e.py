"""A real Keras job that slows down, under ``driftwatch run`` with its default flags: the
slowdown's finding captures a real py-spy dump and a real TensorFlow Profiler trace (on the
CPU), beside a reference trace taken after warm-up, and ``driftwatch report`` lists them."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import psutil
import pytest

from driftwatch.capture.store import REFERENCE, Capture, list_captures
from tests.conftest import EXAMPLES, REPO, TF_ENV, run_cli, wait_for

SLOWDOWNS = {"abrupt_slowdown", "gradual_slowdown"}


def captures_of(data_home: Path) -> list[Capture]:
    root = data_home / "driftwatch" / "history.captures"
    runs = sorted(root.iterdir()) if root.is_dir() else []
    return [c for run in runs for c in list_captures(run)]


def has_slowdown_evidence(data_home: Path) -> bool:
    found = {(c.what, c.label in SLOWDOWNS) for c in captures_of(data_home)}
    return {("stack", True), ("trace", True)} <= found


@pytest.mark.tf
@pytest.mark.timeout(420)
def test_a_slowing_job_leaves_a_stack_dump_and_a_profiler_trace_that_the_report_lists(
    tmp_path: Path,
) -> None:
    data_home = Path(os.environ["XDG_DATA_HOME"])  # this test's own (conftest)
    script = [str(EXAMPLES / "train_keras.py"), "--logdir", str(tmp_path / "logs")]
    # 20,000 steps of baseline (20 s on a quiet machine, a few minutes on a busy one), then
    # each step 10 ms slower.
    job = [*script, "--epochs", "10000", "--slow-from-step", "20000", "--slow-seconds", "0.01"]
    run = subprocess.Popen(
        [sys.executable, "-m", "driftwatch", "run", "--", sys.executable, *job, "--seconds", "360"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, **TF_ENV, "PYTHONPATH": str(REPO)},
    )
    try:
        wait_for(lambda: has_slowdown_evidence(data_home), 360, "the slowdown's captures", 1.0)
    finally:
        for job_process in psutil.Process(run.pid).children():
            job_process.terminate()  # the job ends; driftwatch reads the rest and sums up
        _, stderr = run.communicate(timeout=60)
    assert "Traceback" not in stderr, stderr

    result = run_cli("report", "--json")
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    captures = report["captures"]
    stack = next(c for c in captures if c["what"] == "stack" and c["label"] in SLOWDOWNS)
    dump = Path(stack["path"]).read_text()
    assert dump.startswith(f"Process {report['run']['pid']}:"), dump
    assert "Thread" in dump
    assert "train_keras.py" in dump  # the job's own frames, named
    logdir = Path(report["capture_logdir"])
    traces = {c["label"]: Path(c["path"]) for c in captures if c["what"] == "trace"}
    assert REFERENCE in traces, captures  # taken early, to compare with
    assert traces.keys() & SLOWDOWNS, captures
    for trace in traces.values():
        assert trace.parent == logdir / "plugins" / "profile"  # TensorBoard's profile plugin
        (xplane,) = trace.glob("*.xplane.pb")
        assert xplane.stat().st_size > 0
        parsed = subprocess.run(
            [
                sys.executable,
                "-c",
                "import sys\n"
                "from tensorflow.tsl.profiler.protobuf import xplane_pb2\n"
                "space = xplane_pb2.XSpace.FromString(open(sys.argv[1], 'rb').read())\n"
                "print(len(space.planes))",
                str(xplane),
            ],
            capture_output=True,
            text=True,
            env={**os.environ, **TF_ENV},
            check=True,
        )
        assert int(parsed.stdout.split()[-1]) > 0, parsed.stdout  # the host plane, at least
    # The finding names its captures in its evidence.
    slowdown = next(f for f in report["findings"] if f["kind"] in SLOWDOWNS)
    assert slowdown["evidence"]["capture_stack"] == stack["path"]
    assert slowdown["evidence"]["capture_logdir"] == str(logdir)
    assert slowdown["evidence"]["capture_reference"] == str(traces[REFERENCE])

    text = run_cli("report").stdout
    assert "captures:" in text
    assert f"traces: tensorboard --logdir {logdir}" in text
    assert stack["path"] in text
    html = tmp_path / "report.html"
    assert run_cli("report", "--html", str(html)).returncode == 0
    assert "<h2>Captures</h2>" in html.read_text()
