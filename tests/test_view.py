"""The live view and the plain line are sinks that read the snapshot alone."""

from __future__ import annotations

import io
import re
import sys
from pathlib import Path

import pytest
from rich.console import Console
from rich.live import Live

from driftwatch.runtime.snapshot import Snapshot, SourceStatus
from driftwatch.runtime.store import Store
from driftwatch.series import Sample, SeriesKey
from driftwatch.view.terminal import LiveView, PlainView, render_summary, signal_rows
from tests.conftest import run_cli
from tests.test_monitor import INFO

MIB = 2**20
START = 1_750_000_000.0


def snapshots(store: Store, times: list[float]) -> list[Snapshot]:
    """A run whose RSS grows 1 MiB a sample, each snapshot reading ``store`` as it grows."""
    taken = []
    for tick, t in enumerate(times):
        rss = (100 + tick) * MIB
        store.add(Sample("rss_bytes", rss, t))
        taken.append(Snapshot("train", INFO, t, tick + 1, {("rss_bytes", ()): rss}, store=store))
    return taken


def test_the_plain_view_prints_a_line_per_interval_however_fast_sampling_goes(
    capsys: pytest.CaptureFixture[str],
) -> None:
    view = PlainView(every=1.8)
    for snapshot in snapshots(Store(), [START + i * 0.5 for i in range(9)]):
        view.publish(snapshot)
    view.close(snapshot, "monitoring stopped")
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 3  # at 0, 2 and 4 seconds
    assert [line.split(": RSS: ")[1].split(" (")[0] for line in lines] == [
        "100.0 MiB",
        "104.0 MiB",
        "108.0 MiB",
    ]


def test_the_live_view_shows_each_snapshot_with_where_metrics_are_served() -> None:
    out = io.StringIO()
    console = Console(file=out, width=120, force_terminal=False)
    with Live(console=console, auto_refresh=False) as live:
        view = LiveView(live, "http://127.0.0.1:9184/metrics")
        for snapshot in snapshots(Store(), [START, START + 1]):
            view.publish(snapshot)
        view.close(snapshot, "monitoring stopped")
    shown = out.getvalue()
    assert "driftwatch · train · pid 1234" in shown
    assert "101.0 MiB" in shown
    assert "http://127.0.0.1:9184/metrics" in shown


def test_the_summary_reads_the_runs_histories_through_the_snapshot() -> None:
    last = snapshots(Store(), [START + i for i in range(5)])[-1]
    text = render_summary(last, [], "process 1234 has exited", START)
    assert "RSS: 100.0 MiB at start, peak 104.0 MiB, 104.0 MiB at the end" in text
    assert "findings: none" in text
    without_history = render_summary(
        Snapshot("train", INFO, last.t, last.ticks, last.values),
        [],
        "process 1234 has exited",
        START,
    )
    assert "RSS:" not in without_history


RSS_GROWTH = """
import os, time
time.sleep(1.0)
kept = []
end = time.monotonic() + 14.0
while time.monotonic() < end:  # about 38 MiB/s, every page touched
    kept.append(bytearray(os.urandom(1 << 16)) * 32)
    time.sleep(0.05)
os._exit(0)
"""
"""A job whose RSS grows steadily to its end. It ends with ``os._exit``: a normal exit frees
its 540 MiB while the interpreter finalizes, and a monitor on a busy host may read that
fall; alone in a 10-s bucket of its own, it made a short run's newest-three-buckets trend
read -2.6 MiB/s. What is judged is the growth."""


def test_the_plain_line_shows_a_young_runs_memory_growth_once_it_is_a_trend(
    tmp_path: Path,
) -> None:
    """Expected: RSS grows about 38 MiB/s (2 MiB every 50 ms and the sleep) for 14 s: from
    10 s of samples on, the line says about 133 GiB/h, not ``-/h`` until a minute is up."""
    program = tmp_path / "grow.py"
    program.write_text(RSS_GROWTH, encoding="utf-8")
    result = run_cli(
        *("run", "--db", str(tmp_path / "history.db"), "--listen", "127.0.0.1:0"),
        *("--", sys.executable, str(program)),
    )
    assert result.returncode == 0, result.stderr
    rates = re.findall(r"RSS: [\d.]+ MiB \(([\d.]+) GiB/h\)", result.stdout)
    assert rates, result.stdout
    assert all(60 < float(rate) < 200 for rate in rates), rates


def test_the_view_says_no_retracing_rather_than_zero_traces() -> None:
    values: dict[SeriesKey, float] = {("rss_bytes", ()): 100 * MIB, ("tracing_count", ()): 0.0}
    rows = dict(signal_rows(Snapshot("train", INFO, START, 1, values)))
    assert rows["tf.function"] == "no retracing"
    values[("tracing_count", ())] = 3.0
    assert dict(signal_rows(Snapshot("train", INFO, START, 1, values)))["tf.function"] == (
        "3 retraces"
    )


def test_the_view_says_no_event_files_were_found_while_their_source_looks() -> None:
    values: dict[SeriesKey, float] = {("rss_bytes", ()): 100 * MIB}
    looking = (SourceStatus("eventfiles", True),)
    rows = dict(signal_rows(Snapshot("train", INFO, START, 1, values, looking)))
    assert rows["event files"] == "none found"
    down = (SourceStatus("eventfiles", False, "tensorboard is not installed"),)
    assert "event files" not in dict(signal_rows(Snapshot("train", INFO, START, 1, values, down)))
    values |= {("event_files", ()): 2.0, ("event_file_bytes", ()): 3 * MIB}
    values[("event_file_largest_bytes", ())] = 2 * MIB
    rows = dict(signal_rows(Snapshot("train", INFO, START, 1, values, looking)))
    assert rows["event files"].startswith("2 files, 3.0 MiB")


def test_threads_and_descriptors_show_their_limits_their_trend_and_their_summary() -> None:
    # Expected: threads flat at 15 of 96,365; descriptors climbing 300 a second towards
    # 20,000 for 10 s: the rows give each count of its limit, the climbing one its rate, and
    # the summary each one's start, peak, end and limit.
    store = Store()
    values: dict[SeriesKey, float] = {}
    for i in range(21):
        t = START + i * 0.5
        readings = {"threads": 15.0, "threads_limit": 96365.0}
        readings |= {"open_fds": 6.0 + 150 * i, "fd_limit": 20000.0}
        for series, value in readings.items():
            store.add(Sample(series, value, t))
            values[(series, ())] = value
    last = Snapshot("train", INFO, t, 21, values, store=store)
    rows = dict(signal_rows(last))
    assert rows["threads"] == "15 of 96,365"
    assert rows["open descriptors"] == "3,006 of 20,000 (+300/s)"
    summary = render_summary(last, [], "process 1234 has exited", START)
    assert "threads: 15 at start, peak 15, 15 at the end, limit 96,365" in summary
    assert "open descriptors: 6 at start, peak 3,006, 3,006 at the end, limit 20,000" in summary
