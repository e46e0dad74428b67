"""``driftwatch analyze`` on samples files and on logdirs of real Keras runs."""

from __future__ import annotations

import json
import math
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from driftwatch.analyze import RecordingError, analyze, read_samples
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
    assert run_cli("analyze", str(path)).stdout.strip() == "flat.jsonl: no findings"


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("not json", "expected {"),
        ('{"t": 1, "series": "rss_bytes"}', "expected {"),
        ('{"t": 1, "series": "no_such", "value": 1}', "unknown series 'no_such'"),
        ('{"t": "x", "series": "rss_bytes", "value": 1}', "must be numbers"),
        ('{"t": 1, "series": "rss_bytes", "value": "1"}', "must be numbers"),
        ('{"t": 1, "series": "rss_bytes", "value": 1, "labels": [1]}', "labels must be an object"),
        ('{"t": -5, "series": "rss_bytes", "value": 1}', "time goes backwards"),
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
    # About 920 steps an epoch: 20,000 ms-steps to settle (blocks of a second: 5 of warm-up
    # and 10 of baseline), then 7,600 steps 2 ms slower.
    logdir = keras_logdir(tmp_path, "slow", "--slow-from-step", "20000", epochs=30)
    findings = analyze(logdir)
    slowdowns = [f for f in findings if f.kind == "abrupt_slowdown"]
    assert slowdowns, findings
    assert float(slowdowns[0].evidence["ratio"]) > 1.5  # 2 ms more on ~1 ms steps


@pytest.mark.tf
def test_analyze_finds_nothing_wrong_in_a_healthy_keras_logdir(tmp_path: Path) -> None:
    findings = analyze(keras_logdir(tmp_path, "healthy"))
    assert [f for f in findings if f.severity.value != "info"] == []
