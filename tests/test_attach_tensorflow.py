"""``driftwatch attach`` on a real Keras training process that knows nothing of driftwatch."""

from __future__ import annotations

import math
import os
import re
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import psutil
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.conftest import EXAMPLES, TF_ENV, promtool_check_metrics, wait_for

pytestmark = [pytest.mark.tf, pytest.mark.paired]

INTERVAL = 2.0
"""attach's default --interval: the seconds between the lines it prints."""


def event_bytes(logdir: Path) -> int:
    return sum(p.stat().st_size for p in logdir.rglob("events.out.tfevents.*"))


def scrape(url: str) -> str:
    with urllib.request.urlopen(url, timeout=10) as response:
        body: bytes = response.read()
    return body.decode()


def values(text: str) -> dict[str, float]:
    """``name`` -> value for the single-series metrics of the scrape."""
    return {s.name: s.value for f in text_string_to_metric_families(text) for s in f.samples}


def test_attach_to_a_running_keras_job(tmp_path: Path, promtool: str) -> None:
    logdir = tmp_path / "logs"
    logdir.mkdir()
    job = subprocess.Popen(
        [
            sys.executable,
            str(EXAMPLES / "train_keras.py"),
            "--logdir",
            str(logdir),
            "--epochs",
            "1000",
        ],
        stderr=subprocess.DEVNULL,
        env={**os.environ, **TF_ENV},
    )
    attach: subprocess.Popen[str] | None = None
    try:
        # The job is training and logging steps before driftwatch arrives.
        wait_for(
            lambda: event_bytes(logdir) > 2000 and len(list(logdir.rglob("events.out.*"))) == 2,
            120,
            "the job to log training steps and its first validation",
        )
        attach = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "driftwatch",
                "attach",
                str(job.pid),
                "--listen",
                "127.0.0.1:0",
                "--logdir",
                str(logdir),
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        assert attach.stdout is not None
        assert attach.stderr is not None
        started = time.monotonic()
        url_match = re.search(r"metrics at (http://\S+)", attach.stderr.readline())
        assert url_match, "attach did not say where its metrics are"

        # Within two sampling intervals the view shows RSS, event-file growth and step rate.
        lines = [attach.stdout.readline(), attach.stdout.readline()]
        assert time.monotonic() - started < 2 * INTERVAL + 3  # + start-up of the CLI itself
        second = lines[1]
        assert re.search(r"RSS: [\d.]+ MiB", second), second
        assert re.search(r"event files: 2 files, [\d.]+ KiB \([\d.]+ [KM]iB/h\)", second), second
        assert re.search(r"step: \d+, [\d.]+ ms/step \([\d.]+ steps/s\)", second), second

        text = scrape(url_match.group(1))
        metrics = values(text)
        assert 100e6 < metrics["driftwatch_process_resident_memory_bytes"] < 8e9
        assert metrics["driftwatch_event_files"] == 2  # train/ and validation/
        assert metrics["driftwatch_event_file_bytes"] > 2000
        assert (
            metrics["driftwatch_event_file_largest_bytes"] <= metrics["driftwatch_event_file_bytes"]
        )
        assert metrics["driftwatch_train_step"] > 0
        assert 1e-5 < metrics["driftwatch_step_duration_seconds"] < 1.0
        assert math.isclose(
            metrics["driftwatch_target_start_time_seconds"],
            psutil.Process(job.pid).create_time(),
            abs_tol=1,
        )
        assert metrics["driftwatch_process_cpu_seconds_total"] > 0
        checked = promtool_check_metrics(promtool, text)
        assert checked.returncode == 0, checked.stdout + checked.stderr
        assert checked.stdout.strip() == "", checked.stdout

        # Killing the job ends attach with a summary and exit 0.
        job.kill()
        out, err = attach.communicate(timeout=30)
        assert attach.returncode == 0, err
        assert f"stopped: process {job.pid} has exited" in out
        assert re.search(r"steps: last step \d+, recent median [\d.]+ ms/step", out)
        assert "Traceback" not in err
    finally:
        job.kill()
        job.wait()
        if attach is not None and attach.poll() is None:
            attach.kill()
            attach.wait()
