"""``driftwatch analyze`` on samples files and on logdirs of real Keras runs."""

from __future__ import annotations

import io
import json
import math
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from rich.console import Console

from bench.detection.analyze_speed import DAY, RESTART_SECONDS, T0, YEAR, write_logdir
from driftwatch.commands.analyze import (
    GAP_SECONDS,
    ReadProgress,
    RecordingError,
    analyze,
    read_samples,
)
from driftwatch.detect import Engine
from driftwatch.detect.catalog import default_detectors
from driftwatch.findings import Finding
from tests.conftest import EXAMPLES, TF_ENV, run_cli

GIB = 1 << 30
MIB = 1 << 20


def write_samples(path: Path, rows: list[dict[str, object]]) -> Path:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


def rss_recording(
    hours: float, leak_mib_per_hour: float, onset_hours: float
) -> list[dict[str, object]]:
    """RSS at 10 s for ``hours``: 10 GiB with noise and GC sawtooth, a leak after onset."""
    rows: list[dict[str, object]] = []
    t0 = 1_700_000_000.0
    for i in range(int(hours * 360)):
        t = t0 + 10 * i
        elapsed_h = (t - t0) / 3600
        sawtooth = 50 * MIB * ((i % 30) / 30)
        leak = max(0.0, elapsed_h - onset_hours) * leak_mib_per_hour * MIB
        noise = 5 * MIB * math.sin(i * 1.7)
        rows.append({"t": t, "series": "rss_bytes", "value": 10 * GIB + sawtooth + leak + noise})
        if i % 6 == 0:
            rows.append({"t": t, "series": "memory_limit_bytes", "value": 24 * GIB})
    return rows


def test_a_leak_in_a_recording_is_found_with_its_class(tmp_path: Path) -> None:
    path = write_samples(tmp_path / "leak.jsonl", rss_recording(6, 200, onset_hours=1.5))
    result = run_cli("analyze", "--json", str(path))
    assert result.returncode == 0, result.stderr
    findings = [json.loads(line) for line in result.stdout.splitlines()]
    leaks = [f for f in findings if f["kind"] == "host_memory_drift"]
    assert len(leaks) == 1, findings
    leak = leaks[0]
    assert leak["severity"] in ("warning", "critical")
    assert {"kind", "severity", "since", "message", "evidence", "run"} <= leak.keys()
    assert 150 < leak["evidence"]["slope_bytes_per_hour"] / MIB < 260
    assert leak["evidence"]["leak_class"] == "unknown"  # no hook data in this recording
    onset = 1_700_000_000 + 1.5 * 3600
    assert leak["evidence"]["first_reported"] - onset < 2 * 3600


def test_a_steady_recording_has_no_findings(tmp_path: Path) -> None:
    path = write_samples(tmp_path / "flat.jsonl", rss_recording(6, 0, onset_hours=0))
    assert analyze(path) == []
    read, verdict = run_cli("analyze", str(path)).stdout.splitlines()
    assert read.startswith("read flat.jsonl: 2,520 samples, 6.0 h from "), read
    assert read.endswith(", no gap")
    assert verdict == "flat.jsonl: no findings"


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("not json", "expected {"),
        ('{"t": 1, "series": "rss_bytes"}', "expected {"),
        ('{"t": 1, "series": "no_such", "value": 1}', "unknown series 'no_such'"),
        ('{"t": "x", "series": "rss_bytes", "value": 1}', "must be numbers"),
        ('{"t": 1, "series": "rss_bytes", "value": "1"}', "must be numbers"),
        ('{"t": 1, "series": "rss_bytes", "value": 1, "labels": [1]}', "labels must be an object"),
        ('{"t": -500, "series": "rss_bytes", "value": 1}', "time goes backwards by 8.3 min"),
    ],
)
def test_malformed_recordings_name_the_line(tmp_path: Path, line: str, message: str) -> None:
    path = tmp_path / "bad.jsonl"
    path.write_text('{"t": 0, "series": "rss_bytes", "value": 1}\n\n' + line + "\n")
    with pytest.raises(RecordingError, match=f"bad.jsonl:3: .*{re.escape(message)}"):
        list(read_samples(path))
    result = run_cli("analyze", str(path))
    assert result.returncode == 1
    assert result.stderr.count("\n") == 1
    assert message in result.stderr


def test_records_a_little_out_of_order_are_put_in_order(tmp_path: Path) -> None:
    # Expected: the samples come out in time order, each once, whatever batch they are in.
    rows = rss_recording(2, 200, onset_hours=0.5)
    shuffled = list(rows)
    for i in range(0, len(shuffled) - 5, 7):  # every 7th record 5 records (50 s) late
        shuffled.insert(i + 5, shuffled.pop(i))
    samples = list(read_samples(write_samples(tmp_path / "shuffled.jsonl", shuffled)))
    assert [s.t for s in samples] == sorted(float(str(row["t"])) for row in rows)
    assert len(samples) == len(rows)
    ordered = analyze(write_samples(tmp_path / "ordered.jsonl", rows))
    assert analyze(tmp_path / "shuffled.jsonl") == ordered


def test_labels_nulls_and_blank_lines_are_read(tmp_path: Path) -> None:
    path = tmp_path / "ok.jsonl"
    path.write_text(
        '{"t": 1, "series": "gpu_process_memory_bytes", "value": 5, "labels": {"gpu": 0}}\n'
        "\n"
        '{"t": 2, "series": "rss_bytes", "value": null}\n'
    )
    first, second = read_samples(path)
    assert first.labels == (("gpu", "0"),)
    assert math.isnan(second.value)


def test_missing_path_is_one_line() -> None:
    result = run_cli("analyze", "/nonexistent/run")
    assert result.returncode == 1
    assert result.stderr == "driftwatch: error: /nonexistent/run: no such file or directory\n"


def test_one_event_file_is_analysed_as_its_logdir_is(tmp_path: Path) -> None:
    # Expected: a user who names the event file rather than its folder gets the same findings
    # (a 1-h recording: its periodic checkpoint stalls), not a decoding error.
    write_logdir(tmp_path / "run", 1)
    (event_file,) = (tmp_path / "run" / "train").iterdir()
    whole = [(f.kind, f.severity, f.since) for f in analyze(tmp_path / "run")]
    assert whole
    assert [(f.kind, f.severity, f.since) for f in analyze(event_file)] == whole


def test_a_binary_file_that_is_no_event_file_is_one_line(tmp_path: Path) -> None:
    binary = tmp_path / "weights.bin"
    binary.write_bytes(bytes(range(256)) * 64)
    result = run_cli("analyze", str(binary))
    assert result.returncode == 1
    assert result.stderr == (
        f"driftwatch: error: {binary}: not a samples file (binary data); give a TensorBoard "
        "logdir, an event file or a samples file\n"
    )


def keras_logdir(tmp_path: Path, name: str, *extra: str, epochs: int = 10) -> Path:
    logdir = tmp_path / name
    subprocess.run(
        [
            *(sys.executable, str(EXAMPLES / "train_keras.py"), "--logdir", str(logdir)),
            *("--samples", "32768", "--epochs", str(epochs), "--log-every", "5", *extra),
        ],
        check=True,
        timeout=180,
        stderr=subprocess.DEVNULL,
        env={**os.environ, **TF_ENV},
    )
    return logdir


@pytest.mark.tf
def test_analyze_finds_a_slowdown_in_a_real_keras_logdir(tmp_path: Path) -> None:
    # 20 s of steps of a few ms (blocks of a second: warm-up, then a baseline), then 4 ms of
    # host work added to every step for the run's last 16 s or so: 2-4x slower. Paced by
    # time, not steps, so a slow or busy host keeps both stretches as long. A slowdown of
    # either kind: the job's own steps may drift before the step up (records of 5 steps a
    # 2 s, measured alone: 125-136 in the first 12 s, 42-100 from then to the step up, 37-45
    # after it), and the run is then told as slowing all through it, 4.65x, gradual.
    args = ("--slow-after-seconds", "20", "--slow-seconds", "0.004", "--seconds", "36")
    logdir = keras_logdir(tmp_path, "slow", *args, epochs=1000)
    findings = analyze(logdir)
    slowdowns = [f for f in findings if f.kind in ("abrupt_slowdown", "gradual_slowdown")]
    assert slowdowns, findings
    assert slowdowns[0].severity.value in ("warning", "critical"), slowdowns
    assert float(slowdowns[0].evidence["ratio"]) > 1.5


@pytest.mark.tf
def test_analyze_finds_nothing_wrong_in_a_healthy_keras_logdir(tmp_path: Path) -> None:
    findings = analyze(keras_logdir(tmp_path, "healthy"))
    assert [f for f in findings if f.severity.value != "info"] == []


class Asked:
    """Engines of the default detectors that note each time they are asked what holds."""

    def __init__(self) -> None:
        self.times: list[float] = []
        self.engines = 0

    def __call__(self) -> Engine:
        asked = self.times

        class Noting(Engine):
            def evaluate(self, now: float, *, final: bool = False) -> list[Finding]:
                asked.append(now)
                return super().evaluate(now, final=final)

        self.engines += 1
        return Noting(default_detectors())


def kinds(findings: list[Finding]) -> list[str]:
    return [f.kind for f in findings]


def verdicts(findings: list[Finding]) -> list[tuple[str, str, float, str]]:
    """The findings less when they were first reported (the evaluation times)."""
    return [(f.kind, f.severity.value, f.since, f.message) for f in findings]


def test_a_run_resumed_days_later_into_its_logdir_is_judged_as_two_runs(tmp_path: Path) -> None:
    # Expected: the 2-day gap is stated once (recording_gap, info: from the last record
    # before it to the first after it, the resumed writer's first record, 3 min before its
    # first step), each side is judged as a run of its own (a second engine), nothing is
    # judged inside the gap or after the last record (no `stalled`: neither across the gap
    # nor from the resumed job's start-up; no warning), and the detectors are asked no more
    # often than over the same hours without the gap (the old replay asked them every 30 s
    # of the gap: 5,760 times more).
    straight_asked, resumed_asked = Asked(), Asked()
    _, end = write_logdir(tmp_path / "straight", 2)
    straight = analyze(tmp_path / "straight", new_engine=straight_asked)
    _, last = write_logdir(tmp_path / "resumed", 2, resumed_after=2 * DAY)
    resumed = analyze(tmp_path / "resumed", new_engine=resumed_asked)

    assert kinds(resumed).count("recording_gap") == 1, resumed
    (gap,) = [f for f in resumed if f.kind == "recording_gap"]
    assert gap.severity.value == "info"
    resumed_at = float(gap.evidence["resumed_at"])
    assert 2 * DAY - 200 < float(gap.evidence["gap_seconds"]) < 2 * DAY
    assert T0 + 3600 < gap.since < T0 + 3700  # halfway through the steps
    assert resumed_at == pytest.approx(gap.since + float(gap.evidence["gap_seconds"]))
    assert "no records for 47.9 h, from 2023-11-1" in gap.message
    assert [f for f in resumed if f.severity.value != "info"] == []
    assert "stalled" not in kinds(resumed)
    assert all(float(f.evidence["first_reported"]) <= last for f in resumed)

    assert resumed_asked.engines == 2
    assert not [t for t in resumed_asked.times if gap.since < t < resumed_at]
    assert max(resumed_asked.times) == pytest.approx(last)
    # The resumed job's start-up before its first step is 3 more minutes of records.
    assert len(resumed_asked.times) <= len(straight_asked.times) + RESTART_SECONDS / 30 + 2
    assert max(straight_asked.times) == pytest.approx(end)
    assert set(kinds(straight)) <= set(kinds(resumed))


def test_a_file_whose_first_record_is_dated_years_earlier_costs_nothing_more(
    tmp_path: Path,
) -> None:
    # Expected: the first record (the writer's file_version, dated 3 years before the
    # steps) is a part of its own, the gap after it is stated, and the steps get the
    # verdict they get without it, for as many evaluations (the old replay: one every 30 s
    # of the 3 years, 3.2 million).
    straight_asked, misdated_asked = Asked(), Asked()
    write_logdir(tmp_path / "straight", 1)
    straight = analyze(tmp_path / "straight", new_engine=straight_asked)
    write_logdir(tmp_path / "misdated", 1, first_record_dated=T0 - 3 * YEAR)
    misdated = analyze(tmp_path / "misdated", new_engine=misdated_asked)

    (gap,) = [f for f in misdated if f.kind == "recording_gap"]
    assert gap.since == T0 - 3 * YEAR
    assert 3 * YEAR < float(gap.evidence["gap_seconds"]) < 3 * YEAR + 10
    assert "records of one instant" in gap.message
    assert verdicts([f for f in misdated if f.kind != "recording_gap"]) == verdicts(straight)
    assert len(misdated_asked.times) <= len(straight_asked.times) + 2


def step_rows(start: float, seconds: float) -> list[dict[str, object]]:
    """A step logged every second from ``start`` for ``seconds``, as event files give it."""
    return [
        {"t": start + i, "series": "step_timestamp", "value": start + i}
        for i in range(int(seconds))
    ]


def test_a_hang_shorter_than_a_gap_is_still_a_stall(tmp_path: Path) -> None:
    # Expected: 10 min of steps, no record for 2 h (under GAP_SECONDS: a hang, not a
    # resumed run), 10 min more: `stalled` (warning) since the last step before the hang,
    # told with the whole 2 h, first reported within twice the stall limit (2 min) of
    # it; no recording_gap; the 2 h asked about a few times, not every 30 s (240).
    assert GAP_SECONDS > 2 * 3600
    rows = step_rows(T0, 600) + step_rows(T0 + 599 + 7200, 600)
    asked = Asked()
    findings = analyze(write_samples(tmp_path / "hang.jsonl", rows), new_engine=asked)
    assert kinds(findings) == ["stalled"], findings
    (stalled,) = findings
    assert stalled.severity.value == "warning"
    assert stalled.since == T0 + 599
    assert 7100 < float(stalled.evidence["seconds_since_last_step"]) <= 7200
    assert stalled.since + 120 < float(stalled.evidence["first_reported"]) < stalled.since + 300
    assert len(asked.times) < 20 + 20 + 15  # 10 min + 10 min at 30 s, and the silence


def test_nothing_is_judged_after_the_last_record(tmp_path: Path) -> None:
    # Expected: steps for 10 min, then memory readings alone for 10 more (the job hung,
    # still alive): stalled, judged at the last reading, not later; with the readings
    # stopping with the steps: no finding.
    rows = step_rows(T0, 600)
    hung = rows + [
        {"t": T0 + 600 + i, "series": "rss_bytes", "value": GIB} for i in range(0, 600, 10)
    ]
    asked = Asked()
    findings = analyze(write_samples(tmp_path / "hung.jsonl", hung), new_engine=asked)
    assert kinds(findings) == ["stalled"], findings
    assert max(asked.times) == T0 + 1190
    assert float(findings[0].evidence["seconds_since_last_step"]) == 1190 - 599
    assert analyze(write_samples(tmp_path / "ended.jsonl", rows)) == []


def test_a_long_read_on_a_terminal_shows_a_progress_bar() -> None:
    out = io.StringIO()
    progress = ReadProgress(Console(file=out, force_terminal=True, width=100), after=0.0)
    progress(512 << 20, 1 << 30)
    progress(1 << 30, 1 << 30)
    progress.close()
    assert "reading event files" in out.getvalue()
    assert "1.1/1.1 GB" in out.getvalue()


@pytest.mark.parametrize(("terminal", "after"), [(False, 0.0), (True, 3600.0)])
def test_no_progress_bar_off_a_terminal_or_for_a_quick_read(terminal: bool, after: float) -> None:
    out = io.StringIO()
    progress = ReadProgress(Console(file=out, force_terminal=terminal), after=after)
    progress(1, 2)
    progress.close()
    assert out.getvalue() == ""


def test_analyze_of_a_logdir_prints_nothing_on_stderr_off_a_terminal(tmp_path: Path) -> None:
    write_logdir(tmp_path / "logs", 0.5)
    result = run_cli("analyze", "--json", str(tmp_path / "logs"))
    assert result.returncode == 0, result.stderr
    assert result.stderr == ""


def test_analyze_says_what_it_read_before_its_findings_and_json_stays_findings_only(
    tmp_path: Path,
) -> None:
    """Expected: 2 event files (a 1-h run resumed a day later halfway), one gap of 23.9 h."""
    write_logdir(tmp_path / "logs", 1.0, resumed_after=DAY)
    result = run_cli("analyze", str(tmp_path / "logs"))
    assert result.returncode == 0, result.stderr
    first = result.stdout.splitlines()[0]
    assert re.fullmatch(
        r"read 2 event files of logs: [\d,]+ records \([\d,]+ samples\), steps [\d,]+ to "
        r"[\d,]+, 25\.0 h from .* to .*, gaps: 23\.9 h from .*",
        first,
    ), first
    as_json = run_cli("analyze", "--json", str(tmp_path / "logs"))
    assert all(line.startswith("{") for line in as_json.stdout.splitlines()), as_json.stdout
