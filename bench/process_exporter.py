"""driftwatch's daemon beside Debian's prometheus-process-exporter: the same 8
targets, the same interval, one run; the CPU time and resident memory of each exporter, per
target, and what each exports.

node_exporter is not in the comparison: it has no per-process metrics (only the node's
totals), so it cannot watch a training job. process-exporter is what users run today to see
one job's CPU and memory in Prometheus.

Run from the repository root, after ``make bench-deps`` (installs the Debian package)::

    .venv/bin/python bench/process_exporter.py                        # both phases, ~11 min
    .venv/bin/python bench/process_exporter.py --settled-seconds 60   # a shorter second phase
    .venv/bin/python bench/process_exporter.py --workers-per-job 0 4  # and jobs with workers

The setup. Eight real processes, as in ``bench/soak.py``'s real-time part: four ``sleep`` and
four running a real ``driftwatch.Hook`` loop (a 0.5 s step, TensorFlow probes off). One
regular expression, with a named group ``target`` capturing each one's own tag from its
command line, finds exactly these 8, and both exporters are given it.

With ``--workers-per-job W`` (W > 0) each of the 8 is a job of 1 + W processes: a Python
process (in place of ``sleep``: a 0.5 s sleep loop; or the same hooked loop) that forks W
worker processes (``multiprocessing``, as a Keras ``PyDataset``'s workers are started),
each making a small batch every 0.5 s; a worker has its parent's command line, as a forked
one does, and exits once its parent is gone. Each exporter must count each job as one
target of 1 + W processes (driftwatch's ``driftwatch_job_processes``, process-exporter's
``namedprocess_namegroup_num_procs``: it adds a tracked process's children to its group,
its ``-children`` default), else there is no verdict. Several values of ``W`` run side by
side, each with its own 8 targets, daemon, process-exporter and pattern, all at once and
scraped by the same client: ``--workers-per-job 0 4`` measures the plain 8 and the 8 jobs
with 4 workers each in one run.

Each configuration's exporters:

- ``driftwatch daemon --match REGEX --interval I`` (the default configuration otherwise, its
  history in a fresh database, findings to a file), a process of its own; the hooked four
  are found by their channels (``$DRIFTWATCH_RUNTIME_DIR``), the others by the pattern.
  The daemon looks for channels in every user's default runtime directory too
  (``/tmp/driftwatch-UID``), where other hooked jobs of this machine keep theirs (other users'
  tests, say): so that it sees the bench's alone, it runs in a mount namespace of its
  own with an empty ``/tmp`` and ``/run/user`` (``unshare``, as root; the run's files,
  channels included, are then in ``/var/tmp``). It then sees the targets as in another
  mount namespace, as a container's (their open files under ``/proc/PID/root``): the same
  reads. Where that cannot be done, it shares ``/tmp`` and the run may give no verdict.
- ``prometheus-process-exporter -config.path FILE`` with one name matcher, ``cmdline: [REGEX]``
  and ``name: "{{.Matches.target}}"``, so each target is a group of its own (one process
  each, as driftwatch's runs are), its other options Debian's defaults (``-threads``,
  ``-gather-smaps``).

process-exporter reads ``/proc`` when it is scraped, driftwatch samples on its own schedule:
this script scrapes both ``/metrics`` every ``I`` seconds with one HTTP client (the order
alternating each round), as a Prometheus with ``scrape_interval: I`` would. Both run at
once, so the machine's load falls on both alike. Each one's CPU time (user + system, from
``/proc/PID/stat``) is read at the edges of two phases:

1. young: while the targets are in their first ``YOUNG_SECONDS`` (5 minutes), when driftwatch
   samples each one every 0.5 s whatever the interval; from all 8 being watched by both to
   the youngest target's 5th minute;
2. settled: the next ``--settled-seconds``, when driftwatch samples each target every ``I``.

Resident memory: ``VmRSS`` at each phase's end and the highest seen at any scrape round of
the phase, and ``VmHWM`` (the kernel's peak since start) at the end. Per target means per
target shown: the daemon watches every hooked process on the machine, so one of another
user's would count (its log lines are printed). driftwatch's CPU time is also split into
its main thread's (discovery, sampling, detectors) and the others' (HTTP, history writer).

Exit status 0 when driftwatch's CPU per target is lower than process-exporter's in the
settled phase (the goal) in every configuration, 1 when it is not, 2 when the run could not
be made, driftwatch watched other runs beside the 8 in the settled phase (no verdict: other
jobs' samples, detectors and history are not one of the 8 targets' cost) or an exporter did
not count each job's workers into it at the settled phase's last scrape.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import platform
import re
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import psutil
from prometheus_client.parser import text_string_to_metric_families
from soak import HOOK_LOOP, HOOKED, TARGETS, mb, processes

from driftwatch.channel.env import RUNTIME_DIR_ENV
from driftwatch.channel.paths import ensure_private_dir, list_channels
from driftwatch.daemon.config import DEFAULT_INTERVAL
from driftwatch.runtime.monitor import YOUNG_SECONDS

EXPORTER = "prometheus-process-exporter"
"""Debian's process-exporter binary (package ``prometheus-process-exporter``)."""
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
"""Units of ``utime`` and ``stime`` in ``/proc/PID/stat``, per second."""
READY_TIMEOUT = 60.0
"""Seconds to wait for both exporters to show all 8 targets."""
AFTER_YOUTH = 5.0
"""Seconds between the youngest target's 5th minute and the settled phase's start."""
TARGET_LABELS = {"driftwatch": "run", "process-exporter": "groupname"}
"""The label naming a target in each exposition."""
PROCESS_FAMILIES = {
    "driftwatch": "driftwatch_job_processes",
    "process-exporter": "namedprocess_namegroup_num_procs",
}
"""The family counting each target's processes (the job's) in each exposition."""
WORKERS_JOB = """
import multiprocessing, os, sys, time
workers, channels = int(sys.argv[2]), sys.argv[3:]
if channels:
    import driftwatch
    hook = driftwatch.Hook(run=sys.argv[1], channel_dir=channels[0],
                           probe_every_steps=10**9, probe_every_seconds=1e9)
def work(parent):
    while os.getppid() == parent:
        bytes(sum(range(2000)) % 65536)
        time.sleep(0.5)
fork = multiprocessing.get_context("fork")
for _ in range(workers):
    fork.Process(target=work, args=(os.getpid(),)).start()
while True:
    if channels:
        with hook.step():
            time.sleep(0.5)
    else:
        time.sleep(0.5)
"""
"""A job of ``argv[2]`` forked workers (each a small batch every 0.5 s, until its parent is
gone); hooked when ``argv[3]`` names a channel directory (run ``argv[1]``), as
``soak.HOOK_LOOP``; ``argv[1]`` is the job's tag either way."""
PRIVATE_TMP = (
    *("unshare", "--mount", "--propagation", "private", "--", "sh", "-c"),
    "mount -t tmpfs tmpfs /tmp && { [ ! -d /run/user ] || mount -t tmpfs tmpfs /run/user; } "
    '&& exec "$@"',
    "sh",
)
"""Runs the command after it with empty ``/tmp`` and ``/run/user`` of its own (a mount
namespace: root only), the same process (``exec``)."""
WORKDIR_PARENT = "/var/tmp"
"""Where the run's files go when the daemon has a ``/tmp`` of its own: outside ``/tmp``."""


def cpu_seconds(pid: int, thread: int | None = None) -> float:
    """User + system CPU time of process ``pid`` (all its threads) or of one of its threads,
    in seconds."""
    path = f"/proc/{pid}/stat" if thread is None else f"/proc/{pid}/task/{thread}/stat"
    with open(path) as file:
        fields = file.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS  # utime, stime: fields 14, 15


def proc_memory(pid: int) -> tuple[int, int]:
    """``VmRSS`` and ``VmHWM`` (peak resident set size) of process ``pid``, in bytes."""
    with open(f"/proc/{pid}/status") as file:
        fields = dict(line.split(":", 1) for line in file if line.startswith("Vm"))
    return int(fields["VmRSS"].split()[0]) * 1024, int(fields["VmHWM"].split()[0]) * 1024


@dataclass(frozen=True, slots=True)
class Exposition:
    """What one scrape of ``/metrics`` held."""

    families: frozenset[str]
    samples: int
    targets: frozenset[str]
    """The values of the label that names a target."""
    processes: dict[str, float]
    """How many processes the exporter counts in each target (the job's)."""


def summarize(text: str, target_label: str, processes_family: str) -> Exposition:
    """The families, samples and targets in a Prometheus text exposition, and each target's
    processes (family ``processes_family``)."""
    families: set[str] = set()
    targets: set[str] = set()
    processes: dict[str, float] = {}
    samples = 0
    for family in text_string_to_metric_families(text):
        families.add(family.name)
        samples += len(family.samples)
        targets.update(s.labels[target_label] for s in family.samples if target_label in s.labels)
        if family.name == processes_family:
            processes.update(
                (s.labels[target_label], s.value)
                for s in family.samples
                if target_label in s.labels
            )
    return Exposition(frozenset(families), samples, frozenset(targets), processes)


@dataclass
class Exporter:
    """One exporter process under measurement, and what its scrapes saw."""

    name: str
    process: subprocess.Popen[bytes]
    url: str
    latencies: list[float] = field(default_factory=list)
    sizes: list[int] = field(default_factory=list)
    errors: int = 0
    last: Exposition | None = None
    counts: list[int] = field(default_factory=list)
    """How many targets each scrape of the current phase showed."""
    rss_peak: int = 0

    def scrape(self) -> None:
        """GET ``/metrics`` once; note its time, size and content; a failure is counted."""
        started = time.perf_counter()
        try:
            with urllib.request.urlopen(self.url, timeout=10) as response:
                body = response.read()
        except OSError:
            self.errors += 1
            return
        self.latencies.append(time.perf_counter() - started)
        self.sizes.append(len(body))
        self.last = summarize(body.decode(), TARGET_LABELS[self.name], PROCESS_FAMILIES[self.name])
        self.counts.append(len(self.last.targets))
        self.rss_peak = max(self.rss_peak, proc_memory(self.process.pid)[0])

    def cpu(self) -> float:
        return cpu_seconds(self.process.pid)


@dataclass
class Phase:
    """CPU time and memory of each exporter over one phase of the run."""

    name: str
    wall: float
    cpu: dict[str, float]
    rss_end: dict[str, int]
    rss_peak: dict[str, int]
    targets: dict[str, float]
    """The mean number of targets each exporter showed."""
    main_thread: float
    """Of driftwatch's CPU time, its main thread's (discovery and sampling); the rest is its
    other threads' (the HTTP server's, the history writer's)."""


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def targets(channels: Path, tag: str, workers: int) -> tuple[list[list[str]], str]:
    """The 8 commands (the hooked ones keeping their channels in ``channels``; each one a job
    of ``workers`` forked workers besides itself when ``workers`` is not 0), and the regular
    expression that finds them alone (group ``target``: each one's tag)."""
    if workers:
        job = [sys.executable, "-c", WORKERS_JOB]
        sleeps = [[*job, f"86400.{tag}{i}", str(workers)] for i in range(TARGETS - HOOKED)]
        hooked = [
            [*job, f"bench{tag}-hooked-{i}", str(workers), str(channels)] for i in range(HOOKED)
        ]
    else:
        sleeps = [["sleep", f"86400.{tag}{i}"] for i in range(TARGETS - HOOKED)]
        hooked = [
            [sys.executable, "-c", HOOK_LOOP, f"bench{tag}-hooked-{i}", str(channels)]
            for i in range(HOOKED)
        ]
    # The literal pattern (in the daemon's own command line) has "\d" where a digit is due.
    return sleeps + hooked, rf"(?P<target>86400\.{tag}\d|bench{tag}-hooked-\d)"


@dataclass
class Setup:
    """One configuration of the run: its 8 targets (each a job of 1 + ``workers``
    processes), their pattern, its files and its two exporters."""

    workers: int
    workdir: Path
    commands: list[list[str]]
    pattern: str
    exporters: list[Exporter] = field(default_factory=list)

    @property
    def channels(self) -> Path:
        return self.workdir / "channels"

    @property
    def env(self) -> dict[str, str]:
        """The environment of its targets and daemon: its own channel directory."""
        return {**os.environ, RUNTIME_DIR_ENV: str(self.channels)}

    def counted(self) -> bool:
        """Whether each exporter's last scrape showed the 8 targets, each of 1 + ``workers``
        processes."""
        return all(
            e.last is not None
            and len(e.last.targets) == TARGETS
            and all(e.last.processes.get(t) == 1 + self.workers for t in e.last.targets)
            for e in self.exporters
        )


def make_setup(workdir: Path, workers: int) -> Setup:
    tag = f"{uuid.uuid4().int % 10**6:06d}"
    directory = workdir / f"workers-{workers}"
    directory.mkdir()
    commands, pattern = targets(ensure_private_dir(directory / "channels"), tag, workers)
    return Setup(workers, directory, commands, pattern)


@contextmanager
def running(setups: list[Setup]) -> Iterator[list[subprocess.Popen[bytes]]]:
    """Every setup's targets, started together; killed and reaped afterwards (their workers
    exit once their parent is gone)."""
    commands = [command for setup in setups for command in setup.commands]
    with processes(commands, [setup.env for setup in setups for _ in setup.commands]) as started:
        yield started


class Scraper(threading.Thread):
    """Scrapes every exporter every ``interval`` seconds, the order alternating each round."""

    def __init__(self, exporters: list[Exporter], interval: float) -> None:
        super().__init__(daemon=True)
        self._exporters, self._interval = exporters, interval
        self._stop_event = threading.Event()
        self.rounds = 0

    def run(self) -> None:
        due = time.monotonic()
        while not self._stop_event.is_set():
            order = self._exporters if self.rounds % 2 == 0 else self._exporters[::-1]
            for exporter in order:
                exporter.scrape()
            self.rounds += 1
            due += self._interval
            self._stop_event.wait(max(0.0, due - time.monotonic()))

    def stop(self) -> None:
        self._stop_event.set()
        self.join()


def wait_until(condition: Callable[[], bool], timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.2)
    return False


def daemon_main_thread(setup: Setup) -> float:
    """CPU time of the main thread of ``setup``'s daemon, in seconds."""
    daemon = setup.exporters[0].process.pid
    return cpu_seconds(daemon, daemon)


def measure(setups: list[Setup], name: str, until: float) -> list[Phase]:
    """Each setup's exporters' CPU time and memory from now until the wall-clock time
    ``until``, all over the same time."""
    everyone = [e for s in setups for e in s.exporters]
    for exporter in everyone:
        exporter.rss_peak, exporter.counts = 0, []
    cpu0 = {id(e): e.cpu() for e in everyone}
    main0 = {id(s): daemon_main_thread(s) for s in setups}
    started = time.monotonic()
    time.sleep(max(0.0, until - time.time()))
    wall = time.monotonic() - started
    spent = {id(e): e.cpu() - cpu0[id(e)] for e in everyone}
    main = {id(s): daemon_main_thread(s) - main0[id(s)] for s in setups}
    phases = []
    for setup in setups:
        exporters = setup.exporters
        main_thread = main[id(setup)]
        cpu = {e.name: spent[id(e)] for e in exporters}
        rss_end = {e.name: proc_memory(e.process.pid)[0] for e in exporters}
        rss_peak = {e.name: max(e.rss_peak, rss_end[e.name]) for e in exporters}
        seen = {e.name: statistics.mean(e.counts or [0]) for e in exporters}
        label = f"{name}, {setup.workers} workers per job"
        phases.append(Phase(label, wall, cpu, rss_end, rss_peak, seen, main_thread))
    return phases


def report_phase(phase: Phase, interval: float) -> float:
    """Print one phase's table; return driftwatch's CPU per target over process-exporter's."""
    print(f"\n{phase.name}: {phase.wall:.0f} s")
    print(
        "exporter         | targets | CPU s | % of a core | ms per target per s | "
        "RSS end | RSS peak"
    )
    per_target = {}
    for name in ("driftwatch", "process-exporter"):
        cpu, count = phase.cpu[name], max(phase.targets[name], 1.0)
        per_target[name] = cpu / phase.wall / count
        print(
            f"{name:<16} | {phase.targets[name]:7.2f} | {cpu:5.2f} | "
            f"{100 * cpu / phase.wall:10.2f}% | {1e3 * per_target[name]:19.3f} | "
            f"{mb(phase.rss_end[name]):>7} | {mb(phase.rss_peak[name]):>8}"
        )
    dw, pe = per_target["driftwatch"], per_target["process-exporter"]
    ratio = dw / pe if pe > 0 else float("inf")
    rss = phase.rss_end["driftwatch"] / phase.rss_end["process-exporter"]
    print(
        f"driftwatch / process-exporter, per target (targets: the mean each showed; "
        f"{interval:g} s interval): CPU {ratio:.2f}x, RSS at the end {rss:.2f}x"
    )
    main = phase.main_thread
    print(
        f"driftwatch's CPU by thread: main (discovery, sampling, detectors) {main:.2f} s, "
        f"the others (HTTP server, history writer) {phase.cpu['driftwatch'] - main:.2f} s"
    )
    return ratio


def report_exports(exporters: list[Exporter], workdir: Path) -> None:
    print("\nwhat each exports (the last scrape):")
    for exporter in exporters:
        last = exporter.last
        if last is None:
            print(f"  {exporter.name}: no scrape succeeded")
            continue
        print(
            f"  {exporter.name}: {len(last.families)} metric families, {last.samples} samples "
            f"({last.samples / max(1, len(last.targets)):.0f} per target), "
            f"{statistics.median(exporter.sizes) / 1e3:.1f} kB per scrape, median scrape "
            f"{1e3 * statistics.median(exporter.latencies):.1f} ms, {exporter.errors} failed"
        )
    findings = workdir / "findings.jsonl"
    found = findings.read_text().splitlines() if findings.exists() else []
    history = sum(p.stat().st_size for p in workdir.glob("history.db*"))
    print(
        f"  driftwatch also: step times from the 4 hooks, the detectors on every target "
        f"({len(found)} findings), the history of every run ({mb(history)} database)"
    )
    for line in found:
        finding = json.loads(line)
        print(
            f"    {finding['run']}: [{finding['severity']}] {finding['kind']}: {finding['message']}"
        )


def foreign_runs(log: Path, pids: set[int]) -> list[str]:
    """The daemon's log lines about runs it watched besides the bench's targets (hooked
    processes of others on this machine: it watches every one)."""
    watching = re.compile(r"watching \S+ \(pid (\d+)\)")
    return [
        line.strip()
        for line in log.read_text(errors="replace").splitlines()
        if (match := watching.search(line)) and int(match.group(1)) not in pids
    ]


def private_tmp() -> bool:
    """Whether this process may start one with a ``/tmp`` of its own (``PRIVATE_TMP``)."""
    try:
        probe = subprocess.run([*PRIVATE_TMP, "true"], capture_output=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return probe.returncode == 0


def start(setup: Setup, interval: float, isolated: bool) -> list[Exporter]:
    """Both exporters of ``setup``, started together; driftwatch's first (``isolated``: with
    a ``/tmp`` of its own)."""
    workdir, pattern = setup.workdir, setup.pattern
    dw_port, pe_port = free_port(), free_port()
    config = workdir / "process-exporter.yml"
    # The pattern goes in a YAML single-quoted string: only "'" would need doubling.
    config.write_text(
        f"process_names:\n  - name: '{{{{.Matches.target}}}}'\n    cmdline:\n      - '{pattern}'\n"
    )
    daemon = subprocess.Popen(
        [
            *(PRIVATE_TMP if isolated else ()),
            *(sys.executable, "-m", "driftwatch", "daemon", "--match", pattern),
            *("--interval", f"{interval:g}", "--listen", f"127.0.0.1:{dw_port}"),
            *("--db", str(workdir / "history.db"), "--findings", str(workdir / "findings.jsonl")),
        ],
        stderr=(workdir / "daemon.log").open("wb"),
        env=setup.env,
    )
    exporter = subprocess.Popen(
        [EXPORTER, "-config.path", str(config), "-web.listen-address", f"127.0.0.1:{pe_port}"],
        stdout=subprocess.DEVNULL,
        stderr=(workdir / "process-exporter.log").open("wb"),
    )
    return [
        Exporter("driftwatch", daemon, f"http://127.0.0.1:{dw_port}/metrics"),
        Exporter("process-exporter", exporter, f"http://127.0.0.1:{pe_port}/metrics"),
    ]


def stop(exporters: list[Exporter]) -> None:
    for exporter in exporters:
        if exporter.process.poll() is None:
            exporter.process.send_signal(signal.SIGTERM)
    for exporter in exporters:
        try:
            exporter.process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            exporter.process.kill()
            exporter.process.wait()


def compare(
    workdir: Path, interval: float, settled_seconds: float, isolated: bool, workers: list[int]
) -> bool | None:
    """The whole run, one setup per value of ``workers`` side by side; whether driftwatch
    was cheaper per target once settled in every one (None: the run could not be made, or
    gave no verdict)."""
    setups = [make_setup(workdir, count) for count in workers]
    for setup in setups:
        print(
            f"{setup.workers} workers per job: {TARGETS - HOOKED} "
            f"{'sleep' if not setup.workers else 'sleeping'}, {HOOKED} hooked loops; "
            f"pattern {setup.pattern!r}"
        )
    with running(setups) as children:
        youngest = max(psutil.Process(c.pid).create_time() for c in children)
        pids = {child.pid for child in children}
        # The hooks' channels first, as for jobs already running when the daemon starts.
        for setup in setups:
            if not wait_until(
                lambda s=setup: len(list_channels(s.channels)) == HOOKED, READY_TIMEOUT
            ):
                print(f"the {HOOKED} hooked targets made no channel in {setup.channels}")
                return None
        for setup in setups:
            setup.exporters = start(setup, interval, isolated)
        everyone = [e for s in setups for e in s.exporters]
        scraper = Scraper(everyone, interval)
        try:
            scraper.start()
            if not wait_until(lambda: all(s.counted() for s in setups), READY_TIMEOUT):
                for setup in setups:
                    seen = {e.name: e.last.processes if e.last else None for e in setup.exporters}
                    print(
                        f"not every exporter saw the {TARGETS} targets of 1 + {setup.workers} "
                        f"processes in time: {seen} (logs in {setup.workdir})"
                    )
                return None
            for exporter in everyone:
                exporter.errors = 0  # refused before it listened
            age = time.time() - youngest
            print(
                f"every exporter sees all {TARGETS} targets, each with its workers, "
                f"{age:.1f} s after they started"
            )
            young = measure(
                setups, "young phase (driftwatch samples every 0.5 s)", youngest + YOUNG_SECONDS
            )
            time.sleep(AFTER_YOUTH)
            settled = measure(
                setups,
                f"settled phase (driftwatch samples every {interval:g} s)",
                time.time() + settled_seconds,
            )
            counted = {s.workers: s.counted() for s in setups}
        finally:
            scraper.stop()
            alive = [e for e in everyone if e.process.poll() is None]
            hwm = {id(e): proc_memory(e.process.pid)[1] for e in alive}
            total = {id(e): e.cpu() for e in alive}
            stop(everyone)
    print(f"scrape rounds: {scraper.rounds}, every {interval:g} s")
    verdicts: list[bool | None] = []
    for setup, young_phase, settled_phase in zip(setups, young, settled, strict=True):
        verdicts.append(
            judge(setup, young_phase, settled_phase, interval, hwm, total, pids, counted)
        )
    if any(v is None for v in verdicts):
        return None
    return all(verdicts)


def judge(
    setup: Setup,
    young: Phase,
    settled: Phase,
    interval: float,
    hwm: dict[int, int],
    total: dict[int, float],
    pids: set[int],
    counted: dict[int, bool],
) -> bool | None:
    """Report one setup's run; whether driftwatch was cheaper per target once settled (None:
    no verdict)."""
    print(f"\n== {setup.workers} workers per job ==")
    report_phase(young, interval)
    ratio = report_phase(settled, interval)
    print(
        "\nsince each started (start-up included): "
        + "; ".join(
            f"{e.name}: CPU {total[id(e)]:.2f} s, peak RSS (VmHWM) {mb(hwm[id(e)])}"
            for e in setup.exporters
            if id(e) in hwm
        )
    )
    foreign = foreign_runs(setup.workdir / "daemon.log", pids)
    if foreign:
        print("driftwatch also watched other hooked processes of this machine (log lines):")
        for line in foreign:
            print(f"  {line}")
    report_exports(setup.exporters, setup.workdir)
    if settled.targets["driftwatch"] != TARGETS:
        print(
            f"\nno verdict: driftwatch watched {settled.targets['driftwatch']:.2f} runs on average "
            f"once settled, not {TARGETS} (other jobs on this machine): run it again"
        )
        return None
    if not counted[setup.workers]:
        seen = {e.name: e.last.processes if e.last else None for e in setup.exporters}
        print(
            f"\nno verdict: at the settled phase's end an exporter did not count 1 + "
            f"{setup.workers} processes in each target: {seen}"
        )
        return None
    cheaper = ratio < 1.0
    print(
        f"\ngoal ({setup.workers} workers per job): driftwatch's CPU per target lower than "
        f"process-exporter's once settled ({ratio:.2f}x): {'met' if cheaper else 'MISSED'}"
    )
    return cheaper


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument(
        "--interval",
        type=float,
        default=DEFAULT_INTERVAL,
        help="driftwatch's sampling interval and both exporters' scrape interval, in seconds "
        "(default: the daemon's)",
    )
    parser.add_argument(
        "--settled-seconds", type=float, default=300.0, help="length of the settled phase"
    )
    parser.add_argument(
        "--workers-per-job",
        type=int,
        nargs="+",
        default=[0],
        metavar="W",
        help="worker processes forked by each target; several values run side by side, each "
        "with its own targets and exporters (default: 0, the 8 targets alone)",
    )
    args = parser.parse_args()
    if len(set(args.workers_per_job)) != len(args.workers_per_job) or min(args.workers_per_job) < 0:
        parser.error("--workers-per-job: distinct values, 0 or more")
    if shutil.which(EXPORTER) is None:
        print(f"{EXPORTER} is not installed: run `make bench-deps` (as root)", file=sys.stderr)
        return 2
    logging.getLogger("driftwatch").setLevel(logging.ERROR)
    version = subprocess.run([EXPORTER, "-version"], capture_output=True, text=True)
    print(
        f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; Python "
        f"{platform.python_version()}; {os.cpu_count()} CPUs; load average "
        f"{os.getloadavg()[0]:.1f}; {(version.stdout or version.stderr).strip().splitlines()[0]}"
    )
    isolated = private_tmp()
    print(
        "the daemon has a /tmp and /run/user of its own: it sees the bench's channels alone"
        if isolated
        else "the daemon shares /tmp (no mount namespace here): it may watch other hooked jobs"
    )
    parent = WORKDIR_PARENT if isolated else None
    with tempfile.TemporaryDirectory(prefix="driftwatch-vs-pe-", dir=parent) as tmp:
        # Each setup's targets and daemon have its own channel directory (``Setup.env``).
        cheaper = compare(
            Path(tmp), args.interval, args.settled_seconds, isolated, args.workers_per_job
        )
    print(f"load average at the end: {os.getloadavg()[0]:.1f}")
    if cheaper is None:
        return 2
    return 0 if cheaper else 1


if __name__ == "__main__":
    sys.exit(main())
