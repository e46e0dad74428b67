"""Evidence captured at drift: rate limits, size caps, py-spy missing or refused, and the
request path from the monitor to the hook (real py-spy, real processes, real files)."""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from driftwatch.capture.capturer import (
    KIND_AGAIN_SECONDS,
    MIN_GAP_SECONDS,
    STACK_ERROR_KEY,
    STACK_KEY,
    Capturer,
)
from driftwatch.capture.descriptors import describe_descriptors, descriptor_group
from driftwatch.capture.stack import INSTALL_HINT, dump_stacks
from driftwatch.capture.store import (
    REFERENCE,
    capture_name,
    enforce_caps,
    list_captures,
    run_dir,
    stack_path,
    trace_path,
)
from driftwatch.channel.paths import channel_path, remove_channel, request_path, traces_dir
from driftwatch.channel.requests import RequestWatch, TraceRequest, write_request
from driftwatch.channel.wire import CaptureStatus
from driftwatch.errors import CaptureUnavailable, TargetAccessDenied
from driftwatch.findings import Finding, Severity
from driftwatch.history.reader import HistoryReader
from driftwatch.hook.trace import MULTI_WORKER_REFUSAL, TRACE_FIRST_STEP, TRACE_MAX_STEPS
from driftwatch.runtime.store import Store
from driftwatch.sources.hook import HookSource
from driftwatch.target.access import access_hint, privileges
from tests import synthetic_run
from tests.conftest import REPO, TF_ENV, run_cli


@pytest.fixture
def python_child() -> Iterator[subprocess.Popen[bytes]]:
    """A real Python process, busy in a function py-spy will name."""
    code = "import time\ndef waiting_for_the_dump():\n    while True: time.sleep(0.05)\n"
    child = subprocess.Popen([sys.executable, "-c", code + "waiting_for_the_dump()"])
    time.sleep(0.3)  # past the interpreter's start-up
    yield child
    child.kill()
    child.wait()


def finding(kind: str, severity: Severity = Severity.WARNING) -> Finding:
    return Finding(kind, severity, 0.0, f"{kind} happened", {"ratio": 1.5, "cause": "input"})


def test_a_slowdown_finding_dumps_the_stacks_and_names_the_file_in_its_evidence(
    tmp_path: Path, python_child: subprocess.Popen[bytes]
) -> None:
    capturer = Capturer(tmp_path / "run", python_child.pid, None)
    capturer.annotate(1000.0, [finding("abrupt_slowdown")], Store())
    capturer.close(None, "")  # type: ignore[arg-type]  # waits for the dump
    annotated = capturer.annotate(1001.0, [finding("abrupt_slowdown")], Store())
    stack = Path(str(annotated[0].evidence[STACK_KEY]))
    assert stack == stack_path(tmp_path / "run", "abrupt_slowdown", 1000.0)
    assert "waiting_for_the_dump" in stack.read_text()
    assert annotated[0].evidence["ratio"] == 1.5  # the detector's own evidence is kept
    # The path is not news: the finding is announced once, with or without it.
    assert annotated[0].diagnosis == finding("abrupt_slowdown").diagnosis
    (listed,) = list_captures(tmp_path / "run")
    assert (listed.what, listed.label, listed.t) == ("stack", "abrupt_slowdown", 1000.0)
    assert listed.bytes == stack.stat().st_size > 0


def test_captures_are_rate_limited_per_run_and_per_kind(
    tmp_path: Path, python_child: subprocess.Popen[bytes]
) -> None:
    dumps: list[float] = []

    def dump(pid: int) -> str:
        dumps.append(time.time())
        return dump_stacks(pid)

    capturer = Capturer(tmp_path / "run", python_child.pid, None, dump)
    store = Store()
    slow, leak = finding("abrupt_slowdown"), finding("host_memory_drift")
    t = 1000.0
    capturer.annotate(t, [slow], store)
    capturer.close(None, "")  # type: ignore[arg-type]  # the dump written: now it is named
    # Within the run's gap: nothing new, even for another kind; the first keeps its fields.
    again = capturer.annotate(t + MIN_GAP_SECONDS - 1, [slow, leak], store)
    assert STACK_KEY in again[0].evidence
    assert STACK_KEY not in again[1].evidence
    # After the gap: the new kind is captured, the one captured already is not.
    capturer.annotate(t + MIN_GAP_SECONDS, [slow, leak], store)
    # Info findings, and kinds that are not slowdowns, stalls or leaks, capture nothing.
    later = t + KIND_AGAIN_SECONDS - 1
    capturer.annotate(
        later, [finding("periodic_stall", Severity.INFO), finding("nonfinite")], store
    )
    # A kind that keeps holding is captured again after KIND_AGAIN_SECONDS.
    capturer.annotate(t + KIND_AGAIN_SECONDS, [slow], store)
    capturer.close(None, "")  # type: ignore[arg-type]
    names = sorted((c.label, c.t) for c in list_captures(tmp_path / "run"))
    assert names == [
        ("abrupt_slowdown", t),
        ("abrupt_slowdown", t + KIND_AGAIN_SECONDS),
        ("host_memory_drift", t + MIN_GAP_SECONDS),
    ]
    assert len(dumps) == 3


def write_capture(path: Path, size: int) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.suffix == ".txt":
        path.write_bytes(b"x" * size)
    else:
        path.mkdir()
        (path / "host.xplane.pb").write_bytes(b"x" * size)


def test_a_run_over_its_cap_drops_its_oldest_captures_and_the_reference_last(
    tmp_path: Path,
) -> None:
    run = tmp_path / "history.captures" / "host-1-100"
    write_capture(trace_path(run, REFERENCE, 100.0), 400)
    write_capture(stack_path(run, "abrupt_slowdown", 200.0), 300)
    write_capture(trace_path(run, "abrupt_slowdown", 200.0), 300)
    write_capture(stack_path(run, "stalled", 300.0), 300)
    dropped = enforce_caps(run, run_cap=900, total_cap=10**9)
    name = capture_name("abrupt_slowdown", 200.0)
    assert sorted(p.name for p in dropped) == [name, f"stack-{name}.txt"]
    assert [(c.label, c.what) for c in list_captures(run)] == [
        (REFERENCE, "trace"),
        ("stalled", "stack"),
    ]
    # The reference goes after every other capture, whatever its age.
    enforce_caps(run, run_cap=450, total_cap=10**9)
    assert [c.label for c in list_captures(run)] == [REFERENCE]


def test_captures_over_the_total_cap_drop_the_least_recent_other_runs(tmp_path: Path) -> None:
    root = tmp_path / "history.captures"
    runs = [root / f"host-{n}-100" for n in range(3)]
    for age, run in enumerate(runs):
        write_capture(stack_path(run, "stalled", 100.0), 1000)
        os.utime(run, (1000.0 * age + 1, 1000.0 * age + 1))  # runs[0] the least recent
    dropped = enforce_caps(runs[1], total_cap=2500)
    assert dropped == [runs[0]]
    assert not runs[0].exists()
    assert runs[1].exists()
    assert runs[2].exists()


def test_a_stopped_process_has_its_stacks_dumped_as_it_is(
    python_child: subprocess.Popen[bytes],
) -> None:
    # py-spy's default stops the target while it reads it, and fails on one stopped already
    # ("Failed to get stack traces"): a rank stopped with SIGSTOP is read as it stands.
    python_child.send_signal(signal.SIGSTOP)
    try:
        deadline = time.monotonic() + 10
        while psutil.Process(python_child.pid).status() != psutil.STATUS_STOPPED:
            assert time.monotonic() < deadline, "SIGSTOP did not stop the child"
            time.sleep(0.01)
        assert "waiting_for_the_dump" in dump_stacks(python_child.pid)
        assert psutil.Process(python_child.pid).status() == psutil.STATUS_STOPPED
    finally:
        python_child.send_signal(signal.SIGCONT)


def test_missing_py_spy_is_one_clear_message_and_monitoring_goes_on(
    tmp_path: Path,
    python_child: subprocess.Popen[bytes],
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    monkeypatch.setattr(sys, "executable", str(tmp_path / "python"))  # no py-spy beside it
    with pytest.raises(CaptureUnavailable, match="py-spy is not installed") as raised:
        dump_stacks(python_child.pid)
    assert INSTALL_HINT in str(raised.value)
    capturer = Capturer(tmp_path / "run", python_child.pid, None)
    with caplog.at_level(logging.WARNING):
        first = capturer.annotate(1000.0, [finding("stalled")], Store())
        capturer.close(None, "")  # type: ignore[arg-type]
        capturer.annotate(1000.0 + KIND_AGAIN_SECONDS, [finding("stalled")], Store())
        capturer.close(None, "")  # type: ignore[arg-type]
    assert [r.getMessage() for r in caplog.records] == [str(raised.value)]  # once
    later = capturer.annotate(1000.0 + KIND_AGAIN_SECONDS + 1, [finding("stalled")], Store())
    assert STACK_KEY not in first[0].evidence
    assert STACK_KEY not in later[0].evidence  # a failed dump is not named...
    assert later[0].evidence[STACK_ERROR_KEY] == str(raised.value)  # ...its reason is
    assert list_captures(tmp_path / "run") == []


def test_a_finding_names_its_stack_dump_only_once_the_file_exists(
    tmp_path: Path, python_child: subprocess.Popen[bytes]
) -> None:
    # Expected: while py-spy is still reading, the finding names no file (a finding recorded
    # then would point at nothing); once the dump is written, the next tick names it.
    release = threading.Event()

    def slow_dump(pid: int) -> str:
        release.wait(10)
        return dump_stacks(pid)

    capturer = Capturer(tmp_path / "run", python_child.pid, None, slow_dump)
    during = capturer.annotate(1000.0, [finding("stalled")], Store())
    assert not any(key.startswith("capture_") for key in during[0].evidence)
    release.set()
    capturer.close(None, "")  # type: ignore[arg-type]
    after = capturer.annotate(1001.0, [finding("stalled")], Store())
    assert "waiting_for_the_dump" in Path(str(after[0].evidence[STACK_KEY])).read_text()


def test_py_spy_refused_permission_gives_the_hint_attach_gives(
    tmp_path: Path, python_child: subprocess.Popen[bytes], monkeypatch: pytest.MonkeyPatch
) -> None:
    # Root may ptrace anything: py-spy's refusal is played by a script with its exit and words.
    fake = tmp_path / "bin" / "py-spy"
    fake.parent.mkdir()
    fake.write_text(
        "#!/bin/sh\necho 'Error: Permission Denied: Try running again with elevated "
        'permissions by going sudo env "PATH=$PATH" !!\' >&2\nexit 1\n'
    )
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", str(fake.parent))
    with pytest.raises(TargetAccessDenied) as raised:
        dump_stacks(python_child.pid)
    message = str(raised.value)
    hint = access_hint(privileges(python_child.pid), attaching=True)
    assert message == (
        f"permission denied reading the Python stacks (py-spy) of process {python_child.pid}: "
        f"{hint}"
    )


def test_a_failing_py_spy_is_named_with_its_first_line(
    tmp_path: Path, python_child: subprocess.Popen[bytes]
) -> None:
    fake = tmp_path / "py-spy"
    fake.write_text("#!/bin/sh\necho 'Error: something odd' >&2\necho 'more' >&2\nexit 3\n")
    fake.chmod(0o755)
    with pytest.raises(CaptureUnavailable, match=r"py-spy said: Error: something odd$"):
        dump_stacks(python_child.pid, str(fake))


def test_the_hook_answers_a_request_at_a_probe_once_warm_up_is_over(tmp_path: Path) -> None:
    """Without TensorFlow the hook cannot trace: its answer says so. The request is seen only
    at probes, never before ``TRACE_FIRST_STEP``, and each id is answered once."""
    code = (
        "import sys, time\n"
        "sys.modules['tensorflow'] = None  # this job never loaded TensorFlow\n"
        "from driftwatch.hook.core import Hook\n"
        f"hook = Hook(channel_dir={str(tmp_path)!r}, probe_every_steps=10,"
        " probe_every_seconds=1e9)\n"
        "for step in range(1, 200):\n"
        "    hook.step_started(step * 0.01)\n"
        "    hook.step_ended(step * 0.01)\n"
        "    if step in (50, 95, 150):\n"
        "        print(step, flush=True)\n"
        "        sys.stdin.readline()\n"
    )
    job = subprocess.Popen(
        [sys.executable, "-c", code],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    assert job.stdin is not None
    assert job.stdout is not None
    assert job.stdout.readline() == "50\n"
    path = channel_path(tmp_path, job.pid, psutil.Process(job.pid).create_time())
    write_request(path, TraceRequest(7, 5, "abrupt_slowdown"))
    source = HookSource(path)
    job.stdin.write("\n")
    job.stdin.flush()
    assert job.stdout.readline() == "95\n"  # seen at the probes of steps 60 to 90: waiting
    source.sample(time.time())
    assert source.take_answers() == []
    job.stdin.write("\n")
    job.stdin.flush()
    assert job.stdout.readline() == "150\n"  # past warm-up and a probe
    source.sample(time.time())
    (answer,) = source.take_answers()
    assert (answer.id, answer.status, answer.error) == (
        7,
        CaptureStatus.FAILED,
        "TensorFlow is not loaded",
    )
    job.stdin.write("\n")
    job.stdin.flush()
    job.wait(timeout=30)
    source.sample(time.time())
    assert source.take_answers() == []  # answered once
    source.close()
    remove_channel(path)
    assert not request_path(path).exists()
    assert not traces_dir(path).exists()


def test_a_request_is_read_once_per_change_and_a_malformed_one_is_ignored(tmp_path: Path) -> None:
    channel = tmp_path / "1-2.dwc"
    watch = RequestWatch(channel)
    assert watch.poll() is None  # none yet
    write_request(channel, TraceRequest(3, 5, "reference"))
    assert watch.poll() == TraceRequest(3, 5, "reference")
    assert watch.poll() is None  # the same file: not read again
    write_request(channel, TraceRequest(2, 5, "stalled"))
    assert watch.poll() is None  # an older id: ignored
    request_path(channel).write_text('{"id": "x"}')
    assert watch.poll() is None
    assert oct(os.stat(request_path(channel)).st_mode & 0o777) == "0o644"


HOOK_WITH_TENSORFLOW = """
import sys, time
import tensorflow as tf
from driftwatch.hook.core import Hook

hook = Hook(channel_dir=sys.argv[1], probe_every_steps=10, probe_every_seconds=1e9)
variable = tf.Variable(1.0)

@tf.function
def train_step():
    variable.assign_add(1.0)
    return variable.read_value()

step = 0
for line in sys.stdin:  # each line: how many steps to run, then say the step reached
    for _ in range(int(line)):
        step += 1
        hook.step_started(time.perf_counter())
        train_step()
        hook.step_ended(time.perf_counter())
    print(hook.global_step, flush=True)
hook.close()
"""


@pytest.mark.tf
@pytest.mark.paired
def test_a_worker_of_a_multi_worker_job_answers_a_trace_request_without_starting_the_profiler(
    tmp_path: Path,
) -> None:
    # Stopping the profiler in a MultiWorkerMirroredStrategy worker aborted it natively
    # (SIGSEGV or SIGABRT inside profiler.experimental.stop) in 4 of 18 healthy 2-worker
    # runs: a worker refuses every trace, and says why.
    cluster = {"worker": ["127.0.0.1:1", "127.0.0.1:2"]}
    tf_config = json.dumps({"cluster": cluster, "task": {"type": "worker", "index": 1}})
    job = subprocess.Popen(
        [sys.executable, "-c", HOOK_WITH_TENSORFLOW, str(tmp_path)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, **TF_ENV, "PYTHONPATH": str(REPO), "TF_CONFIG": tf_config},
    )
    assert job.stdin is not None
    assert job.stdout is not None
    try:
        job.stdin.write(f"{TRACE_FIRST_STEP}\n")
        job.stdin.flush()
        job.stdout.readline()
        path = channel_path(tmp_path, job.pid, psutil.Process(job.pid).create_time())
        source = HookSource(path)
        write_request(path, TraceRequest(1, 5, "reference"))
        job.stdin.write("20\n")
        job.stdin.flush()
        job.stdout.readline()
        source.sample(time.time())
        (answer,) = source.take_answers()
        assert (answer.id, answer.status, answer.error) == (
            1,
            CaptureStatus.FAILED,
            MULTI_WORKER_REFUSAL,
        )
        assert not (traces_dir(path) / "1").exists()
        job.stdin.close()
        assert job.wait(timeout=60) == 0
        source.close()
    finally:
        if job.poll() is None:
            job.kill()
            job.wait()


@pytest.mark.tf
@pytest.mark.paired
def test_the_hook_traces_at_most_its_step_limit_and_defers_a_request_within_its_gap(
    tmp_path: Path,
) -> None:
    job = subprocess.Popen(
        [sys.executable, "-c", HOOK_WITH_TENSORFLOW, str(tmp_path)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, **TF_ENV, "PYTHONPATH": str(REPO)},
    )
    assert job.stdin is not None
    assert job.stdout is not None

    def steps(count: int) -> None:
        assert job.stdin is not None
        assert job.stdout is not None
        job.stdin.write(f"{count}\n")
        job.stdin.flush()
        job.stdout.readline()

    try:
        steps(TRACE_FIRST_STEP)  # warm-up over
        path = channel_path(tmp_path, job.pid, psutil.Process(job.pid).create_time())
        source = HookSource(path)
        write_request(path, TraceRequest(1, 1000, "reference"))  # asks for far too many
        steps(100)
        source.sample(time.time())
        answers = source.take_answers()
        assert [(a.id, a.status, a.steps) for a in answers] == [
            (1, CaptureStatus.STARTED, 0),
            (1, CaptureStatus.DONE, TRACE_MAX_STEPS),
        ]
        (xplane,) = (traces_dir(path) / "1" / "plugins" / "profile").glob("*/*.xplane.pb")
        assert xplane.stat().st_size > 0
        write_request(path, TraceRequest(2, 5, "stalled"))
        steps(100)  # ten probes, well within TRACE_MIN_GAP_SECONDS of the first trace
        source.sample(time.time())
        assert source.take_answers() == []  # waiting, not refused
        job.stdin.close()  # the job ends; its last probe stops nothing, starts nothing
        assert job.wait(timeout=60) == 0
        source.sample(time.time())
        assert source.take_answers() == []
        source.close()
    finally:
        job.kill()
        job.wait()


def test_the_report_lists_a_runs_captures_in_text_json_and_html(tmp_path: Path) -> None:
    db = tmp_path / "history.db"
    synthetic_run.record(db)
    reader = HistoryReader(db)
    run = reader.run(None)
    reader.close()
    directory = run_dir(db, run.host, run.pid, run.create_time)
    stack = stack_path(directory, "abrupt_slowdown", run.first_seen + 60)
    write_capture(stack, 2048)
    reference = trace_path(directory, REFERENCE, run.first_seen + 30)
    write_capture(reference, 4096)
    logdir = directory / "profile"

    text = run_cli("report", "--db", str(db))
    assert text.returncode == 0, text.stderr
    assert "  stack (abrupt_slowdown) at " in text.stdout
    assert f"2.0 KiB: {stack}" in text.stdout
    assert "  trace (reference) at " in text.stdout
    assert f"  traces: tensorboard --logdir {logdir}" in text.stdout
    document = json.loads(run_cli("report", "--db", str(db), "--json").stdout)
    assert document["capture_logdir"] == str(logdir)
    assert [(c["what"], c["label"], c["path"], c["bytes"]) for c in document["captures"]] == [
        ("trace", REFERENCE, str(reference), 4096),
        ("stack", "abrupt_slowdown", str(stack), 2048),
    ]
    html = tmp_path / "report.html"
    assert run_cli("report", "--db", str(db), "--html", str(html)).returncode == 0
    page = html.read_text()
    assert "<h2>Captures</h2>" in page
    assert str(stack) in page
    assert f"tensorboard --logdir {logdir}" in page


def test_a_run_without_captures_reports_none(tmp_path: Path) -> None:
    db = tmp_path / "history.db"
    synthetic_run.record(db)
    assert "captures:" not in run_cli("report", "--db", str(db)).stdout
    document = json.loads(run_cli("report", "--db", str(db), "--json").stdout)
    assert document["captures"] == []


def test_a_finding_made_after_the_job_exited_captures_nothing_and_says_nothing(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    exited = subprocess.Popen([sys.executable, "-c", "pass"])
    exited.wait()
    capturer = Capturer(tmp_path / "run", exited.pid, None)
    with caplog.at_level(logging.INFO):
        annotated = capturer.annotate(1000.0, [finding("gradual_slowdown")], Store())
        capturer.close(None, "")  # type: ignore[arg-type]
    assert annotated == [finding("gradual_slowdown")]
    assert caplog.records == []
    assert not (tmp_path / "run").exists()


def test_a_descriptor_leak_dumps_what_the_descriptors_point_to_grouped(
    tmp_path: Path, python_child: subprocess.Popen[bytes]
) -> None:
    # Expected: a child holding 40 log files batch-0.log .. batch-39.log open: the dump of an
    # fd_exhaustion finding begins with one group of 40 for them, the largest, then the
    # stacks; a dump that cannot have py-spy still lists the descriptors.
    logs = tmp_path / "logs"
    logs.mkdir()
    code = (
        "import sys, time\n"
        f"files = [open('{logs}/batch-%d.log' % i, 'w') for i in range(40)]\n"
        "print('open', flush=True)\n"
        "time.sleep(60)\n"
    )
    child = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout is not None
        assert child.stdout.readline() == "open\n"
        listing = describe_descriptors(child.pid)

        def no_py_spy(pid: int) -> str:
            raise CaptureUnavailable(f"no stack dump: py-spy is not installed ({INSTALL_HINT})")

        capturer = Capturer(tmp_path / "run", child.pid, None, no_py_spy)
        capturer.annotate(1000.0, [finding("fd_exhaustion")], Store())
        capturer.close(None, "")  # type: ignore[arg-type]  # waits for the dump
        annotated = capturer.annotate(1001.0, [finding("fd_exhaustion")], Store())
    finally:
        child.kill()
        child.wait()
    first_group = listing.splitlines()[1].split()
    assert first_group[:2] == ["40", f"{logs}/batch-*.log"]
    dumped = Path(str(annotated[0].evidence[STACK_KEY])).read_text()
    assert dumped.startswith(f"Open descriptors of process {child.pid}: ")
    assert f"{logs}/batch-*.log" in dumped
    assert INSTALL_HINT in dumped
    assert descriptor_group("socket:[81234]") == "socket:[*]"
