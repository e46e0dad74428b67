"""A real 2-worker ``MultiWorkerMirroredStrategy`` job (a custom loop with ``strategy.run``,
CPU, ``TF_CONFIG`` on loopback ports), each worker under ``driftwatch run`` with its
defaults: the ranks share their run name, each is labelled by its task, each rank's wait at
its collectives is measured, and each rank's monitor compares it with the other's: the rank
the others wait for is named, with its own cause; a rank that stops is named as stopped.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil
import pytest

from driftwatch.history.reader import HistoryReader, RunRecord
from tests.conftest import TF_ENV, UNTIMED_KINDS

WORKER = Path(__file__).parent / "data" / "programs" / "mwms_worker.py"
JOB_SECONDS = 180.0
"""Seconds a job may take to start both workers, train and exit (each ~60 s here)."""
STRAGGLER_BAR = 0.2
"""``DriftwatchStraggler``'s bar: the most waiting rank waits this much more of a step."""
TRAIN_SECONDS = "50"
"""How long each worker trains: the straggler is named about 40 s into training (three
readings of each rank, a probe every 100 steps or 10 s, then 30 s of the gap)."""


@dataclass(frozen=True)
class Rank:
    """What one worker's ``driftwatch run`` left: its findings and its history."""

    findings: list[dict[str, Any]]
    db: Path

    def kinds(self) -> set[str]:
        return {finding["kind"] for finding in self.findings}

    def finding(self, kind: str) -> dict[str, Any]:
        return next(finding for finding in self.findings if finding["kind"] == kind)


def free_ports(count: int) -> list[int]:
    """Ports free on loopback now (a worker binds its own a moment later)."""
    with ExitStack() as stack:
        bound = [stack.enter_context(socket.create_server(("127.0.0.1", 0))) for _ in range(count)]
        return [sock.getsockname()[1] for sock in bound]


def start_job(
    tmp_path: Path, worker_env: list[dict[str, str]], pinned: bool = False
) -> list[subprocess.Popen[bytes]]:
    """One worker per ``worker_env`` under ``driftwatch run`` (defaults but for its history
    and findings files and an ephemeral port), each with its ``TF_CONFIG`` and all with one
    run name of their own; ``pinned``: worker N and its driftwatch on core N."""
    cluster = {"worker": [f"127.0.0.1:{port}" for port in free_ports(len(worker_env))]}
    run = f"mw-{uuid.uuid4().hex[:8]}"
    jobs = []
    for index, extra in enumerate(worker_env):
        task = {"cluster": cluster, "task": {"type": "worker", "index": index}}
        env = {**os.environ, **TF_ENV, **extra, "TF_CONFIG": json.dumps(task)}
        env["DRIFTWATCH_RUN"] = run
        command = ["taskset", "-c", str(index)] if pinned else []
        command += [sys.executable, "-m", "driftwatch", "run", "--listen", "127.0.0.1:0"]
        command += ["--db", str(tmp_path / f"h{index}.db")]
        command += ["--findings", str(tmp_path / f"f{index}.jsonl")]
        command += ["--", sys.executable, str(WORKER)]
        log = (tmp_path / f"worker{index}.txt").open("w")
        jobs.append(
            subprocess.Popen(
                command, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
            )
        )
    return jobs


def ranks_of(tmp_path: Path, count: int) -> list[Rank]:
    return [
        Rank(findings_in(tmp_path / f"f{i}.jsonl"), tmp_path / f"h{i}.db") for i in range(count)
    ]


def findings_in(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def run_job(
    tmp_path: Path,
    worker_env: list[dict[str, str]],
    pinned: bool = False,
    beside: Callable[[list[subprocess.Popen[bytes]]], None] | None = None,
) -> list[Rank]:
    """``start_job``, then ``beside(jobs)`` while it runs; each rank once every worker
    exited 0. A worker whose peers are gone blocks for ever, so every process is killed at
    ``JOB_SECONDS``."""
    with job_of(tmp_path, worker_env, pinned) as jobs:
        if beside is not None:
            beside(jobs)
        deadline = time.monotonic() + JOB_SECONDS
        try:
            for job in jobs:
                job.wait(timeout=max(1.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            pytest.fail(f"the job did not end in {JOB_SECONDS:.0f} s: {said(tmp_path)}")
    codes = [job.returncode for job in jobs]
    assert codes == [0] * len(jobs), f"exit codes {codes}: {said(tmp_path)}"
    assert "Traceback" not in said(tmp_path), said(tmp_path)
    return ranks_of(tmp_path, len(jobs))


@contextmanager
def job_of(
    tmp_path: Path, worker_env: list[dict[str, str]], pinned: bool = False
) -> Iterator[list[subprocess.Popen[bytes]]]:
    """``start_job``; every process of it killed on leaving."""
    jobs = start_job(tmp_path, worker_env, pinned)
    try:
        yield jobs
    finally:
        for job in jobs:
            if job.poll() is None:
                with suppress(ProcessLookupError):
                    os.killpg(job.pid, signal.SIGCONT)
                    os.killpg(job.pid, signal.SIGKILL)
                job.wait()


def said(tmp_path: Path) -> str:
    """The end of what each worker and its driftwatch printed."""
    return "\n".join(log.read_text()[-2500:] for log in sorted(tmp_path.glob("worker*.txt")))


def worker_of(job: subprocess.Popen[bytes]) -> psutil.Process:
    """The training process that ``driftwatch run`` (``job``) started."""
    for child in psutil.Process(job.pid).children():
        if str(WORKER) in child.cmdline():
            return child
    raise AssertionError(f"no worker under driftwatch {job.pid}")


def wait_for(condition: Callable[[], bool], seconds: float, what: str) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, f"no {what} within {seconds:.0f} s"
        time.sleep(0.5)


def readings_so_far(db: Path) -> float:
    """Readings of the step counter a worker's history holds so far (0 before it has any:
    its recorder writes every 5 s)."""
    if not db.exists():
        return 0.0
    with suppress(Exception):
        reader = HistoryReader(db)
        try:
            run = reader.run(None)
            return sum(b.count for b in reader.series(run.id).get(("train_step", ()), []))
        finally:
            reader.close()
    return 0.0


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


def dumps(tmp_path: Path) -> list[Path]:
    """The stack dumps taken of rank 1 at a stall."""
    return list(tmp_path.glob("h1.captures/**/stack-stalled-*.txt"))


def loud(rank: Rank) -> set[str]:
    """The kinds of ``rank``'s findings at warning or above."""
    return {f["kind"] for f in rank.findings if f["severity"] != "info"}


@pytest.mark.tf
@pytest.mark.paired
def test_the_rank_whose_input_is_slow_is_named_the_straggler_with_its_input_pipeline(
    tmp_path: Path,
) -> None:
    # Expected: rank 1's map sleeps 1 ms a sample (about 35 ms a 32-sample batch, several
    # times a healthy step), rank 0 is healthy; both step at rank 1's pace. Rank 0 waits
    # most of each step in the all-reduce for rank 1, rank 1 hardly: their collective wait
    # shares differ by far more than 0.2, so rank 1's monitor, comparing it with rank 0's
    # posts, names it the straggler, and its own input wait (most of its step) as why. Rank
    # 0 is no straggler. Both ranks are one run, worker:0 and worker:1.
    slow = {"MW_SECONDS": TRAIN_SECONDS, "MW_SLEEP_MS": "1"}
    waiting, straggler = run_job(tmp_path, [{"MW_SECONDS": TRAIN_SECONDS}, slow])
    (run0, waited), (run1, least) = readings(waiting.db), readings(straggler.db)
    assert run0.name == run1.name
    assert (run0.meta.get("rank"), run1.meta.get("rank")) == ("worker:0", "worker:1")
    assert waited - least > STRAGGLER_BAR, said(tmp_path)
    assert "straggling_rank" in straggler.kinds(), said(tmp_path)
    named = straggler.finding("straggling_rank")
    assert named["rank"] == "worker:1"
    assert named["evidence"]["waiting_peer"] == "worker:0"
    assert named["evidence"]["input_wait_share"] > 0.5
    assert "its input pipeline holds the job back" in named["message"]
    assert "straggling_rank" not in waiting.kinds(), waiting.findings


@pytest.mark.tf
def test_the_ranks_of_a_healthy_job_wait_alike_and_neither_is_a_straggler(tmp_path: Path) -> None:
    # Expected: two healthy workers wait alike at their all-reduces (on loopback most of an
    # 8-ms step is the transfer, for both): their shares differ by less than the bar, and
    # neither rank is a straggler, stalled, or warned of anything but its memory. Their steps
    # are not judged: two workers and their monitors fill both cores of this machine, so
    # each one's steps move with the others' load (9 -> 16 ms in one run, host CPU
    # contention named). TensorFlow's multi-worker runtime keeps about 3 KB a step in each
    # worker, steadily (624 -> 642 MiB from 35 to 95 s of this job run without driftwatch,
    # 1.1 GiB/h; tensorflow/tensorflow#42616 and #44688): stated at the run's end when steady
    # to its end, a true finding.
    ranks = run_job(tmp_path, [{"MW_SECONDS": TRAIN_SECONDS}] * 2)
    (_, first), (_, second) = readings(ranks[0].db), readings(ranks[1].db)
    assert abs(first - second) < STRAGGLER_BAR, said(tmp_path)
    for rank in ranks:
        assert not rank.kinds() & {"straggling_rank", "stalled"}, said(tmp_path)
        assert loud(rank) & UNTIMED_KINDS <= {"host_memory_drift"}, said(tmp_path)


HOG_AFTER_SECONDS = 10.0
"""Seconds into training at which the CPU hogs start beside rank 1."""


@pytest.mark.tf
def test_the_rank_beside_cpu_hogs_is_named_the_straggler_and_its_host_contention(
    tmp_path: Path,
) -> None:
    # Expected: each worker pinned to a core of its own (with its driftwatch); 10 s into
    # training two busy loops start on rank 1's core, leaving its compute-heavy steps (256
    # units, batches of 1024) a third of it. Rank 0 then waits for rank 1: rank 1 is named
    # the straggler, and what moved most when it began is its host's CPU contention (its
    # tf.data threads share the starved core: its input wait per step rose too). Rank 0 is
    # no straggler.
    heavy = {"MW_SECONDS": "70", "MW_WIDTH": "256", "MW_BATCH": "1024"}
    hogs: list[subprocess.Popen[bytes]] = []

    def hog_rank_1(jobs: list[subprocess.Popen[bytes]]) -> None:
        wait_for(lambda: readings_so_far(tmp_path / "h1.db") > 0, 90, "training of rank 1")
        time.sleep(HOG_AFTER_SECONDS)
        busy = ["taskset", "-c", "1", sys.executable, "-c", "while True: pass"]
        hogs.extend(subprocess.Popen(busy) for _ in range(2))

    try:
        waiting, straggler = run_job(tmp_path, [heavy, heavy], pinned=True, beside=hog_rank_1)
    finally:
        for hog in hogs:
            hog.kill()
            hog.wait()
    assert "straggling_rank" in straggler.kinds(), said(tmp_path)
    named = straggler.finding("straggling_rank")
    causes = named["evidence"]["causes"]
    assert causes[0]["cause"] == "host_cpu_contention", causes
    assert "straggling_rank" not in waiting.kinds(), waiting.findings


@pytest.mark.tf
@pytest.mark.paired
def test_a_rank_stopped_with_sigstop_is_named_as_stopped_and_its_peer_not_as_stalled(
    tmp_path: Path,
) -> None:
    # Expected: 10 s into training rank 1's process is stopped (SIGSTOP). Within about 10 s
    # its monitor says it stalled because it is stopped, with its stack dumped; rank 0,
    # blocked in its all-reduce waiting for it, is no stalled run of its own meanwhile.
    with job_of(tmp_path, [{"MW_SECONDS": "120"}] * 2) as jobs:
        wait_for(lambda: readings_so_far(tmp_path / "h1.db") > 0, 90, "training of rank 1")
        time.sleep(10)
        worker = worker_of(jobs[1])
        worker.send_signal(signal.SIGSTOP)
        stopped = time.monotonic()
        wait_for(
            lambda: "stalled" in {f["kind"] for f in findings_in(tmp_path / "f1.jsonl")},
            45,
            "stalled finding of the stopped rank",
        )
        named_after = time.monotonic() - stopped
        wait_for(lambda: bool(dumps(tmp_path)), 30, "stack dump of the stopped rank")
        peer = findings_in(tmp_path / "f0.jsonl")
    stalled = next(f for f in findings_in(tmp_path / "f1.jsonl") if f["kind"] == "stalled")
    assert stalled["rank"] == "worker:1"
    assert "stopped for" in stalled["message"]
    assert stalled["evidence"]["stopped_seconds"] >= 10
    assert named_after < 30, named_after
    assert "Thread" in dumps(tmp_path)[0].read_text()
    assert "stalled" not in {f["kind"] for f in peer}, peer
