"""When a job dies, what it did in its last moments still reaches every output.

Each job kills itself with ``SIGKILL`` right after the event, so no tick can fall between
the event and the exit: only the reading that follows the exit (every source read to its
end, the detectors asked about the whole run) can report it.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import uuid
from pathlib import Path

from driftwatch.history.reader import HistoryReader
from tests.conftest import wait_for
from tests.test_daemon import DaemonProcess

NAN_THEN_KILL = """
    import os, signal, time
    import driftwatch

    hook = driftwatch.Hook()
    end = time.monotonic() + {seconds}
    while time.monotonic() < end:
        with hook.step():
            time.sleep(0.01)
    hook.check_finite(float("nan"))
    os.kill(os.getpid(), signal.SIGKILL)
"""

RSS_BURST_THEN_KILL = """
    import os, signal, time

    time.sleep(1.0)
    kept = []
    end = time.monotonic() + 6.0
    while time.monotonic() < end:  # up to 400 MB/s, every page touched
        kept.append(bytearray(os.urandom(1 << 16)) * 320)
        time.sleep(0.05)
    os.kill(os.getpid(), signal.SIGKILL)
"""


def job(tmp_path: Path, source: str, **values: float) -> Path:
    """The job's program, named uniquely: a daemon of another test may watch it too."""
    path = tmp_path / f"job_{uuid.uuid4().hex[:8]}.py"
    path.write_text(textwrap.dedent(source.format(**values)), encoding="utf-8")
    return path


def driftwatch_run(tmp_path: Path, program: Path) -> subprocess.CompletedProcess[str]:
    """``driftwatch run`` with its default sampling, findings and history in ``tmp_path``."""
    return subprocess.run(
        [
            *(sys.executable, "-m", "driftwatch", "run"),
            *("--findings", str(tmp_path / "findings.jsonl")),
            *("--db", str(tmp_path / "history.db"), "--listen", "127.0.0.1:0"),
            *("--", sys.executable, str(program)),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def written_kinds(findings: Path) -> set[str]:
    lines = findings.read_text(encoding="utf-8").splitlines() if findings.exists() else []
    return {json.loads(line)["kind"] for line in lines}


def stored_kinds(db: Path) -> set[str]:
    reader = HistoryReader(db)
    try:
        return {finding.kind for finding in reader.findings(reader.run(None).id)}
    finally:
        reader.close()


def test_a_nan_the_hook_recorded_just_before_a_kill_is_reported_everywhere(
    tmp_path: Path,
) -> None:
    result = driftwatch_run(tmp_path, job(tmp_path, NAN_THEN_KILL, seconds=2.0))
    assert result.returncode == 128 + signal.SIGKILL, result.stderr
    assert "nonfinite" in written_kinds(tmp_path / "findings.jsonl"), result.stderr
    assert "nonfinite" in stored_kinds(tmp_path / "history.db")
    assert "nonfinite" in result.stdout  # the summary


def test_a_burst_of_rss_growth_just_before_a_kill_is_reported_everywhere(
    tmp_path: Path,
) -> None:
    """Expected: the job's RSS rose steadily from about 10 MB by 1 to 2.4 GB in 6 s, then
    it died: memory that would reach any host's limit within minutes is a leak, stated
    with its rate, even though no live window had closed enough readings to judge it."""
    result = driftwatch_run(tmp_path, job(tmp_path, RSS_BURST_THEN_KILL))
    assert result.returncode == 128 + signal.SIGKILL, result.stderr
    assert "host_memory_drift" in written_kinds(tmp_path / "findings.jsonl"), result.stdout
    assert "host_memory_drift" in stored_kinds(tmp_path / "history.db")


def test_the_daemon_reports_a_nan_of_a_job_killed_right_after_it(tmp_path: Path) -> None:
    findings = tmp_path / "findings.jsonl"
    daemon = DaemonProcess("--findings", str(findings), "--db", str(tmp_path / "history.db"))
    try:
        program = job(tmp_path, NAN_THEN_KILL, seconds=6.0)
        victim = subprocess.Popen([sys.executable, str(program)], env={**os.environ})
        wait_for(lambda: program.stem in daemon.runs(), 30, "the daemon to find the job")
        assert victim.wait(timeout=60) == -signal.SIGKILL
        try:
            wait_for(lambda: "nonfinite" in written_kinds(findings), 30, "the finding")
        except BaseException:
            print("".join(daemon.lines))
            raise
    finally:
        daemon.process.terminate()
        daemon.process.wait(timeout=30)
