"""``driftwatch report`` as users run it, on a history recorded by the real writer."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from driftwatch.findings import KINDS
from driftwatch.history.writer import History
from driftwatch.report.html import LINE_COLOURS
from tests import synthetic_run
from tests.conftest import REPO, run_cli
from tests.test_cli import assert_one_line_error

MIB = 2**20


@pytest.fixture(scope="module")
def db(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("history") / "history.db"
    synthetic_run.record(path)
    return path


def test_text_summary_of_the_latest_run(db: Path) -> None:
    result = run_cli("report", "--db", str(db))
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert out.startswith("run train (#1): pid 4321")
    assert "command: python train.py --token=***" in out
    assert "ended: process 4321 has exited" in out
    assert re.search(r"Step time: 19\d\.\d ms -> 3\d\d\.\d ms", out), out
    assert "at this rate it reaches 4.0 GiB in" in out
    assert "[critical] host_memory_drift since" in out
    assert "[warning] abrupt_slowdown since" in out
    assert "check the data loader" in out  # the cause and fix travel with the finding
    # and its ranked causes, each on a line of its own, with its numbers
    assert "    cause 1: Host CPU contention (score 6.2: cpu pressure share 10% -> 72%)" in out
    assert "    cause 2: Storage reads (score 1.4: read bytes per second 0.95 MiB/s -> -)" in out


def test_threads_and_descriptors_have_their_panels_with_the_time_to_their_limit(db: Path) -> None:
    # Expected: threads leak 100 an hour from 20 towards 1,024 (300 at the end, some 7 hours
    # left); descriptors flat at 30 of 1,024: each its panel, the threads' with that time.
    result = run_cli("report", "--db", str(db))
    assert result.returncode == 0, result.stderr
    threads = re.search(r"Threads: 2\d -> 3\d\d, peak 3\d\d; (.*)", result.stdout)
    assert threads, result.stdout
    assert re.match(r"1\.\d+/min over the newest .*; at this rate it reaches 1,024 in", threads[1])
    assert "Open descriptors: 30 -> 30, peak 30" in result.stdout


def test_json_is_one_document_with_run_series_and_findings(db: Path) -> None:
    result = run_cli("report", "train", "--db", str(db), "--json")
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["run"]["name"] == "train"
    assert report["run"]["command"] == ["python", "train.py", "--token=***"]
    rss = next(s for s in report["series"] if s["series"] == "rss_bytes")
    assert rss["first"]["value"] == pytest.approx(900 * MIB, rel=0.01)
    assert rss["max"] == pytest.approx(1023 * MIB, rel=0.01)
    trend = next(t for t in report["trends"] if t["line"] == "RSS")
    assert trend["per_hour"] == pytest.approx(40 * MIB, rel=0.05)
    tf = next(s for s in report["series"] if s["series"] == "tf_allocator_current_bytes")
    assert tf["labels"] == {"device": "CPU:0"}
    slow = next(f for f in report["findings"] if f["kind"] == "abrupt_slowdown")
    assert [c["cause"] for c in slow["evidence"]["causes"]] == [
        "host_cpu_contention",
        "storage_reads",
    ]
    assert slow["evidence"]["causes"][0]["numbers"]["cpu_pressure_share_after"] == 0.72
    leak = next(f for f in report["findings"] if f["kind"] == "host_memory_drift")
    assert [c["severity"] for c in leak["changes"]] == ["warning", "critical"]
    assert leak["evidence"] == {"slope_bytes_per_hour": 40.0 * MIB}


def test_run_selection_and_unknown_runs(db: Path, tmp_path: Path) -> None:
    assert run_cli("report", "1", "--db", str(db)).returncode == 0
    assert_one_line_error(run_cli("report", "nope", "--db", str(db)), "no run 'nope'", "train")
    assert_one_line_error(run_cli("report", "--db", str(tmp_path / "none.db")), "no history at")
    broken = tmp_path / "broken.db"
    broken.write_bytes(b"\x00garbage" * 1000)
    assert_one_line_error(run_cli("report", "--db", str(broken)), "file is not a database")
    html = tmp_path / "missing-dir" / "report.html"
    assert_one_line_error(run_cli("report", "--db", str(db), "--html", str(html)), "--html")


def test_an_empty_history_is_one_clear_error(tmp_path: Path) -> None:
    empty = tmp_path / "empty.db"
    History(empty).close()
    assert_one_line_error(run_cli("report", "--db", str(empty)), "holds no runs yet")


def test_html_findings_carry_the_title_of_their_kind(db: Path, tmp_path: Path) -> None:
    page = tmp_path / "report.html"
    assert run_cli("report", "--db", str(db), "--html", str(page)).returncode == 0
    html = page.read_text()
    for kind in ("host_memory_drift", "abrupt_slowdown"):
        assert f'<td title="{KINDS[kind].title}">{kind}</td>' in html
    assert '<ol class="ev causes" title="likely causes, best first"><li>Host CPU contention' in html


@pytest.fixture(scope="session")
def chromium() -> str:
    """Path of Debian's chromium; installs it when missing (needs root), as make does."""
    path = shutil.which("chromium")
    if path is None:
        subprocess.run(["make", "-C", str(REPO), "system-deps"], check=True)
        path = shutil.which("chromium")
    if path is None:
        pytest.fail("chromium is missing and cannot be installed: apt-get install chromium")
    return path


def headless(chromium: str, profile: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """Chromium for a closed network: no sandbox (root), no GPU, no background traffic."""
    return subprocess.run(
        [
            chromium,
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-quic",
            "--no-first-run",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            f"--user-data-dir={profile}",
            *args,
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )


def test_html_is_self_contained_and_renders_plots_in_chromium(
    db: Path, tmp_path: Path, chromium: str
) -> None:
    page = tmp_path / "report.html"
    result = run_cli("report", "--db", str(db), "--html", str(page))
    assert result.returncode == 0, result.stderr
    html = page.read_text()
    assert "<script" not in html
    assert "<link" not in html
    assert re.findall(r"(?:src|href)=", html) == []  # nothing to fetch
    assert "http://" not in html.replace('xmlns="http://www.w3.org/2000/svg"', "")

    dom = headless(chromium, tmp_path / "profile-dom", "--dump-dom", page.as_uri()).stdout
    # step time, RSS, TF memory, event files, uploads, open descriptors, threads
    assert dom.count("<svg") == 7
    assert dom.count("<polyline") >= 6
    assert "host_memory_drift" in dom

    png = tmp_path / "report.png"
    headless(
        chromium,
        tmp_path / "profile-shot",
        f"--screenshot={png}",
        "--window-size=1000,2600",
        page.as_uri(),
    )
    pixels = np.asarray(Image.open(png).convert("RGB"), dtype=np.int16)
    height = pixels.shape[0]
    assert len(np.unique(pixels[::7, ::7].reshape(-1, 3), axis=0)) > 50  # not blank
    # Rows where the plots' first line colour is drawn (right of the legends' swatches).
    teal = np.array([int(LINE_COLOURS[0][i : i + 2], 16) for i in (1, 3, 5)])
    line_rows = np.nonzero((np.abs(pixels[:, 100:] - teal) <= 24).all(axis=2).any(axis=1))[0]
    assert len(line_rows) > 300
    assert len(set(line_rows * 5 // height)) >= 4  # plots down the whole page, not one


def test_a_short_runs_report_agrees_with_its_summary_on_peak_and_end_and_has_a_trend(
    tmp_path: Path,
) -> None:
    """Expected: RSS grows about 38 MiB/s for 14 s (to about 540 MiB): the report's end and
    peak are the summary's readings (not 10-s bucket means, about 20 MiB lower), and the RSS
    line has a trend though the run's newest half holds fewer than 3 buckets."""
    from tests.test_view import RSS_GROWTH

    program = tmp_path / "grow.py"
    program.write_text(RSS_GROWTH, encoding="utf-8")
    db = tmp_path / "history.db"
    watched = run_cli(
        *("run", "--db", str(db), "--listen", "127.0.0.1:0", "--", sys.executable, str(program))
    )
    assert watched.returncode == 0, watched.stderr
    summary = re.search(
        r"RSS: .* at start, peak ([\d.]+ MiB), ([\d.]+ MiB) at the end", watched.stdout
    )
    assert summary, watched.stdout
    result = run_cli("report", "--db", str(db))
    assert result.returncode == 0, result.stderr
    rss = re.search(
        r"Memory: RSS: [\d.]+ MiB -> ([\d.]+ MiB), peak ([\d.]+ MiB); (.*)", result.stdout
    )
    assert rss, result.stdout
    assert (rss[1], rss[2]) == (summary[2], summary[1])
    # A trend over seconds is stated per second, not as gigabytes an hour.
    per_second = re.match(r"([\d.]+) MiB/s over the newest", rss[3])
    assert per_second, rss[3]
    assert 15 < float(per_second[1]) < 60, rss[3]
