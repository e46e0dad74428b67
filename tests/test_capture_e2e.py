"""A real Keras job that slows down (a CPU hog beside it), under ``driftwatch run`` with its
default flags: the slowdown's finding captures a real py-spy dump and a real TensorFlow
Profiler trace (on the CPU), beside a reference trace taken after warm-up, and ``driftwatch
report`` lists them. The job is shared with tests/test_causes_e2e.py, which judges its cause."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from driftwatch.capture.store import REFERENCE
from tests.conftest import TF_ENV
from tests.jobs import FinishedRun

SLOWDOWNS = {"abrupt_slowdown", "gradual_slowdown"}


@pytest.mark.tf
def test_a_slowing_job_leaves_a_stack_dump_and_a_profiler_trace_that_the_report_lists(
    keras_job_slowed_by_a_cpu_hog: FinishedRun, tmp_path: Path
) -> None:
    # Expected: a reference trace once the hook has counted 200 steps and 10 s; when the
    # hog's slowdown is reported (within seconds of its start), a py-spy dump of the job's
    # threads and a trace of a few steps, named in the finding; all listed by the report.
    run = keras_job_slowed_by_a_cpu_hog
    result = run.cli("report", "--json")
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
    xplanes = []
    for trace in traces.values():
        assert trace.parent == logdir / "plugins" / "profile"  # TensorBoard's profile plugin
        (xplane,) = trace.glob("*.xplane.pb")
        assert xplane.stat().st_size > 0
        xplanes.append(str(xplane))
    # Every trace parsed by TensorFlow's own protobuf, in one process: one import of it.
    parsed = subprocess.run(
        [
            sys.executable,
            "-c",
            "import sys\n"
            "from tensorflow.tsl.profiler.protobuf import xplane_pb2\n"
            "for path in sys.argv[1:]:\n"
            "    space = xplane_pb2.XSpace.FromString(open(path, 'rb').read())\n"
            "    print('planes', len(space.planes))",
            *xplanes,
        ],
        capture_output=True,
        text=True,
        env={**os.environ, **TF_ENV},
        check=True,
    )
    planes = [
        int(line.split()[1]) for line in parsed.stdout.splitlines() if line.startswith("planes ")
    ]
    assert len(planes) == len(xplanes), parsed.stdout
    assert min(planes) > 0, parsed.stdout  # the host plane, at least
    # The finding names its captures in its evidence.
    slowdown = next(f for f in report["findings"] if f["kind"] in SLOWDOWNS)
    assert slowdown["evidence"]["capture_stack"] == stack["path"]
    assert slowdown["evidence"]["capture_logdir"] == str(logdir)
    assert slowdown["evidence"]["capture_reference"] == str(traces[REFERENCE])

    text = run.cli("report").stdout
    assert "captures:" in text
    assert f"traces: tensorboard --logdir {logdir}" in text
    assert stack["path"] in text
    html = tmp_path / "report.html"
    assert run.cli("report", "--html", str(html)).returncode == 0
    assert "<h2>Captures</h2>" in html.read_text()
