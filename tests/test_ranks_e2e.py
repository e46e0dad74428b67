"""A real 2-worker ``MultiWorkerMirroredStrategy`` job (a custom loop with ``strategy.run``,
CPU, ``TF_CONFIG`` on loopback ports), each worker under ``driftwatch run`` with its
defaults: the ranks share their run name, each is labelled by its task, and each rank's wait
at its collectives is measured, so the rank the others wait for is the one that waits least.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from driftwatch.history.reader import HistoryReader, RunRecord
from tests.conftest import TF_ENV

WORKER = Path(__file__).parent / "data" / "programs" / "mwms_worker.py"
JOB_SECONDS = 150.0
"""Seconds a job may take to start both workers, train and exit (each ~25 s here)."""
STRAGGLER_BAR = 0.2
"""``DriftwatchStraggler``'s bar: the most waiting rank waits this much more of a step."""


def free_ports(count: int) -> list[int]:
    """Ports free on loopback now (a worker binds its own a moment later)."""
    sockets = [socket.socket() for _ in range(count)]
    try:
        for sock in sockets:
            sock.bind(("127.0.0.1", 0))
        return [sock.getsockname()[1] for sock in sockets]
    finally:
        for sock in sockets:
            sock.close()


def run_job(tmp_path: Path, run: str, worker_env: list[dict[str, str]]) -> list[Path]:
    """Run one worker per ``worker_env`` under ``driftwatch run --run RUN``, each with its
    ``TF_CONFIG``; the history database of each, by rank. A worker whose peers are gone
    blocks for ever, so every process is killed at ``JOB_SECONDS``."""
    cluster = {"worker": [f"127.0.0.1:{port}" for port in free_ports(len(worker_env))]}
    jobs, dbs = [], []
    for index, extra in enumerate(worker_env):
        db = tmp_path / f"h{index}.db"
        task = {"cluster": cluster, "task": {"type": "worker", "index": index}}
        env = {**os.environ, **TF_ENV, **extra, "TF_CONFIG": json.dumps(task)}
        command = [sys.executable, "-m", "driftwatch", "run", "--run", run]
        command += ["--listen", "127.0.0.1:0", "--db", str(db), "--", sys.executable, str(WORKER)]
        log = (tmp_path / f"worker{index}.txt").open("w")
        jobs.append(
            subprocess.Popen(
                command, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
            )
        )
        dbs.append(db)
    deadline = time.monotonic() + JOB_SECONDS
    try:
        for job in jobs:
            job.wait(timeout=max(1.0, deadline - time.monotonic()))
    except subprocess.TimeoutExpired:
        pytest.fail(f"the job did not end in {JOB_SECONDS:.0f} s: {said(tmp_path)}")
    finally:
        for job in jobs:
            if job.poll() is None:
                os.killpg(job.pid, signal.SIGKILL)
                job.wait()
    codes = [job.returncode for job in jobs]
    assert codes == [0] * len(jobs), f"exit codes {codes}: {said(tmp_path)}"
    return dbs


def said(tmp_path: Path) -> str:
    """The end of what each worker and its driftwatch printed."""
    return "\n".join(log.read_text()[-2500:] for log in sorted(tmp_path.glob("worker*.txt")))


def readings(db: Path, series: str = "collective_wait_share") -> tuple[RunRecord, float]:
    """The run a worker's history holds, and the mean of its readings of ``series``."""
    reader = HistoryReader(db)
    try:
        run = reader.run(None)
        buckets = reader.series(run.id).get((series, ()), [])
    finally:
        reader.close()
    finest = min((b.width for b in buckets), default=0.0)
    kept = [b for b in buckets if b.width == finest and b.mean == b.mean]
    count = sum(b.count for b in kept)
    assert count >= 2, f"{count} readings of {series} in {db}"
    return run, sum(b.mean * b.count for b in kept) / count


@pytest.mark.tf
@pytest.mark.paired
def test_the_rank_whose_input_is_slow_waits_least_at_the_collective(tmp_path: Path) -> None:
    # Expected: rank 1's map sleeps 3 ms a sample (about 100 ms a 32-sample batch), rank 0 is
    # healthy; both step at rank 1's pace. Rank 0 waits most of each step in the all-reduce
    # for rank 1, rank 1 hardly waits: their collective wait shares differ by far more than
    # DriftwatchStraggler's 0.2, and both ranks are the run "straggle", worker:0 and worker:1.
    # Rank 1 waits for its input most of each step, rank 0 hardly.
    slow = {"MW_SLEEP_MS": "3"}
    dbs = run_job(tmp_path, "straggle", [{"MW_SECONDS": "12"}, {"MW_SECONDS": "12", **slow}])
    (run0, waiting), (run1, straggler) = readings(dbs[0]), readings(dbs[1])
    assert (run0.name, run0.meta.get("rank")) == ("straggle", "worker:0")
    assert (run1.name, run1.meta.get("rank")) == ("straggle", "worker:1")
    assert waiting > 0.5, said(tmp_path)
    assert straggler < 0.2, said(tmp_path)
    assert waiting - straggler > STRAGGLER_BAR
    # The cause, in the straggler's own signals: the batch it fetches inside its step.
    assert readings(dbs[1], "input_wait_share")[1] > 0.5, said(tmp_path)
    assert readings(dbs[0], "input_wait_share")[1] < 0.1, said(tmp_path)


@pytest.mark.tf
@pytest.mark.paired
def test_the_ranks_of_a_healthy_job_wait_alike_at_the_collective(tmp_path: Path) -> None:
    # Expected: two healthy workers wait alike at their all-reduces (on loopback most of an
    # 8-ms step is the transfer, for both): their shares differ by less than the bar.
    dbs = run_job(tmp_path, "healthy", [{"MW_SECONDS": "12"}, {"MW_SECONDS": "12"}])
    (_, first), (_, second) = readings(dbs[0]), readings(dbs[1])
    assert abs(first - second) < STRAGGLER_BAR, said(tmp_path)
