"""``driftwatch run``: launching, injection, stderr pass-through, signals and exit codes."""

from __future__ import annotations

import os
import platform
import re
import signal
import subprocess
import sys
import urllib.request
from contextlib import suppress
from pathlib import Path

import psutil
import pytest
from prometheus_client.parser import text_string_to_metric_families

from driftwatch.capture.stack import dump_stacks
from driftwatch.channel.paths import list_channels
from driftwatch.history.reader import HistoryReader
from tests.conftest import EXAMPLES, TF_ENV, promtool_check_metrics, run_cli, wait_for

RETRACING_LINE = (
    "WARNING:tensorflow:5 out of the last 5 calls to <function step at 0x7f> triggered "
    "tf.function retracing. Tracing is expensive."
)


def start_run(*args: str, env: dict[str, str] | None = None) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "driftwatch",
            "run",
            "--interval",
            "0.2",
            "--listen",
            "127.0.0.1:0",
            *args,
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, **(env or {})},
        preexec_fn=as_from_a_terminal,
    )


def as_from_a_terminal() -> None:
    """Give driftwatch (and so its job) the default action for the signals a shell ignores
    in what it starts in the background or under nohup: a test run started that way (a CI
    script) must not make the job ignore the SIGINT driftwatch forwards to it."""
    for sig in (signal.SIGINT, signal.SIGQUIT, signal.SIGHUP):
        signal.signal(sig, signal.SIG_DFL)


def stop(process: subprocess.Popen[str]) -> str:
    """Kill driftwatch and its job (the job holds driftwatch's pipes open: killed alone,
    driftwatch's output never ends); what py-spy read of the job's stacks first."""
    stacks = []
    for child in psutil.Process(process.pid).children(recursive=True):
        with suppress(Exception):
            stacks.append(dump_stacks(child.pid))
        with suppress(psutil.NoSuchProcess):
            child.kill()
    process.kill()
    process.communicate()
    return "\n".join(stacks)


def metrics_url(process: subprocess.Popen[str], read: list[str] | None = None) -> str:
    """Read driftwatch's stderr up to the line that says where its metrics are; the lines
    read on the way (the job's own, when it writes first) go to ``read``."""
    assert process.stderr is not None
    for line in process.stderr:
        if read is not None:
            read.append(line)
        match = re.search(r"metrics at (http://\S+)", line)
        if match:
            return match.group(1)
    pytest.fail("driftwatch run never said where its metrics are")


def scrape(url: str) -> dict[str, float]:
    with urllib.request.urlopen(url, timeout=10) as response:
        text = response.read().decode()
    return {
        s.name + str(sorted(s.labels.items() - {("run", s.labels.get("run", ""))})): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def python_job(code: str) -> list[str]:
    return ["--", sys.executable, "-c", code]


def test_exit_code_and_stderr_pass_through() -> None:
    result = run_cli(
        "run",
        "--listen",
        "127.0.0.1:0",
        *python_job("import sys; sys.stderr.write('boom \\xe9\\n'); sys.exit(3)"),
    )
    assert result.returncode == 3
    assert "boom \xe9\n" in result.stderr
    assert "stopped: process" in result.stdout


def test_a_job_killed_by_a_signal_exits_128_plus_n() -> None:
    result = run_cli(
        "run", "--listen", "127.0.0.1:0", *python_job("import os; os.kill(os.getpid(), 9)")
    )
    assert result.returncode == 128 + signal.SIGKILL


@pytest.mark.parametrize(
    ("ending", "code", "said"),
    [
        ("sys.exit(3)", 3, "exited with status 3"),
        ("os.abort()", 128 + signal.SIGABRT, "was killed by SIGABRT (signal 6)"),
    ],
)
def test_the_summary_says_how_the_job_ended(ending: str, code: int, said: str) -> None:
    # A worker that dies of a native abort mid-training prints nothing of its own: the
    # summary is where its user learns the job did not simply finish.
    job = f"import os, sys, time; time.sleep(1.5); {ending}"
    result = run_cli("run", "--listen", "127.0.0.1:0", *python_job(job))
    assert result.returncode == code
    ended = re.search(rf"stopped: process \d+ {re.escape(said)}$", result.stdout, re.M)
    assert ended, result.stdout


@pytest.mark.parametrize(("sig", "code"), [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_signals_reach_the_job(sig: signal.Signals, code: int) -> None:
    job = "import sys, time; print('ready', file=sys.stderr, flush=True); time.sleep(60)"
    process = start_run(*python_job(job))
    assert process.stderr is not None
    seen = ""
    for line in process.stderr:  # the job may say "ready" before driftwatch says it watches
        seen += line
        if "ready" in seen and "metrics at" in seen:
            break
    process.send_signal(sig)
    try:
        _, err = process.communicate(timeout=30)
    except subprocess.TimeoutExpired:
        process.kill()
        _, err = process.communicate()
        pytest.fail(
            f"driftwatch run did not end 30 s after {sig.name}; it said: {seen}{err}; the job: "
            + job_signal_state(seen)
        )
    assert process.returncode == code, err
    if sig == signal.SIGINT:
        assert "KeyboardInterrupt" in err  # the job's own traceback, passed through


def job_signal_state(said: str) -> str:
    """The signal lines of the status of the job driftwatch ``said`` it watches (which
    signals it ignores or blocks, and whether a tracer holds it), to tell why one was lost."""
    found = re.search(r"\(pid (\d+)\)", said)
    if found is None:
        return "not named"
    try:
        status = Path(f"/proc/{found[1]}/status").read_text()
    except OSError as err:
        return f"gone ({err.strerror})"
    return "; ".join(
        line for line in status.splitlines() if line.startswith(("Sig", "Shd", "TracerPid"))
    )


def test_retracing_warnings_are_counted_and_passed_through() -> None:
    job = (
        "import sys, time\n"
        f"print({RETRACING_LINE!r}, file=sys.stderr)\n"
        f"print({RETRACING_LINE!r}, file=sys.stderr, flush=True)\n"
        "time.sleep(30)\n"
    )
    process = start_run(*python_job(job))
    read: list[str] = []
    try:
        url = metrics_url(process, read)
        wait_for(
            lambda: scrape(url).get("driftwatch_tf_retracing_warnings_total[]") == 2,
            30,
            "two retracing warnings in /metrics",
        )
    finally:
        process.terminate()
        _, rest = process.communicate(timeout=30)
    # The job may write before driftwatch says where its metrics are: count both parts.
    err = "".join(read) + rest
    assert err.count("triggered tf.function retracing") == 2


def test_no_hook_leaves_the_job_alone() -> None:
    job = (
        "import os\n"
        "os.write(1, f\"{os.environ.get('DRIFTWATCH_HOOK')} "
        "{'inject' in os.environ.get('PYTHONPATH', '')}\\n\".encode())"
    )
    result = run_cli("run", "--no-hook", "--listen", "127.0.0.1:0", *python_job(job))
    assert result.returncode == 0, result.stderr
    assert "0 False" in result.stdout.splitlines()


WORKER_1 = '{"cluster": {"worker": ["h0:1", "h1:1"]}, "task": {"type": "worker", "index": 1}}'
"""The ``TF_CONFIG`` of the second worker of a two-worker job."""
TELL_NAME_AND_RANK = (
    "import os\n"
    "told = (os.environ['DRIFTWATCH_RUN'], os.environ.get('DRIFTWATCH_RANK', '-'))\n"
    "os.write(1, ('run=%s rank=%s\\n' % told).encode())"
)
"""A job that prints the run name and rank driftwatch told it."""


@pytest.mark.parametrize(
    ("flags", "env", "told", "title"),
    [
        # Every rank of a job started with DRIFTWATCH_RUN=NAME (a pod's spec, a launcher's)
        # is the run NAME; a --run flag names it instead.
        ((), {}, "run=ranks-of-one-job rank=-", "ranks-of-one-job"),
        (("--run", "flagged"), {}, "run=flagged rank=-", "flagged"),
        # A rank from TF_CONFIG's task, or --rank, names the process beside its run; the job
        # is told it (its hook agrees).
        (
            (),
            {"TF_CONFIG": WORKER_1},
            "run=ranks-of-one-job rank=worker:1",
            "ranks-of-one-job (worker:1)",
        ),
        (
            ("--rank", "chief:0"),
            {"TF_CONFIG": WORKER_1},
            "run=ranks-of-one-job rank=chief:0",
            "ranks-of-one-job (chief:0)",
        ),
    ],
)
def test_the_ranks_of_one_job_share_the_run_name_of_their_environment_and_differ_by_rank(
    flags: tuple[str, ...], env: dict[str, str], told: str, title: str
) -> None:
    result = run_cli(
        "run",
        "--no-hook",
        *flags,
        "--listen",
        "127.0.0.1:0",
        *python_job(TELL_NAME_AND_RANK),
        env={"DRIFTWATCH_RUN": "ranks-of-one-job", **env},
    )
    assert result.returncode == 0, result.stderr
    assert told in result.stdout.splitlines(), result.stdout
    assert f" {title}: RSS" in result.stdout, result.stdout  # the live line's run


@pytest.mark.parametrize(
    ("env", "title"),
    [
        ({"DRIFTWATCH_RUN": "attached-job"}, "attached-job"),
        ({"DRIFTWATCH_RUN": "attached-job", "HOROVOD_RANK": "3"}, "attached-job (3)"),
    ],
)
def test_attach_names_the_run_and_rank_by_the_processs_own_environment(
    env: dict[str, str], title: str
) -> None:
    # Expected: a process started with DRIFTWATCH_RUN=NAME, attached to, is the run NAME;
    # started by Horovod as rank 3, it is rank 3 of it.
    job = subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(4)"], env={**os.environ, **env}
    )
    try:
        result = run_cli("attach", str(job.pid), "--listen", "127.0.0.1:0")
    finally:
        job.kill()
        job.wait()
    assert result.returncode == 0, result.stderr
    assert f" {title}: RSS" in result.stdout, result.stdout


def test_the_jobs_own_sitecustomize_still_runs(tmp_path: Path) -> None:
    (tmp_path / "sitecustomize.py").write_text("import builtins; builtins.JOB_SITE = 'loaded'\n")
    job = (
        "import builtins, sys\n"
        "import sitecustomize\n"
        # One write: print() writes each argument apart when stdout is unbuffered, and our
        # live line, on the same stdout, can come between them.
        "sys.stdout.write(f\"{getattr(builtins, 'JOB_SITE', 'missing')} "
        "{'driftwatch.hook.autolog' in sys.modules} {sitecustomize.__file__}\\n\")"
    )
    result = subprocess.run(
        [sys.executable, "-m", "driftwatch", "run", "--listen", "127.0.0.1:0", *python_job(job)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env={**os.environ, "PYTHONPATH": str(tmp_path)},
    )
    assert result.returncode == 0, result.stderr
    job_site = str(tmp_path / "sitecustomize.py")
    assert f"loaded True {job_site}" in result.stdout.splitlines()  # interleaved with ours
    assert "Error in sitecustomize" not in result.stderr


def test_injection_without_a_sitecustomize_of_the_jobs_own_is_silent() -> None:
    job = "import sys; sys.stdout.write(f\"{'driftwatch.hook.autolog' in sys.modules}\\n\")"
    result = run_cli("run", "--listen", "127.0.0.1:0", *python_job(job))
    assert result.returncode == 0, result.stderr
    assert "True" in result.stdout.splitlines()
    assert "sitecustomize" not in result.stderr


def test_a_missing_command_is_one_line() -> None:
    result = run_cli("run", "--listen", "127.0.0.1:0", "--", "/nonexistent/trainer")
    assert result.returncode == 1
    assert result.stderr.strip() == (
        "driftwatch: error: cannot run '/nonexistent/trainer': no such file or command"
    )


@pytest.mark.tf
@pytest.mark.paired
def test_run_injects_the_hook_into_an_unmodified_keras_script(
    tmp_path: Path, promtool: str
) -> None:
    runtime = tmp_path / "runtime"
    db = tmp_path / "history.db"
    process = start_run(
        "--cpu-allocator-stats",
        "--db",
        str(db),
        "--",
        sys.executable,
        str(EXAMPLES / "train_keras.py"),
        "--logdir",
        str(tmp_path / "logs"),
        "--epochs",
        "1000",
        env={**TF_ENV, "DRIFTWATCH_RUNTIME_DIR": str(runtime)},
    )
    try:
        url = metrics_url(process)
        wanted = (
            "driftwatch_step_duration_seconds[]",
            "driftwatch_step_gap_seconds[]",
            "driftwatch_tf_allocator_current_bytes[('device', 'CPU:0')]",
            "driftwatch_tf_allocator_peak_bytes[('device', 'CPU:0')]",
            "driftwatch_tf_function_traces_total[]",
        )
        wait_for(lambda: all(k in scrape(url) for k in wanted), 120, f"hook series {wanted}")
        metrics = scrape(url)
        assert metrics["driftwatch_source_up[('source', 'hook')]"] == 1
        assert 1e-5 < metrics["driftwatch_step_duration_seconds[]"] < 1
        assert metrics["driftwatch_tf_allocator_current_bytes[('device', 'CPU:0')]"] > 0
        # Keras traced its train function before the hook's first reading: no retracing.
        assert metrics["driftwatch_tf_function_traces_total[]"] == 0
        assert metrics["driftwatch_train_step[]"] > 0
        (versions,) = [k for k in metrics if k.startswith("driftwatch_runtime_info[")]
        python = ("python", platform.python_version())
        assert str(python) in versions, versions
        assert "('tensorflow', '2." in versions, versions
        with urllib.request.urlopen(url, timeout=10) as response:
            checked = promtool_check_metrics(promtool, response.read().decode())
        assert checked.returncode == 0, checked.stdout + checked.stderr
        assert len(list_channels(runtime)) == 1
        process.send_signal(signal.SIGINT)  # Ctrl-C: reaches the job, which stops
        try:
            out, err = process.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            pytest.fail(f"the job did not stop on SIGINT within 60 s; its stacks:\n{stop(process)}")
    finally:
        if process.poll() is None:
            stop(process)
    assert process.returncode == 130, err
    assert "KeyboardInterrupt" in err
    assert re.search(r"outside the step: [\d.]+ .s/step", out)
    assert re.search(r"TF memory CPU:0: [\d.]+ [KM]iB \(peak", out)
    assert list_channels(runtime) == []  # run removed its job's channel
    history = HistoryReader(db)
    run = history.run(None)
    history.close()
    assert run.meta["python"] == platform.python_version()
    assert {"driftwatch", "tensorflow", "keras"} <= run.meta.keys(), run.meta
