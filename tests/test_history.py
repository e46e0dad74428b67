"""The embedded history: real SQLite files, the real writer thread, real ``attach`` processes."""

from __future__ import annotations

import json
import resource
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import pytest

from driftwatch.errors import HistoryError, TargetGone
from driftwatch.findings import Finding, Severity
from driftwatch.history.reader import HistoryReader
from driftwatch.history.schema import default_db_path
from driftwatch.history.writer import History, RunRecorder
from driftwatch.runtime.monitor import Monitor, watch
from driftwatch.runtime.snapshot import Snapshot
from driftwatch.runtime.store import Store
from driftwatch.series import Sample
from driftwatch.target.process import TargetInfo
from tests import synthetic_run
from tests.conftest import run_cli, wait_for
from tests.synthetic_run import START, TARGET, TICK
from tests.test_monitor import INFO, Clock, ScriptedSource


def read(db: Path, run: str | None = None) -> tuple[HistoryReader, int]:
    reader = HistoryReader(db)
    return reader, reader.run(run).id


def test_default_db_follows_xdg_data_home(tmp_path: Path) -> None:
    assert default_db_path({"XDG_DATA_HOME": str(tmp_path)}) == (
        tmp_path / "driftwatch" / "history.db"
    )
    assert default_db_path({"HOME": "/home/ml"}).parts[-3:] == ("share", "driftwatch", "history.db")


def test_a_run_round_trips_with_metadata_series_and_finding_changes(tmp_path: Path) -> None:
    db = tmp_path / "history.db"
    synthetic_run.record(db)
    reader, run_id = read(db)
    run = reader.run(None)
    assert (run.name, run.pid, run.user) == ("train", TARGET.pid, "ml")
    assert run.command == ["python", "train.py", "--token=***"]
    assert run.ended == "process 4321 has exited"
    assert run.last_seen == START + synthetic_run.HOURS * 3600

    series = reader.series(run_id)
    rss = series[("rss_bytes", ())]
    # Stitched: 10 min buckets first, then 1 min, then the newest hour at 10 s.
    assert rss[0].start <= START
    assert rss[-1].start + rss[-1].width >= run.last_seen
    assert [b.start for b in rss] == sorted(b.start for b in rss)
    assert {b.width for b in rss if b.start >= run.last_seen - 3000} == {10.0}
    assert {b.width for b in rss if b.start < run.last_seen - 86400 / 24 - 600} <= {60.0, 600.0}
    # Every tick of the newest hour (and up to 10 minutes more until the next prune).
    ten_second = [b.start for b in rss if b.width == 10.0 and b.count == 1]
    assert ten_second == [ten_second[0] + 10 * i for i in range(len(ten_second))]
    assert 361 <= len(ten_second) <= 361 + 60
    assert series[("tf_allocator_current_bytes", (("device", "CPU:0"),))]

    leak, slowdown = reader.findings(run_id)
    assert (leak.kind, leak.severity, leak.since) == (
        "host_memory_drift",
        Severity.CRITICAL,
        synthetic_run.LEAK.since,
    )
    assert [s for _, s in leak.changes] == [Severity.WARNING, Severity.CRITICAL]
    assert leak.first_seen == START + 0.8 * 3600
    assert slowdown.kind == "abrupt_slowdown"
    assert slowdown.last_seen == run.last_seen
    reader.close()


def test_history_size_is_bounded_by_the_tiers(tmp_path: Path) -> None:
    db = tmp_path / "history.db"
    synthetic_run.record(db, hours=26.0)
    with sqlite3.connect(db) as conn:
        per_width = dict(
            conn.execute(
                "SELECT width, count(*) FROM buckets JOIN series ON series.id = series_id "
                "WHERE name = 'rss_bytes' GROUP BY width"
            ).fetchall()
        )
    # The last prune may lag the newest data by up to 10 minutes of run time. (This replay
    # outruns the writer by more than the hour of buckets the store keeps in memory, so the
    # fine tiers may have gaps: no lower bound.)
    assert per_width[10.0] <= 360 + 60 + 1
    assert per_width[60.0] <= 1440 + 10 + 1
    assert per_width[600.0] == 26 * 6 + 1


def fresh_recorder(tmp_path: Path) -> tuple[Path, History, RunRecorder, Store]:
    """A new history in ``tmp_path``, the recorder of run ``train`` in it, and its store."""
    db = tmp_path / "history.db"
    history = History(db)
    return db, history, history.recorder("train", TARGET), Store()


def test_evidence_that_lands_after_a_finding_ended_is_recorded_and_it_stays_ended(
    tmp_path: Path,
) -> None:
    # A slowdown asks for a profiler trace and is over before the hook writes it: the
    # snapshot that closes the sinks carries the ended finding with the trace named; the
    # history keeps the finding ended, with that evidence.
    db, history, recorder, store = fresh_recorder(tmp_path)
    slowdown = Finding("abrupt_slowdown", Severity.WARNING, START, "slower", {"ratio": 2.0})
    recorder.publish(Snapshot("train", TARGET, START + 10, 1, findings=(slowdown,), store=store))
    last = Snapshot("train", TARGET, START + 20, 2, store=store)
    recorder.publish(last)
    traced = replace(slowdown, evidence={"ratio": 2.0, "capture_logdir": "/captures/traces"})
    recorder.close(replace(last, ended_findings=(traced,)), "monitoring stopped")
    history.close()
    reader, run_id = read(db)
    (found,) = reader.findings(run_id)
    assert found.evidence["capture_logdir"] == "/captures/traces"
    assert found.last_seen == START + 10
    assert [s for _, s in found.changes] == [Severity.WARNING, None]
    reader.close()


def record_ticks(history: History, target: TargetInfo, times: list[float]) -> None:
    recorder = history.recorder("train", target)
    store = Store()
    snapshot = Snapshot("train", target, times[0], 0, store=store)
    for tick, t in enumerate(times):
        store.add(Sample("rss_bytes", 1e9 + tick, t))
        snapshot = Snapshot("train", target, t, tick + 1, store=store)
        recorder.publish(snapshot)
    recorder.close(snapshot, "monitoring stopped")


def test_a_run_not_ended_reads_back_to_its_last_flush_from_the_finest_tier(
    tmp_path: Path,
) -> None:
    db, history, recorder, store = fresh_recorder(tmp_path)
    start = 1_000_000_200.0  # 20 s into a 10-min bucket
    for tick in range(100):  # 200 s, flushed every 5 s; never closed (a SIGKILL)
        t = start + 2.0 * tick
        store.add(Sample("rss_bytes", 1e9 + tick, t))
        recorder.publish(Snapshot("train", TARGET, t, tick + 1, store=store))
    history.close()
    with sqlite3.connect(db) as conn:
        open_coarse = conn.execute(
            "SELECT count(*) FROM buckets WHERE width > 10 AND start + width > ?", (t,)
        ).fetchone()[0]
    # Coarser tiers' open buckets lie within the finest tier's span: sent only once closed.
    assert open_coarse == 0
    reader, run_id = read(db)
    rss = reader.series(run_id)[("rss_bytes", ())]
    assert {b.width for b in rss} == {10.0}
    assert rss[0].start <= start
    assert rss[-1].start + rss[-1].width >= t - 5.0  # up to the last flush
    assert sum(b.count for b in rss) >= 100 - 3
    reader.close()


def test_a_restarted_monitor_resumes_the_run_of_the_same_process(tmp_path: Path) -> None:
    db = tmp_path / "history.db"
    for part in range(2):
        history = History(db, clock=lambda: START)
        record_ticks(history, TARGET, [START + part * 600 + i * TICK for i in range(30)])
        history.close()
    other = TargetInfo(TARGET.pid + 1, TARGET.create_time, "python", ("python",), "ml", 1000)
    history = History(db, clock=lambda: START)
    record_ticks(history, other, [START + 2000 + i * TICK for i in range(3)])
    history.close()

    reader = HistoryReader(db)
    runs = reader.runs()
    assert [r.pid for r in runs] == [other.pid, TARGET.pid]  # a new process, a new run
    resumed = runs[1]
    assert (resumed.first_seen, resumed.last_seen) == (START, START + 600 + 29 * TICK)
    starts = {b.start for b in reader.series(resumed.id)[("rss_bytes", ())] if b.width == 10.0}
    assert {START, START + 290, START + 600, START + 890} <= starts
    assert reader.run("train").pid == other.pid  # a name picks its newest run
    assert reader.run(str(resumed.id)).pid == TARGET.pid
    with pytest.raises(HistoryError, match=r"no run 'nope'.*it has: train"):
        reader.run("nope")
    reader.close()


def test_a_process_watched_again_by_the_same_history_resumes_its_run(tmp_path: Path) -> None:
    """As when a daemon drops a run on reload and a pattern finds its process again: the
    writer forgets an ended run's ids, then finds the run again by its process."""
    db = tmp_path / "history.db"
    history = History(db, clock=lambda: START)
    for part in range(2):
        record_ticks(history, TARGET, [START + part * 600 + i * TICK for i in range(3)])
    history.close()
    (run,) = HistoryReader(db).runs()
    assert (run.first_seen, run.last_seen) == (START, START + 600 + 2 * TICK)
    assert run.ended == "monitoring stopped"


def test_a_monitor_records_its_ticks_and_why_it_ended(tmp_path: Path) -> None:
    db = tmp_path / "history.db"
    history = History(db)
    gone = TargetGone(INFO.pid, "process 1234 has exited")
    source = ScriptedSource("process", "rss_bytes", [1.0, 2.0, gone])
    recorder = history.recorder("train", INFO)
    monitor = Monitor("train", INFO, [source], clock=Clock(), recorder=recorder)
    assert watch(monitor, 0.0, threading.Event()) == "process 1234 has exited"
    history.close()
    reader, run_id = read(db)
    assert reader.run(None).ended == "process 1234 has exited"
    assert [b.mean for b in reader.series(run_id)[("rss_bytes", ())]] == [1.5]


def test_runs_past_the_retention_are_deleted(tmp_path: Path) -> None:
    db = tmp_path / "history.db"
    history = History(db, clock=lambda: START)
    record_ticks(history, TARGET, [START + i * TICK for i in range(3)])
    history.close()
    History(db, retention=86400, clock=lambda: START + 86400 - 60).close()
    assert len(HistoryReader(db).runs()) == 1
    History(db, retention=86400, clock=lambda: START + 86400 + 60).close()
    with pytest.raises(HistoryError, match="holds no runs"):
        HistoryReader(db).run(None)


def test_a_busy_database_defers_batches_but_never_blocks_a_tick(tmp_path: Path) -> None:
    """Another process holds the write lock: ticks stay fast, and nothing is lost after."""
    db = tmp_path / "history.db"
    history = History(db, clock=lambda: START)
    blocker = sqlite3.connect(db, isolation_level=None)
    blocker.execute("BEGIN EXCLUSIVE")
    recorder = history.recorder("train", TARGET)
    store = Store()
    slowest = 0.0
    for tick in range(600):  # more batches than the queue holds
        t = START + tick * TICK
        store.add(Sample("rss_bytes", float(tick), t))
        began = time.perf_counter()
        snapshot = Snapshot("train", TARGET, t, tick + 1, store=store)
        recorder.publish(snapshot)
        slowest = max(slowest, time.perf_counter() - began)
    assert history.deferred > 0
    # A tick that waited for the lock would wait for the writer's 30-s busy timeout; the
    # bound leaves room for a loaded machine (a tick can take 0.2 s on a busy 2-core one).
    assert slowest < 1.0
    blocker.execute("ROLLBACK")
    blocker.close()
    recorder.close(snapshot, "monitoring stopped")
    history.close()
    assert history.failed is None
    with sqlite3.connect(db) as conn:
        minutes = conn.execute("SELECT start, count FROM buckets WHERE width = 60 ORDER BY start")
        starts, counts = zip(*minutes.fetchall(), strict=True)
    assert starts == tuple(START - START % 60 + 60 * i for i in range(len(starts)))
    assert sum(counts) == 600


def test_unusable_databases_are_one_clear_error(tmp_path: Path) -> None:
    garbage = tmp_path / "garbage.db"
    garbage.write_bytes(b"not a database at all" * 300)
    with pytest.raises(HistoryError, match=r"garbage\.db: file is not a database"):
        History(garbage)
    with pytest.raises(HistoryError, match="unable to open"):
        History(tmp_path)  # a directory
    with pytest.raises(HistoryError, match="no history at"):
        HistoryReader(tmp_path / "missing.db")
    plain = tmp_path / "plain.db"
    sqlite3.connect(plain).close()
    with pytest.raises(HistoryError, match="holds no driftwatch history"):
        HistoryReader(plain)


def attach(
    pid: int,
    db: Path,
    stdout: int = subprocess.DEVNULL,
    preexec_fn: Callable[[], None] | None = None,
) -> subprocess.Popen[str]:
    """``driftwatch attach`` sampling every 0.1 s into ``db``; stderr is piped."""
    return subprocess.Popen(
        [
            *(sys.executable, "-m", "driftwatch", "attach", str(pid)),
            *("--interval", "0.1", "--listen", "127.0.0.1:0", "--db", str(db)),
        ],
        stdout=stdout,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=preexec_fn,
    )


def last_seen(db: Path) -> float:
    """The newest time the history holds for its one run; 0 before it has one."""
    if not db.exists():
        return 0.0
    with sqlite3.connect(db) as conn:
        try:
            row = conn.execute("SELECT max(last_seen) FROM runs").fetchone()
        except sqlite3.OperationalError:  # the schema is being created
            return 0.0
    return row[0] or 0.0


def test_sigkill_then_restart_keeps_the_history_and_resumes_the_run(
    sleeper: subprocess.Popen[bytes], tmp_path: Path
) -> None:
    db = tmp_path / "history.db"
    first = attach(sleeper.pid, db)
    wait_for(lambda: last_seen(db) > 0, 30, "the first batch")
    flushed = last_seen(db)
    wait_for(lambda: last_seen(db) > flushed, 30, "a second batch")
    before_kill = last_seen(db)
    first.kill()
    first.wait()

    after_kill = json.loads(run_cli("report", "--db", str(db), "--json").stdout)
    assert after_kill["run"]["ended"] is None  # killed: it could not say why it ended
    assert after_kill["run"]["last_seen"] >= before_kill

    second = attach(sleeper.pid, db)
    wait_for(lambda: last_seen(db) > before_kill + 1, 30, "the restarted attach's batch")
    second.send_signal(signal.SIGTERM)
    _, err = second.communicate(timeout=30)
    assert second.returncode == 0, err
    assert f"history of sleep in {db}" in err

    result = run_cli("report", "--db", str(db), "--json")
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["run"]["ended"] == "monitoring stopped"
    assert report["run"]["first_seen"] == after_kill["run"]["first_seen"]
    rss = next(s for s in report["series"] if s["series"] == "rss_bytes")
    assert rss["first"]["t"] <= before_kill - 1  # from before the kill
    assert rss["last"]["t"] > before_kill + 1  # and after the restart
    assert len(HistoryReader(db).runs()) == 1


def test_disk_full_stops_the_history_once_and_monitoring_goes_on(
    sleeper: subprocess.Popen[bytes], tmp_path: Path
) -> None:
    """An 80 KiB file size limit: the first batch fits (66 KiB), a few later ones do not."""
    db = tmp_path / "history.db"

    def limit_file_size() -> None:
        resource.setrlimit(resource.RLIMIT_FSIZE, (80 * 1024, resource.RLIM_INFINITY))

    monitor = attach(sleeper.pid, db, subprocess.PIPE, limit_file_size)
    assert monitor.stderr is not None
    assert monitor.stdout is not None
    line = ""
    while "history stopped" not in line:
        line = monitor.stderr.readline()
        assert line, "driftwatch ended without saying the history stopped"
    assert f"cannot write {db}" in line
    assert "file size limit 80.0 KiB" in line
    assert "monitoring goes on" in line
    for _ in range(3):  # still sampling
        assert "RSS:" in monitor.stdout.readline()
    monitor.send_signal(signal.SIGTERM)
    out, err = monitor.communicate(timeout=30)
    assert monitor.returncode == 0, err
    assert "stopped: driftwatch received SIGTERM" in out
    assert "history stopped" not in err  # said once
    assert "Traceback" not in err
    assert HistoryReader(db).run(None).pid == sleeper.pid  # what was written stays readable
