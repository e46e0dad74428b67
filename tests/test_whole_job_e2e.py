"""The whole job watched from outside, no hook: the scenarios of resources a job runs out of
besides its own memory (worker processes' memory, descriptors, threads, unreaped children,
disk) and their healthy twins, started plainly (``python scenarios/X.py``, nothing of
driftwatch in them) and all at once (each leak is paced by wall time, so sharing the machine
slows their steps, not their leaks), under one ``driftwatch daemon --match`` and each under
``driftwatch attach PID``, with default flags. Each job runs from its logdir on a tmpfs the
test mounts (the checkpoint programs on their verdicts' small one) and in a pids cgroup of
its own, as a container would hold it. Each failing program gets its finding kind at warning
or critical, naming the resource (for worker memory: one of the job's workers by PID and
command line); no healthy twin gets a warning or critical finding."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager, suppress
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import IO, Any

import psutil
import pytest

from driftwatch.detect.memory.resources import RESOURCES
from tests.conftest import wait_for
from tests.jobs import ONE_THREAD, SCENARIOS, Findings, read_findings, small_filesystem
from tests.test_scenarios_e2e import VERDICTS, Verdict, described, loud

pytestmark = pytest.mark.tf  # not paired: nine jobs at once take both cores

WHOLE_JOB = [verdict for verdict in VERDICTS if verdict.whole_job]
"""The programs run at once: those whose verdicts say ``whole_job`` (scenarios/verdicts.toml)."""
SECONDS = 65
"""``--seconds`` each program trains for. Without the hook a watcher knows no training step:
a signal's start-up, never judged, lasts until its shape says it ended or 30 s after its
first reading (docs/detectors.md). The workers' memory has its first reading when the
workers start, up to 20 s into training on a loaded machine, and climbs steadily from there:
its start-up lasts those 30 s, and a few 1.5-s windows more are judged. Nine TensorFlow
processes starting at once on two cores take 15 to 60 s to begin training."""
JOBS_TIMEOUT = 240
"""Seconds the jobs may take, all together, from their start to their exit."""
SETTLE_SECONDS = 30
"""Seconds a watcher may take after the jobs' exit to state what it found at their end."""
JOBS_FILESYSTEM_MIB = 1024
"""Size of the tmpfs that holds every job's logdir, working directory and error output: the
filesystems the jobs write to are the test's, so another writer on the machine (a shared CI
host's root filesystem filling up) is not theirs. Their descriptor, thread and uploader files
add a few MB to it; the checkpoint programs have theirs (their verdicts' size) mounted in it."""
PIDS_MAX = 2048
"""The pids.max of the cgroup each job runs in (its threads, its workers' and its children,
zombies included, hold its PIDs), as a container's limit would be: a thread or zombie
pile-up of 10 a second reaches it in minutes, so it is told live (against this machine's
threads-max, 192,730, it is hours away and told only at the job's end: scenarios/verdicts.toml)."""
CGROUP_V1 = Path("/sys/fs/cgroup")
"""Where cgroup v1 mounts its controllers (this test's machines: v1, as root)."""
WHAT = {resource.kind: resource.what for resource in RESOURCES.values()}
"""What a finding's message calls its resource, by finding kind."""


@dataclass
class Job:
    """One program started plainly, its output lines as they came (wall-clock time, line),
    and the PIDs of the children seen while it ran."""

    verdict: Verdict
    process: subprocess.Popen[str]
    logdir: Path
    lines: list[tuple[float, str]] = field(default_factory=list)
    children: set[int] = field(default_factory=set)
    started: float = field(default_factory=time.time)

    @property
    def name(self) -> str:
        return self.verdict.name

    def training_started(self) -> float:
        """When it printed that it trains (its leak starts then), wall-clock time."""
        return next(t for t, line in self.lines if line.startswith("training for"))

    def done_line(self) -> str:
        return next((line for _, line in self.lines if line.startswith("done ")), "no done line")


class FirstSeen:
    """When each finding (``key``) first appeared in a findings file: read again on every
    ``poll``."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.times: dict[tuple[str, str, str, bool], float] = {}

    def poll(self) -> Findings:
        findings = read_findings(self.path)
        now = time.time()
        for finding in findings:
            self.times.setdefault(key(finding), now)
        return findings


def key(finding: dict[str, Any]) -> tuple[str, str, str, bool]:
    """A finding's run, kind, severity and whether it was stated at the run's end."""
    at_end = bool(finding["evidence"].get("judged_at_end"))
    return finding["run"], finding["kind"], finding["severity"], at_end


@contextmanager
def started_jobs(root: Path, then: Callable[[Job], None] | None = None) -> Iterator[list[Job]]:
    """Every program of ``WHOLE_JOB`` started plainly from its logdir, on a tmpfs mounted at
    ``root`` (``JOBS_FILESYSTEM_MIB``; the logdir a tmpfs of its own where its verdict asks);
    ``then`` is called with each job right after it starts. Killed (if still running) and
    their filesystems unmounted on leaving."""
    with ExitStack() as stack:
        stack.enter_context(small_filesystem(root, JOBS_FILESYSTEM_MIB))
        jobs = []
        for verdict in WHOLE_JOB:
            logdir = root / verdict.name
            logdir.mkdir()
            stack.enter_context(small_filesystem(logdir, verdict.filesystem_mib))
            command = [sys.executable, str(SCENARIOS / verdict.program)]
            command += ["--logdir", str(logdir), "--seconds", str(SECONDS)]
            stderr = stack.enter_context((root / f"{verdict.name}.stderr").open("w"))
            groups = stack.enter_context(cgroups(f"{os.getpid()}-{verdict.name}"))
            process = subprocess.Popen(
                command,
                stdout=subprocess.PIPE,
                stderr=stderr,
                text=True,
                env={**os.environ, **ONE_THREAD},
                cwd=logdir,
                preexec_fn=partial(join, groups),
            )
            stack.callback(stop, process)
            job = Job(verdict, process, logdir)
            threading.Thread(target=collect, args=(process.stdout, job.lines), daemon=True).start()
            jobs.append(job)
            if then is not None:
                then(job)
        yield jobs


@contextmanager
def cgroups(name: str) -> Iterator[list[Path]]:
    """A new cgroup of v1's pids controller whose pids.max is ``PIDS_MAX``, removed after;
    skips the test where none can be made (not root, cgroup v2 only). Not one of its memory
    controller: under a limit of 4 GiB, the healthy PyDataset job's first steps (its RSS
    rising 40 MB over them, starved to 2 or 3 steps a second by the other jobs) were told as
    host_memory_drift, critical, reaching the limit in 10 minutes."""
    made = []
    try:
        cgroup = CGROUP_V1 / "pids" / own_cgroup("pids") / f"driftwatch-test-{name}"
        cgroup.mkdir()
        made.append(cgroup)
        (cgroup / "pids.max").write_text(str(PIDS_MAX))
    except OSError as err:
        remove(made)
        pytest.skip(f"no pids cgroup of our own here: {err}")
    try:
        yield made
    finally:
        remove(made)


def own_cgroup(controller: str) -> str:
    """This process's cgroup of ``controller`` (v1), relative to its mount."""
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        _, controllers, path = line.split(":", 2)
        if controller in controllers.split(","):
            return path.lstrip("/")
    raise OSError(f"no {controller} cgroup (v1)")


def remove(groups: list[Path]) -> None:
    for cgroup in groups:
        for _ in range(100):  # the job's last tasks leave as it exits
            try:
                cgroup.rmdir()
                break
            except OSError:
                time.sleep(0.1)


def join(groups: list[Path]) -> None:
    """Move the calling process into ``groups`` (before it runs the job)."""
    for cgroup in groups:
        (cgroup / "cgroup.procs").write_text(str(os.getpid()))


def collect(stream: IO[str] | None, lines: list[tuple[float, str]]) -> None:
    assert stream is not None
    for line in stream:
        lines.append((time.time(), line.rstrip()))


def stop(process: subprocess.Popen[Any]) -> None:
    if process.poll() is None:
        process.kill()
    process.wait()


def run_to_their_end(jobs: list[Job], *watchers: FirstSeen) -> None:
    """Waits for every job to exit (each with status 0 and its ``done`` line), noting the
    children each starts and when each finding first appears."""
    deadline = time.monotonic() + JOBS_TIMEOUT
    while any(job.process.poll() is None for job in jobs):
        assert time.monotonic() < deadline, f"jobs still running after {JOBS_TIMEOUT} s"
        for job in jobs:
            with suppress(psutil.NoSuchProcess):
                job.children |= {c.pid for c in psutil.Process(job.process.pid).children()}
        for watcher in watchers:
            watcher.poll()
        time.sleep(0.5)
    time.sleep(0.5)  # the reader threads' last lines
    for job in jobs:
        assert job.process.returncode == 0, (job.name, job.lines[-5:])
        assert job.done_line().startswith("done "), (job.name, job.lines[-5:])
    first = min(job.started for job in jobs)
    began = [job.training_started() - job.started for job in jobs]
    print(
        f"jobs: training began {min(began):.0f} to {max(began):.0f} s after their start; "
        f"all exited {time.time() - first:.0f} s after the first started"
    )


def caught(job: Job, finding: dict[str, Any]) -> bool:
    """Whether ``finding`` is one ``job``'s verdict asks for, loud, and naming its resource
    (the filesystem by the job's logdir, a worker by one of the job's children's PIDs and its
    command line)."""
    kind = finding["kind"]
    if kind not in job.verdict.kinds or finding["severity"] not in ("warning", "critical"):
        return False
    message, evidence = finding["message"], finding["evidence"]
    if WHAT[kind] not in message:
        return False
    if kind == "disk_exhaustion":
        return str(job.logdir) in message
    if kind == "worker_memory_drift":
        pid = int(evidence.get("largest_worker_pid", 0))
        command = str(evidence.get("largest_worker_command", ""))
        return (
            pid in job.children
            and job.verdict.program in command
            and f"pid {pid} ({command})" in message
        )
    return True


def judge(jobs: list[Job], findings: Findings, seen: dict[str, FirstSeen], how: str) -> list[str]:
    """What is wrong in ``findings`` (those of all the jobs, by run name: the script's): a
    failing job not caught, a healthy one not quiet; prints what each did, what the watcher
    said of it, and when: from the job's start of training to the finding's first
    appearance, live or stated at its end."""
    wrong = []
    for job in jobs:
        said = [f for f in findings if f["run"] == job.name]
        print(f"{how} {job.name}: {job.done_line()}")
        for finding in loud(said):
            first = seen[job.name].times[key(finding)]
            when = "at its end" if key(finding)[3] else "live"
            print(
                f"  [{finding['severity']}] {finding['kind']} {when}, "
                f"{first - job.training_started():.1f} s into training: {finding['message']}"
            )
        if job.verdict.kinds and not any(caught(job, finding) for finding in said):
            wrong.append(
                f"{how} {job.name}: expected {sorted(job.verdict.kinds)}, got {described(said)}"
            )
        if not job.verdict.kinds and loud(said):
            wrong.append(f"{how} {job.name} (healthy): {described(loud(said))}")
        forbidden = [f for f in loud(said) if f["kind"] in job.verdict.forbidden]
        if forbidden:
            wrong.append(f"{how} {job.name} (forbidden): {described(forbidden)}")
    return wrong


def settled(jobs: list[Job], watcher: FirstSeen) -> Callable[[], bool]:
    """Whether every failing job's finding is in ``watcher``'s file (a thread or zombie
    pile-up is stated at the job's end, after its exit)."""

    def check() -> bool:
        findings = watcher.poll()
        return all(
            any(caught(job, f) for f in findings if f["run"] == job.name)
            for job in jobs
            if job.verdict.kinds
        )

    return check


def wait_until(predicate: Callable[[], bool], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not predicate() and time.monotonic() < deadline:
        time.sleep(0.5)


@contextmanager
def daemon_matching(root: Path, findings: Path) -> Iterator[Path]:
    """A ``driftwatch daemon`` finding the programs started under ``root`` by a pattern of
    their command lines (their workers share them, and are watched as part of their jobs,
    not as jobs of their own), serving ``/metrics``; yields its log, stopped by SIGTERM on
    leaving, which it must take without an error."""
    pattern = rf"scenarios/\w+\.py --logdir {re.escape(str(root))}/"
    command = [sys.executable, "-m", "driftwatch", "daemon", "--match", pattern]
    command += ["--listen", "127.0.0.1:0", "--db", str(findings.with_suffix(".db"))]
    command += ["--findings", str(findings)]
    log = findings.with_suffix(".stderr")
    # Its own channel directory: hooked processes elsewhere on the machine are not its.
    env = {**os.environ, "DRIFTWATCH_RUNTIME_DIR": str(findings.parent / "channels")}
    with log.open("w") as stderr, subprocess.Popen(command, stderr=stderr, env=env) as daemon:
        try:
            wait_for(lambda: "metrics at" in log.read_text(), 30, "the daemon to serve /metrics")
            yield log
        finally:
            stopping = time.monotonic()
            daemon.send_signal(signal.SIGTERM)
            code = daemon.wait(timeout=30)
            print(f"daemon: stopped {time.monotonic() - stopping:.1f} s after SIGTERM")
    said = log.read_text()
    assert code == 0, said[-3000:]
    assert "Traceback" not in said, said[-3000:]


def test_a_daemon_matching_the_jobs_and_attach_to_each_find_each_leak_of_the_whole_job(
    tmp_path: Path,
) -> None:
    # Expected: the verdicts of scenarios/verdicts.toml, from each of two watchers of the
    # same nine jobs at once: one daemon that finds them by a pattern of their command
    # lines, and a driftwatch attach started on each program's PID right after it started.
    # Neither changes what the other reads (both read /proc; no hook is loaded).
    began = time.monotonic()
    roots = tmp_path / "jobs"
    daemon_findings = FirstSeen(tmp_path / "daemon.jsonl")
    attached: dict[str, tuple[subprocess.Popen[bytes], FirstSeen, Path]] = {}

    with ExitStack() as stack:

        def attach(job: Job) -> None:
            findings = tmp_path / f"{job.name}.jsonl"
            log = tmp_path / f"{job.name}.attach.stderr"
            command = [sys.executable, "-m", "driftwatch", "attach", str(job.process.pid)]
            command += ["--listen", "127.0.0.1:0", "--findings", str(findings)]
            command += ["--db", str(tmp_path / f"{job.name}.db")]
            out = stack.enter_context((tmp_path / f"{job.name}.attach.stdout").open("w"))
            err = stack.enter_context(log.open("w"))
            process = subprocess.Popen(command, stdout=out, stderr=err)
            stack.callback(stop, process)
            attached[job.name] = (process, FirstSeen(findings), log)

        daemon_log = stack.enter_context(daemon_matching(roots, daemon_findings.path))
        with started_jobs(roots, then=attach) as jobs:
            watchers = [watcher for _, watcher, _ in attached.values()]
            run_to_their_end(jobs, daemon_findings, *watchers)
            for job in jobs:  # each attach ends with its job, after its end's findings
                process, _, log = attached[job.name]
                assert process.wait(timeout=SETTLE_SECONDS) == 0, log.read_text()[-3000:]
                assert "Traceback" not in log.read_text(), log.read_text()[-3000:]
            # the daemon states its end-of-run findings once it sees each job gone
            wait_until(settled(jobs, daemon_findings), SETTLE_SECONDS)  # judged below
    said = daemon_log.read_text()
    assert all(f"watching {job.name} (pid {job.process.pid})" in said for job in jobs), said
    attach_findings = [f for _, watcher, _ in attached.values() for f in watcher.poll()]
    by_attach = {name: watcher for name, (_, watcher, _) in attached.items()}
    by_daemon = {job.name: daemon_findings for job in jobs}
    wrong = judge(jobs, attach_findings, by_attach, "attach")
    wrong += judge(jobs, daemon_findings.poll(), by_daemon, "daemon")
    assert not wrong, "\n".join(wrong)
    print(f"daemon and attach: {time.monotonic() - began:.0f} s in all")
