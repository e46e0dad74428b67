"""``driftwatch daemon``: discovery by channel and by pattern, naming, reload, signals.

The ``Daemon`` class is driven tick by tick in this process against real processes and real
channel files; the command runs as a real subprocess, scraped over real HTTP and signalled
for real. The acceptance test trains two real Keras models under it.
"""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
import signal
import stat
import struct
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest
from prometheus_client.parser import text_string_to_metric_families

from driftwatch.channel.paths import channel_dirs, ensure_private_dir
from driftwatch.channel.ring import ChannelWriter
from driftwatch.channel.wire import SERIES_META, RecordKind
from driftwatch.daemon.agent import Daemon
from driftwatch.daemon.config import Config, load_config
from driftwatch.daemon.discovery import SCAN_EVERY_TICKS, SWEEP_AFTER_SECONDS
from driftwatch.detect import Engine
from driftwatch.errors import HistoryError, UsageError
from driftwatch.findings import Finding
from driftwatch.history.reader import HistoryReader, RunRecord
from driftwatch.runtime.monitor import YOUNG_SECONDS
from driftwatch.target.pidns import ProcessId, identify
from tests.conftest import (
    CONTAINED_HOOK,
    TF_ENV,
    in_pid_namespace,
    needs_pid_namespaces,
    run_cli,
    unused_pid,
    wait_for,
)

# -- helpers -----------------------------------------------------------------------------------

needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="needs root (chown, chattr)")


def unique_sleep() -> tuple[list[str], str]:
    """A sleep command no other process on the machine runs, and a pattern for it alone."""
    seconds = f"300.{uuid.uuid4().int % 10**9}"
    return ["sleep", seconds], f"^sleep {re.escape(seconds)}$"


Sleepers = tuple[list[subprocess.Popen[bytes]], str]


@pytest.fixture
def sleepers() -> Iterator[Sleepers]:
    """Two processes running the same unique command, and the pattern that finds them."""
    command, pattern = unique_sleep()
    children = [subprocess.Popen(command) for _ in range(2)]
    yield children, pattern
    for child in children:
        child.kill()
        child.wait()


def make_daemon(channels: Path, *matches: str) -> Daemon:
    """A daemon that looks for channels in ``channels`` only, and removes those of exited
    processes at once."""
    return Daemon(
        lambda: load_config(None, matches, 0.1),
        directories=lambda config: [channels],
        sweep_after=0.0,
    )


class HookChannels:
    """Channel files as the hooks of other processes would write them.

    A channel stays open, and so looks alive, until ``exit`` or the end of the test.
    """

    def __init__(self) -> None:
        self.writers: dict[Path, ChannelWriter] = {}

    def __call__(
        self,
        directory: Path,
        pid: int,
        run: str | None,
        nonfinite: int = 0,
        start_ticks: int | None = None,
        rank: str | None = None,
    ) -> Path:
        """The channel of process ``pid`` (or, with ``start_ticks``, of an earlier one with
        that PID), with ``run`` (and ``rank``, if given) in its metadata (none: no metadata
        yet) and a count of ``nonfinite`` NaN losses."""
        process = identify(pid) if start_ticks is None else ProcessId(pid, start_ticks, 1)
        create_time = psutil.Process(pid).create_time() if start_ticks is None else 1e9
        writer = ChannelWriter.create(ensure_private_dir(directory), process, create_time, 16)
        if run is not None:
            ranked = {} if rank is None else {"rank": rank}
            meta = {"run": run, "pid": pid, SERIES_META: [["hook_nonfinite_total", {}]]}
            writer.set_meta(meta | ranked)
        if nonfinite:
            writer.write(RecordKind.VALUE, 0, time.time(), float(nonfinite))
        self.writers[writer.path] = writer
        return writer.path

    def exit(self, path: Path) -> None:
        """Leave the channel ``path`` as its writer does when it is killed."""
        self.writers.pop(path).close()


@pytest.fixture
def hook_channel() -> Iterator[HookChannels]:
    channels = HookChannels()
    yield channels
    for writer in channels.writers.values():
        writer.close()


class DaemonProcess:
    """``driftwatch daemon`` as a subprocess; its stderr lines are collected as they come."""

    def __init__(self, *args: str, env: dict[str, str] | None = None) -> None:
        self.process = subprocess.Popen(
            [sys.executable, "-m", "driftwatch", "daemon", "--listen", "127.0.0.1:0", *args],
            stderr=subprocess.PIPE,
            text=True,
            env={**os.environ, **(env or {})},
        )
        self.lines: list[str] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()
        wait_for(lambda: self._url() is not None, 30, "the daemon to serve /metrics")
        url = self._url()
        assert url is not None
        self.url = url

    def _read(self) -> None:
        assert self.process.stderr is not None
        self.lines.extend(self.process.stderr)

    def _url(self) -> str | None:
        if self.process.poll() is not None:
            pytest.fail(f"the daemon exited early: {''.join(self.lines)}")
        found = (re.search(r"metrics at (https?://\S+)", line) for line in list(self.lines))
        return next((match.group(1) for match in found if match), None)

    def targets(self) -> list[dict[str, str]]:
        """The labels of each run's ``driftwatch_target_info``."""
        with urllib.request.urlopen(self.url, timeout=10) as response:
            text = response.read().decode()
        return [
            sample.labels
            for family in text_string_to_metric_families(text)
            for sample in family.samples
            if sample.name == "driftwatch_target_info"
        ]

    def runs(self) -> dict[str, str]:
        """The pid of each run in ``driftwatch_target_info``, by run name."""
        return {labels["run"]: labels["pid"] for labels in self.targets()}

    def series_of(self, run: str) -> set[str]:
        with urllib.request.urlopen(self.url, timeout=10) as response:
            text = response.read().decode()
        return {
            sample.name
            for family in text_string_to_metric_families(text)
            for sample in family.samples
            if sample.labels.get("run") == run
        }

    def stop(self, signum: int = signal.SIGTERM) -> int:
        self.process.send_signal(signum)
        code = self.process.wait(timeout=30)
        self._reader.join(timeout=10)
        return code

    def kill(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait()


@pytest.fixture
def daemons() -> Iterator[list[DaemonProcess]]:
    """Daemons a test starts; killed afterwards if the test left them running."""
    started: list[DaemonProcess] = []
    yield started
    for daemon in started:
        daemon.kill()


# -- configuration -------------------------------------------------------------------------------


def test_command_line_patterns_join_the_file_and_its_interval_yields(tmp_path: Path) -> None:
    path = tmp_path / "daemon.toml"
    path.write_text(
        'interval = 5\nchannel_dirs = ["/srv/channels"]\n'
        '[[match]]\npattern = "train\\\\.py"\nlogdirs = ["/data/tb"]\n'
    )
    config = load_config(path, ["^python -m trainer"], None)
    assert config.interval == 5
    assert config.channel_dirs == (Path("/srv/channels"),)
    assert [rule.pattern.pattern for rule in config.rules] == ["^python -m trainer", r"train\.py"]
    assert config.rule_for("python train.py --epochs 3") == config.rules[1]
    assert config.rules[1].logdirs == (Path("/data/tb"),)
    assert config.rule_for("python eval.py") is None
    assert load_config(path, [], 0.5).interval == 0.5
    assert load_config(None).interval == Config().interval


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ("interval = [", "not valid TOML"),
        ("intervall = 2", "unknown key 'intervall'"),
        ("interval = 0", "interval 0.0: must be between"),
        ('interval = "2s"', "interval must be a number"),
        ('[[match]]\npattern = "("', "match #1: bad regular expression '('"),
        ("[[match]]\nlogdirs = []", "match #1: needs a pattern"),
        ('match = "x"', "match must be an array of tables"),
        ('channel_dirs = "/srv"', "channel_dirs: expected a list of paths"),
    ],
)
def test_a_bad_configuration_is_one_line_error(tmp_path: Path, text: str, needle: str) -> None:
    path = tmp_path / "daemon.toml"
    path.write_text(text)
    with pytest.raises(UsageError, match=re.escape(needle)):
        load_config(path)
    result = run_cli("daemon", "--config", str(path), "--listen", "127.0.0.1:0")
    assert result.returncode == 1
    assert result.stderr.count("\n") == 1, result.stderr
    assert needle in result.stderr


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--config", "/nonexistent/daemon.toml"], "cannot read it: No such file"),
        (["--match", "(unclosed"], "--match: bad regular expression"),
        (["--interval", "0"], "--interval 0.0: must be between"),
        (["--retention", "soon"], "--retention 'soon' needs a unit"),
        (["--db", "/proc/self/history.db"], "cannot use the history /proc/self/history.db"),
    ],
)
def test_bad_options_are_one_line_errors(args: list[str], needle: str) -> None:
    result = run_cli("daemon", "--listen", "127.0.0.1:0", *args)
    assert result.returncode == 1
    assert result.stderr.count("\n") == 1, result.stderr
    assert needle in result.stderr


def test_every_users_runtime_directory_is_searched(tmp_path: Path) -> None:
    own = ensure_private_dir(f"/tmp/driftwatch-{os.geteuid()}")
    shared = tmp_path / "shared [1]"  # glob characters in it match themselves
    for name in ("1000", "0", "lost+found"):
        (shared / name).mkdir(parents=True)
    environ = {"DRIFTWATCH_RUNTIME_DIR": "/run/dw", "DRIFTWATCH_SHARED_DIR": str(shared)}
    found = channel_dirs([Path("/srv/x")], environ)
    assert found[:4] == [Path("/srv/x"), Path("/run/dw"), shared / "0", shared / "1000"]
    assert own in found
    assert all(re.match(r"/(tmp/driftwatch-|run/user/)\d+", str(path)) for path in found[4:])


# -- discovery, in this process -------------------------------------------------------------------


def test_matching_processes_are_watched_with_unique_names_and_dropped_when_they_exit(
    tmp_path: Path, sleepers: Sleepers
) -> None:
    (first, second), pattern = sorted(sleepers[0], key=lambda child: child.pid), sleepers[1]
    daemon = make_daemon(tmp_path, pattern)
    daemon.tick()
    assert daemon.runs == {"sleep": first.pid, f"sleep-{second.pid}": second.pid}
    assert {s.run for s in daemon.snapshots} == {"sleep", f"sleep-{second.pid}"}
    assert all(s.ticks == 1 for s in daemon.snapshots)
    first.kill()
    first.wait()
    daemon.tick()
    assert daemon.runs == {f"sleep-{second.pid}": second.pid}  # names stay stable
    daemon.close()
    assert daemon.snapshots == ()


FORKING_JOB = """
import os, sys, time
for _ in range(3):  # workers with the job's own command line, as fork makes them
    if os.fork() == 0:
        time.sleep(300)
        os._exit(0)
print("ready", flush=True)
time.sleep(300)
"""


def test_a_matched_jobs_forked_workers_are_part_of_its_job_not_jobs_of_their_own(
    tmp_path: Path,
) -> None:
    # Expected: the pattern finds the job and its 3 workers alike (fork keeps the command
    # line); the daemon watches one run, the job, whose process count holds the workers.
    marker = f"forking-job-{uuid.uuid4().hex}"
    job = subprocess.Popen(
        [sys.executable, "-c", FORKING_JOB, marker], stdout=subprocess.PIPE, text=True
    )
    try:
        assert job.stdout is not None
        assert job.stdout.readline().strip() == "ready"
        assert len(psutil.Process(job.pid).children()) == 3
        daemon = make_daemon(tmp_path, re.escape(marker))
        daemon.tick()
        assert list(daemon.runs.values()) == [job.pid]
        (snapshot,) = daemon.snapshots
        assert snapshot.values[("job_processes", ())] == 4
        daemon.close()
    finally:
        for child in psutil.Process(job.pid).children():
            child.kill()
        job.kill()
        job.wait()


@pytest.mark.parametrize(("age", "evaluations"), [(10.0, 11), (YOUNG_SECONDS + 100, 3)])
def test_a_settled_targets_detectors_judge_it_every_ten_seconds(
    tmp_path: Path,
    sleepers: Sleepers,
    monkeypatch: pytest.MonkeyPatch,
    age: float,
    evaluations: int,
) -> None:
    (child, _), pattern = sleepers  # two processes: each is judged
    judged: list[float] = []
    evaluate = Engine.evaluate

    def counted(self: Engine, now: float, *, final: bool = False) -> list[Finding]:
        judged.append(now)
        return evaluate(self, now, final=final)

    monkeypatch.setattr(Engine, "evaluate", counted)
    started = psutil.Process(child.pid).create_time()
    now = started + age
    daemon = Daemon(
        lambda: load_config(None, [pattern], 2.0),
        directories=lambda config: [tmp_path],
        clock=lambda: now,
    )
    for tick in range(11):  # 20 s of 2-s samples
        now = started + age + 2.0 * tick
        daemon.tick()
    daemon.close()
    assert len(judged) == 2 * evaluations, [t - started for t in judged]


def test_the_process_table_is_scanned_every_few_ticks(tmp_path: Path) -> None:
    scans = 0

    def scan() -> list[tuple[int, float, str]]:
        nonlocal scans
        scans += 1
        return []

    daemon = Daemon(lambda: load_config(None, ["x"], 0.1), directories=lambda config: [], scan=scan)
    for _ in range(10):
        daemon.tick()
    assert scans == 2


def test_the_daemon_never_watches_itself_or_its_parents(tmp_path: Path) -> None:
    own = [(p.pid, p.create_time(), "me") for p in [psutil.Process(), *psutil.Process().parents()]]
    daemon = Daemon(
        lambda: load_config(None, ["me"], 0.1),
        directories=lambda config: [tmp_path],
        scan=lambda: own,
    )
    daemon.tick()
    assert daemon.runs == {}


def test_hooked_processes_are_named_by_their_channel(
    tmp_path: Path, sleepers: Sleepers, hook_channel: HookChannels
) -> None:
    first, second = sorted(sleepers[0], key=lambda child: child.pid)
    for child in (first, second):
        hook_channel(tmp_path, child.pid, "resnet")
    daemon = make_daemon(tmp_path)
    daemon.tick()
    assert daemon.runs == {"resnet": first.pid, f"resnet-{second.pid}": second.pid}
    snapshot = next(s for s in daemon.snapshots if s.run == "resnet")
    assert {status.name for status in snapshot.sources} >= {"process", "hook"}
    daemon.close()


def test_hooked_ranks_of_one_job_are_told_apart_by_the_rank_their_hooks_give(
    tmp_path: Path, sleepers: Sleepers, hook_channel: HookChannels
) -> None:
    # Expected: two processes whose hooks name the run "resnet", ranks 0 and 1 (a process
    # in a container of another user, whose environment the daemon may not read, tells its
    # rank only so): one run name, two ranks.
    first, second = sorted(sleepers[0], key=lambda child: child.pid)
    for rank, child in enumerate((first, second)):
        hook_channel(tmp_path, child.pid, "resnet", rank=str(rank))
    daemon = make_daemon(tmp_path)
    daemon.tick()
    assert daemon.runs == {"resnet (0)": first.pid, "resnet (1)": second.pid}
    assert {(s.run, s.rank) for s in daemon.snapshots} == {("resnet", "0"), ("resnet", "1")}
    daemon.close()


def test_a_new_channel_is_found_at_the_next_tick_and_a_new_directory_within_a_scan(
    tmp_path: Path, sleepers: Sleepers, hook_channel: HookChannels
) -> None:
    first, second = sorted(sleepers[0], key=lambda child: child.pid)
    known, later = tmp_path / "known", tmp_path / "later"
    ensure_private_dir(known)
    daemon = Daemon(
        lambda: load_config(None, [], 0.1),
        directories=lambda config: [d for d in (known, later) if d.is_dir()],
    )
    daemon.tick()
    hook_channel(known, first.pid, "in-known")
    hook_channel(later, second.pid, "in-later")  # a user's first hooked job: a new directory
    daemon.tick()
    assert daemon.runs == {"in-known": first.pid}
    for _ in range(SCAN_EVERY_TICKS - 1):
        daemon.tick()
    assert daemon.runs == {"in-known": first.pid, "in-later": second.pid}
    daemon.close()


def test_a_channel_without_metadata_waits_one_tick_for_it(
    tmp_path: Path, sleeper: subprocess.Popen[bytes], hook_channel: HookChannels
) -> None:
    path = hook_channel(tmp_path, sleeper.pid, None)
    daemon = make_daemon(tmp_path)
    daemon.tick()
    assert daemon.runs == {}
    path.with_suffix(".json").write_text('{"run": "late"}')
    daemon.tick()
    assert daemon.runs == {"late": sleeper.pid}
    daemon.close()


def test_channels_of_exited_processes_are_removed(
    tmp_path: Path, sleeper: subprocess.Popen[bytes], hook_channel: HookChannels
) -> None:
    live = hook_channel(tmp_path, sleeper.pid, "live")
    exited = hook_channel(tmp_path, unused_pid(), "exited", start_ticks=1)
    older = identify(sleeper.pid).start_ticks - 100
    reused = hook_channel(tmp_path, sleeper.pid, "reused", start_ticks=older)  # same PID
    for path in (exited, reused):
        hook_channel.exit(path)
    daemon = make_daemon(tmp_path)
    daemon.tick()
    assert daemon.runs == {"live": sleeper.pid}
    assert live.exists()
    assert not exited.exists()
    assert not exited.with_suffix(".json").exists()
    assert not reused.exists()
    sleeper.kill()
    sleeper.wait()
    daemon.tick()
    assert daemon.runs == {}
    assert not live.exists()  # swept as soon as its process is gone


def test_the_channel_of_an_exited_process_is_left_a_while_for_its_other_readers(
    tmp_path: Path, sleeper: subprocess.Popen[bytes], hook_channel: HookChannels
) -> None:
    """``driftwatch run`` (or a second daemon) watching the same job reads its last records
    after the job exits, and needs the metadata beside them: not removed at once."""
    path = hook_channel(tmp_path, sleeper.pid, "shared")
    daemon = Daemon(
        lambda: load_config(None, (), 0.1),
        directories=lambda config: [tmp_path],
        sweep_after=SWEEP_AFTER_SECONDS,
    )
    daemon.tick()
    assert daemon.runs == {"shared": sleeper.pid}
    sleeper.kill()
    sleeper.wait()
    daemon.tick()
    daemon.tick()
    assert daemon.runs == {}
    assert path.exists()
    assert path.with_suffix(".json").exists()
    # Nor when the daemon stops (else one daemon stopping would remove the channel of a job
    # killed a moment before, whose last records another daemon watching it could then not
    # read): a later discovery finds its writer gone and removes it.
    daemon.close()
    assert path.with_suffix(".json").exists()


@pytest.mark.parametrize("problem", ["older format", "not a channel"])
def test_an_unreadable_channel_is_removed_once_no_process_writes_it(
    tmp_path: Path,
    sleeper: subprocess.Popen[bytes],
    caplog: pytest.LogCaptureFixture,
    hook_channel: HookChannels,
    problem: str,
) -> None:
    """A channel an older driftwatch's hook left behind, or a stray file named like one, is
    removed quietly when nobody writes it, and refused once while its writer lives."""
    held = hook_channel(tmp_path, sleeper.pid, "held")
    left = hook_channel(tmp_path, unused_pid(), "left", start_ticks=1)
    hook_channel.exit(left)
    for path in (held, left):
        with path.open("r+b") as channel:
            if problem == "older format":
                channel.seek(8)  # the format version, after the magic
                channel.write(struct.pack("<I", 1))
            else:
                channel.write(b"\0" * 8)
    daemon = make_daemon(tmp_path)
    with caplog.at_level(logging.INFO, logger="driftwatch.daemon"):
        for _ in range(SCAN_EVERY_TICKS + 1):
            daemon.tick()
    assert daemon.runs == {}
    assert not left.exists()
    assert not left.with_suffix(".json").exists()
    assert held.exists()
    why = (
        "channel format version 1 with 40-byte records; this driftwatch reads version 2"
        if problem == "older format"
        else "not a driftwatch channel (bad magic)"
    )
    lines = [(r.levelname, r.getMessage()) for r in caplog.records]
    (removal,) = [(level, line) for level, line in lines if str(left) in line]
    assert removal[0] == "INFO"
    assert removal[1].startswith(f"removed {left}: no process writes it, and it is unreadable")
    assert why in removal[1]
    (refusal,) = [(level, line) for level, line in lines if str(held) in line]
    assert refusal[0] == "WARNING"
    assert refusal[1].startswith(f"not watching the channel {held}: ")
    assert why in refusal[1]


@needs_root
def test_a_channel_that_cannot_be_removed_is_reported_once(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, hook_channel: HookChannels
) -> None:
    path = hook_channel(tmp_path, unused_pid(), "exited", start_ticks=1)
    hook_channel.exit(path)
    subprocess.run(["chattr", "+i", path], check=True)  # not even root may remove it
    try:
        daemon = make_daemon(tmp_path)
        with caplog.at_level(logging.WARNING):
            for _ in range(SCAN_EVERY_TICKS + 1):
                daemon.tick()
        assert [r.getMessage() for r in caplog.records if "cannot remove" in r.getMessage()] == [
            f"driftwatch: cannot remove {path}: [Errno 1] Operation not permitted: '{path}'"
        ]
    finally:
        subprocess.run(["chattr", "-i", path], check=True)


@needs_root
@pytest.mark.parametrize(
    ("chowned", "refusal"),
    [
        ("file", "is owned by uid 65534, not by the watched process's user (uid 0)"),
        ("both", "is in a directory of uid 65534, but process {pid} runs as uid 0"),
    ],
)
def test_a_channel_of_another_user_than_its_process_is_refused_once(
    tmp_path: Path,
    sleeper: subprocess.Popen[bytes],
    caplog: pytest.LogCaptureFixture,
    hook_channel: HookChannels,
    chowned: str,
    refusal: str,
) -> None:
    path = hook_channel(tmp_path, sleeper.pid, "x")
    os.chown(path, 65534, 65534)
    if chowned == "both":
        os.chown(tmp_path, 65534, 65534)
    daemon = make_daemon(tmp_path)
    with caplog.at_level(logging.WARNING, logger="driftwatch.daemon"):
        daemon.tick()
        daemon.tick()
    assert daemon.runs == {}
    assert path.exists()
    refusals = [r.getMessage() for r in caplog.records if str(path) in r.getMessage()]
    assert len(refusals) == 1
    assert refusal.format(pid=sleeper.pid) in refusals[0]


def test_an_unsafe_channel_directory_is_skipped_once(
    tmp_path: Path,
    sleeper: subprocess.Popen[bytes],
    caplog: pytest.LogCaptureFixture,
    hook_channel: HookChannels,
) -> None:
    hook_channel(tmp_path, sleeper.pid, "x")
    tmp_path.chmod(0o777)
    daemon = make_daemon(tmp_path)
    with caplog.at_level(logging.WARNING, logger="driftwatch.daemon"):
        daemon.tick()
        daemon.tick()
    assert daemon.runs == {}
    skipped = [r.getMessage() for r in caplog.records if "skipping" in r.getMessage()]
    assert len(skipped) == 1
    assert skipped[0].startswith(f"skipping the channel directory {tmp_path}: ")
    assert "is open to other users (mode 0777)" in skipped[0]


def test_a_live_channel_whose_process_is_out_of_sight_is_kept_and_refused_once(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, hook_channel: HookChannels
) -> None:
    # Its writer lives (this test holds the channel open) in no PID namespace that the
    # daemon sees, as when a DaemonSet lacks hostPID: removing it would break the hook.
    path = hook_channel(tmp_path, unused_pid(), "hidden", start_ticks=1)
    daemon = make_daemon(tmp_path)
    with caplog.at_level(logging.WARNING, logger="driftwatch.daemon"):
        for _ in range(SCAN_EVERY_TICKS + 1):
            daemon.tick()
    assert daemon.runs == {}
    assert path.exists()
    assert [r.getMessage() for r in caplog.records] == [
        f"not watching the channel {path}: its process (pid {path.name.split('-')[0]} in PID "
        "namespace 1) is not in sight: it needs the host's PID namespace (hostPID) and ptrace "
        "access (CAP_SYS_PTRACE)"
    ]


@needs_pid_namespaces
def test_a_hooked_process_in_its_own_pid_namespace_is_watched_under_the_pid_seen_here(
    tmp_path: Path,
) -> None:
    channels = tmp_path / "channels"
    with in_pid_namespace(CONTAINED_HOOK, str(channels)) as (contained, pid):
        assert contained.stdout is not None
        assert contained.stdout.readline() == "hooked\n"
        (path,) = channels.glob("*.dwc")
        assert path.name.startswith("1-")  # the PID in its own namespace
        daemon = make_daemon(channels)
        daemon.tick()
        assert daemon.runs == {"contained": pid}
        (snapshot,) = daemon.snapshots
        assert {name for name, _ in snapshot.values} >= {"step_seconds", "train_step"}
        os.kill(pid, signal.SIGKILL)  # no chance to clean up, as from the OOM killer
        wait_for(lambda: not psutil.pid_exists(pid), 10, "the hooked process to be reaped")
        daemon.tick()
        assert daemon.runs == {}
        assert list(channels.iterdir()) == []  # its channel was swept


def test_reload_drops_what_no_pattern_finds_and_keeps_the_old_config_when_bad(
    tmp_path: Path,
    sleepers: Sleepers,
    caplog: pytest.LogCaptureFixture,
) -> None:
    children, pattern = sleepers
    patterns = [pattern]
    broken = False

    def load() -> Config:
        if broken:
            raise UsageError("daemon.toml: not valid TOML")
        return load_config(None, patterns, 0.1)

    daemon = Daemon(load, directories=lambda config: [tmp_path])
    daemon.tick()
    assert sorted(daemon.runs.values()) == sorted(child.pid for child in children)
    broken = True
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="driftwatch.daemon"):
        daemon.reload()
    assert [r.getMessage() for r in caplog.records] == [
        "configuration not reloaded, keeping the previous one: daemon.toml: not valid TOML"
    ]
    assert daemon.config.rules[0].pattern.pattern == pattern
    broken = False
    patterns = ["^nothing$"]
    daemon.reload()
    assert daemon.runs == {}
    daemon.close()


# -- the command --------------------------------------------------------------------------------


def test_match_picks_up_processes_started_after_it_and_drops_them(
    daemons: list[DaemonProcess], tmp_path: Path
) -> None:
    command, pattern = unique_sleep()
    daemons.append(DaemonProcess("--match", pattern, "--interval", "0.1"))
    daemon = daemons[0]
    children = [subprocess.Popen(command) for _ in range(2)]
    try:
        pids = sorted(str(child.pid) for child in children)
        wait_for(lambda: set(pids) <= set(daemon.runs().values()), 20, "both sleepers watched")
        runs = {pid: run for run, pid in daemon.runs().items() if pid in pids}
        assert sorted(runs.values()) == sorted(["sleep", f"sleep-{pids[1]}"])
        assert "driftwatch_process_resident_memory_bytes" in daemon.series_of("sleep")
    finally:
        for child in children:
            child.kill()
            child.wait()
    wait_for(lambda: not set(pids) & set(daemon.runs().values()), 20, "both runs dropped")
    assert daemon.series_of("sleep") == set()
    stopped = [line for line in daemon.lines if line.startswith("driftwatch: stopped watching")]
    for pid in pids:  # the machine's other hooked processes may come and go as well
        assert sum(f"(pid {pid}): process {pid} has exited\n" in line for line in stopped) == 1
    assert daemon.stop(signal.SIGTERM) == 0


def test_sighup_rereads_the_configuration_file(
    daemons: list[DaemonProcess], tmp_path: Path, sleeper: subprocess.Popen[bytes]
) -> None:
    command, pattern = unique_sleep()
    config = tmp_path / "daemon.toml"
    config.write_text("interval = 0.1\n")
    daemons.append(DaemonProcess("--config", str(config)))
    daemon = daemons[0]
    child = subprocess.Popen(command)
    try:
        config.write_text(f"interval = 0.1\n[[match]]\npattern = '{pattern}'\n")
        daemon.process.send_signal(signal.SIGHUP)
        wait_for(lambda: str(child.pid) in daemon.runs().values(), 20, "the reload to find it")
        config.write_text("interval = [")
        daemon.process.send_signal(signal.SIGHUP)
        wait_for(
            lambda: any("configuration not reloaded" in line for line in daemon.lines),
            20,
            "the bad configuration to be reported",
        )
        assert str(child.pid) in daemon.runs().values()  # the previous configuration holds
        assert daemon.process.poll() is None
    finally:
        child.kill()
        child.wait()
    assert daemon.stop(signal.SIGTERM) == 0


@pytest.mark.parametrize(("signum", "code"), [(signal.SIGTERM, 0), (signal.SIGINT, 130)])
def test_signals_stop_the_daemon(daemons: list[DaemonProcess], signum: int, code: int) -> None:
    daemons.append(DaemonProcess("--interval", "0.1"))
    assert daemons[0].stop(signum) == code
    assert not any("Traceback" in line for line in daemons[0].lines)


@pytest.fixture
def shared_dir() -> Iterator[Path]:
    """A directory every user may make their own directory in, as the DaemonSet's hostPath:
    outside the test's private temporary directory, which other users cannot enter."""
    path = Path(tempfile.mkdtemp(prefix="driftwatch-shared-"))
    path.chmod(0o1777)
    yield path
    shutil.rmtree(path)


@needs_root
@needs_pid_namespaces
def test_a_contained_job_of_another_user_is_watched_through_a_shared_directory(
    daemons: list[DaemonProcess], shared_dir: Path
) -> None:
    # The layout of deploy/kubernetes: the job, in its own PID namespace and as an ordinary
    # user, makes its private directory in the shared one; the daemon, as root, finds it
    # there, watches the job under the PID it sees, and removes its channel once it is killed.
    env = {"DRIFTWATCH_SHARED_DIR": str(shared_dir)}
    daemons.append(DaemonProcess("--interval", "0.1", env=env))
    daemon = daemons[0]
    with in_pid_namespace(CONTAINED_HOOK, uid=65534, env=env) as (contained, pid):
        assert contained.stdout is not None
        assert contained.stdout.readline() == "hooked\n"
        private = shared_dir / "65534"
        assert (private.stat().st_uid, stat.S_IMODE(private.stat().st_mode)) == (65534, 0o700)
        wait_for(lambda: daemon.runs().get("contained") == str(pid), 20, "the job watched")
        os.kill(pid, signal.SIGKILL)
        wait_for(lambda: "contained" not in daemon.runs(), 20, "the job dropped")
    wait_for(lambda: list(private.iterdir()) == [], SWEEP_AFTER_SECONDS + 10, "the sweep")
    assert daemon.stop() == 0


@pytest.mark.parametrize("rank", [None, "worker:1"])
def test_findings_of_every_run_are_logged_and_appended(
    daemons: list[DaemonProcess],
    tmp_path: Path,
    sleeper: subprocess.Popen[bytes],
    hook_channel: HookChannels,
    rank: str | None,
) -> None:
    # Expected: a NaN loss the hook counted is a finding of its run, logged and appended as
    # a JSON line; a rank of a distributed job is named in both (a line of one process's
    # run has no rank field).
    findings = tmp_path / "findings.jsonl"
    channels = tmp_path / "channels"
    run = f"nan-{uuid.uuid4().hex[:8]}"
    daemon = DaemonProcess(
        "--interval",
        "0.1",
        "--findings",
        str(findings),
        env={"DRIFTWATCH_RUNTIME_DIR": str(channels)},
    )
    daemons.append(daemon)
    hook_channel(channels, sleeper.pid, run, 2, rank=rank)
    wait_for(lambda: run in findings.read_text(), 20, "the finding in the findings file")
    found = [json.loads(line) for line in findings.read_text().splitlines()]
    ours = [(f["run"], f.get("rank"), f["kind"]) for f in found if f["run"] == run]
    assert ours == [(run, rank, "nonfinite")]
    # Logged before it is written to the file; this test reads the log from a pipe on a
    # thread of its own, which may be behind.
    title = run if rank is None else f"{run} ({rank})"
    logged = f"driftwatch: {title}: [critical] nonfinite: "
    wait_for(
        lambda: any(line.startswith(logged) for line in list(daemon.lines)), 10, "the log line"
    )
    assert daemon.stop() == 0


# -- history -------------------------------------------------------------------------------------


def recorded_runs(db: Path, children: list[subprocess.Popen[bytes]]) -> dict[int, RunRecord]:
    """The runs of ``children`` the history holds, by PID (the daemon also records the
    machine's other hooked processes)."""
    try:
        reader = HistoryReader(db)
    except HistoryError:  # not created yet
        return {}
    try:
        pids = {child.pid for child in children}
        return {run.pid: run for run in reader.runs() if run.pid in pids}
    finally:
        reader.close()


def reported_rss(db: Path, run: RunRecord) -> tuple[float, float]:
    """When the run's RSS begins and ends in ``driftwatch report --json``."""
    result = run_cli("report", "--db", str(db), "--json", str(run.id))
    assert result.returncode == 0, result.stderr
    rss = next(s for s in json.loads(result.stdout)["series"] if s["series"] == "rss_bytes")
    return rss["first"]["t"], rss["last"]["t"]


def rss_bucket_starts(db: Path, run: RunRecord) -> list[float]:
    """The starts of the run's 10-second RSS buckets in the history."""
    reader = HistoryReader(db)
    try:
        return [b.start for b in reader.series(run.id)[("rss_bytes", ())] if b.width == 10.0]
    finally:
        reader.close()


def test_the_ranks_of_one_job_on_one_node_share_its_run_name_and_differ_by_rank(
    daemons: list[DaemonProcess], tmp_path: Path
) -> None:
    # Expected: two processes of one job started with DRIFTWATCH_RUN=job and TF_CONFIG
    # tasks worker:0 and worker:1, found by a pattern: the run "job" twice, told apart by
    # their rank on /metrics and in the history, never renamed job-PID.
    command, pattern = unique_sleep()
    cluster = {"worker": ["127.0.0.1:1", "127.0.0.1:2"]}
    children = [
        subprocess.Popen(
            command,
            env={
                **os.environ,
                "DRIFTWATCH_RUN": "job",
                "TF_CONFIG": json.dumps(
                    {"cluster": cluster, "task": {"type": "worker", "index": i}}
                ),
            },
        )
        for i in range(2)
    ]
    db = tmp_path / "history.db"
    try:
        daemons.append(DaemonProcess("--match", pattern, "--db", str(db)))
        daemon = daemons[0]
        pids = {str(child.pid) for child in children}

        def ranks() -> dict[str, tuple[str, str]]:
            seen = daemon.targets()
            return {t["pid"]: (t["run"], t.get("rank", "")) for t in seen if t["pid"] in pids}

        wait_for(lambda: len(ranks()) == 2, 30, "both ranks on /metrics")
        assert ranks() == {
            str(children[0].pid): ("job", "worker:0"),
            str(children[1].pid): ("job", "worker:1"),
        }
        wait_for(lambda: len(recorded_runs(db, children)) == 2, 30, "both ranks' history")
        assert daemon.stop() == 0
        recorded = recorded_runs(db, children)
        assert {run.name for run in recorded.values()} == {"job"}
        assert {pid: run.meta.get("rank") for pid, run in recorded.items()} == {
            children[0].pid: "worker:0",
            children[1].pid: "worker:1",
        }
        report = run_cli("report", "--db", str(db), "job")
        assert report.returncode == 0, report.stderr
        assert re.search(r"^run job \(#\d+, rank worker:[01]\)", report.stdout, re.M), report.stdout
    finally:
        for child in children:
            child.kill()
            child.wait()


def test_a_daemon_killed_and_restarted_resumes_the_same_runs(
    daemons: list[DaemonProcess], tmp_path: Path, sleepers: Sleepers
) -> None:
    children, pattern = sleepers
    db = tmp_path / "history.db"
    args = ("--match", pattern, "--interval", "0.1", "--db", str(db))

    def last_seen() -> float:
        return min((run.last_seen for run in recorded_runs(db, children).values()), default=0)

    daemons.append(DaemonProcess(*args))
    wait_for(lambda: len(recorded_runs(db, children)) == 2, 30, "both runs' first batches")
    # Each run's own second batch: a scan may find one sleeper a tick after the other.
    flushed = {pid: run.last_seen for pid, run in recorded_runs(db, children).items()}
    wait_for(
        lambda: all(r.last_seen > flushed[pid] for pid, r in recorded_runs(db, children).items()),
        30,
        "a second batch of both",
    )
    daemons[0].kill()  # SIGKILL: no flush, no ending
    before = recorded_runs(db, children)
    killed_at = min(run.last_seen for run in before.values())
    assert all(run.ended is None for run in before.values())
    first_reported = {pid: reported_rss(db, run)[0] for pid, run in before.items()}
    buckets_before = {pid: rss_bucket_starts(db, run) for pid, run in before.items()}

    daemons.append(DaemonProcess(*args))
    wait_for(  # past the 10-second bucket the kill fell into
        lambda: last_seen() > killed_at + 11, 45, "the restarted daemon's batches of both runs"
    )
    assert daemons[1].stop() == 0
    after = recorded_runs(db, children)
    assert {pid: (r.id, r.name, r.first_seen) for pid, r in after.items()} == {
        pid: (r.id, r.name, r.first_seen) for pid, r in before.items()
    }
    for pid, run in after.items():
        assert run.ended == "monitoring stopped"
        first, last = reported_rss(db, run)
        assert first == first_reported[pid] <= killed_at - 1  # from before the kill
        assert last > killed_at + 10  # to after the restart
        buckets = rss_bucket_starts(db, run)
        assert set(buckets_before[pid]) <= set(buckets)  # nothing lost
        assert max(buckets) > killed_at  # samples of the restarted daemon appended


def test_sigterm_flushes_the_history_and_an_exited_target_ends_its_run(
    daemons: list[DaemonProcess], tmp_path: Path, sleepers: Sleepers
) -> None:
    children, pattern = sleepers
    exiting, lasting = children
    db = tmp_path / "history.db"
    daemons.append(DaemonProcess("--match", pattern, "--interval", "0.1", "--db", str(db)))
    wait_for(lambda: len(recorded_runs(db, children)) == 2, 30, "both runs' first batches")
    exiting.kill()
    exiting.wait()
    wait_for(
        lambda: recorded_runs(db, children)[exiting.pid].ended is not None, 30, "the exit recorded"
    )
    assert recorded_runs(db, children)[exiting.pid].ended == f"process {exiting.pid} has exited"
    stopping = time.time()  # the next periodic batch is seconds away: only the stop sends one
    assert daemons[0].stop(signal.SIGTERM) == 0
    run = recorded_runs(db, children)[lasting.pid]
    assert run.ended == "monitoring stopped"
    assert run.last_seen >= stopping - 0.5
    assert f"driftwatch: history in {db} (driftwatch report --db {db})\n" in daemons[0].lines


# -- acceptance: two hooked Keras trainings -----------------------------------------------------

TRAIN = textwrap.dedent(
    """
    import os, sys
    import numpy as np
    import keras
    from driftwatch.keras import DriftwatchCallback

    class UntilFile(keras.callbacks.Callback):
        def on_epoch_end(self, epoch, logs=None):
            self.model.stop_training = os.path.exists(sys.argv[1])

    model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(4), keras.layers.Dense(1)])
    model.compile("sgd", "mse")
    x, y = np.random.rand(256, 8), np.random.rand(256, 1)
    model.fit(x, y, batch_size=32, epochs=100000, verbose=0,
              callbacks=[DriftwatchCallback(probe_every_seconds=0.5), UntilFile()])
    """
)


@pytest.mark.tf
@pytest.mark.paired
def test_daemon_picks_up_two_hooked_trainings_started_after_it_and_drops_them(
    daemons: list[DaemonProcess], tmp_path: Path
) -> None:
    channels = tmp_path / "channels"
    env = {"DRIFTWATCH_RUNTIME_DIR": str(channels)}
    daemons.append(DaemonProcess("--interval", "0.2", env=env))
    daemon = daemons[0]
    script = tmp_path / "train.py"
    script.write_text(TRAIN)
    stop = tmp_path / "stop"
    tag = uuid.uuid4().hex[:8]
    runs = [f"alpha-{tag}", f"beta-{tag}"]
    trainings = [
        subprocess.Popen(
            [sys.executable, str(script), str(stop)],
            env={**os.environ, **TF_ENV, **env, "DRIFTWATCH_RUN": run},
        )
        for run in runs
    ]
    try:
        for run in runs:
            wait_for(
                lambda run=run: "driftwatch_step_duration_seconds" in daemon.series_of(run),
                75,
                f"{run}'s steps in /metrics",
            )
        assert {daemon.runs()[run] for run in runs} == {str(t.pid) for t in trainings}
        stop.touch()
        for training in trainings:
            assert training.wait(timeout=60) == 0
    finally:
        for training in trainings:
            training.kill()
            training.wait()
    wait_for(lambda: not set(runs) & set(daemon.runs()), 20, "both runs to be dropped")
    assert daemon.series_of(runs[0]) == daemon.series_of(runs[1]) == set()
    # Their channels are swept once their other readers have had time for the last records.
    wait_for(lambda: list(channels.iterdir()) == [], SWEEP_AFTER_SECONDS + 10, "the sweep")
    assert daemon.stop() == 0
