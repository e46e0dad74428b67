"""End to end with a real Prometheus server: it scrapes ``driftwatch attach`` watching a real
Keras job (hooked, with an injected slowdown) and evaluates the bundled rules. Every recording
rule and every dashboard query must return data, and the slowdown's alert must go off.

The machine has no GPU: the driftwatch process imports ``tests/fake_pynvml.py`` (scenario
"ok") as ``pynvml``, so the GPU series and panels have data too.
"""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from driftwatch.commands.launch import child_environment
from tests.conftest import EXAMPLES, REPO, TF_ENV, wait_for
from tests.metric_names import recorded
from tests.test_dashboards import DASHBOARDS, EXAMPLE_VALUES, expand, queries

pytestmark = [pytest.mark.tf, pytest.mark.paired]  # a 10x slowdown: a neighbour cannot hide it

RULES = REPO / "deploy" / "prometheus" / "driftwatch.rules.yml"
RUN = "e2e"
FAKE_PYNVML = """\
import os, sys
from tests.fake_pynvml import FakeNvml
sys.modules[__name__] = FakeNvml("ok", int(os.environ["FAKE_NVML_TARGET_PID"])).module
"""


def free_port() -> int:
    """A loopback port free now (Prometheus cannot be told to pick one itself)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
    return port


def api(base: str, path: str, **params: str) -> Any:
    url = f"{base}/api/v1/{path}?{urllib.parse.urlencode(params)}"
    with urllib.request.urlopen(url, timeout=10) as response:
        body = json.loads(response.read())
    assert body["status"] == "success", body
    return body["data"]


def stop(process: subprocess.Popen[Any]) -> None:
    if process.poll() is None:
        process.kill()
    process.wait()


NOT_FROM_THIS_JOB = ("driftwatch_cgroup_cpu_", "driftwatch_collective_wait_ratio", 'rank!=""')
"""Metrics (and selectors) this job cannot have: cgroup throttling needs a CPU quota (none
here); collective waits and ranks, a multi-worker job (one process here; promtool's tests
cover the rules on them)."""


@pytest.fixture
def slowing_job(tmp_path: Path) -> Iterator[tuple[subprocess.Popen[bytes], Path]]:
    """A hooked Keras job (as ``driftwatch run`` starts it) whose steps slow down 10 ms, 40 s
    after its first: by time, not by step, as a busy host may slow the job itself several
    times (at a load average of 8-19, only 8,970 steps can come in 130 s, and the detector's
    warm-up and 10 baseline blocks can take 27 s)."""
    logdir = tmp_path / "logs"
    logdir.mkdir()
    env = child_environment({**os.environ, **TF_ENV}, hook=True, run=RUN)
    env["TF_CPU_ALLOCATOR_USE_BFC"] = "true"  # so the hook reports TF allocator memory
    script = [str(EXAMPLES / "train_keras.py"), "--logdir", str(logdir), "--epochs", "1000"]
    job = subprocess.Popen(
        [sys.executable, *script, "--slow-after-seconds", "40", "--slow-seconds", "0.01"],
        stderr=subprocess.DEVNULL,
        env=env,
    )
    yield job, logdir
    stop(job)


def test_prometheus_scrapes_driftwatch_and_evaluates_the_rules(
    tmp_path: Path, slowing_job: tuple[subprocess.Popen[bytes], Path]
) -> None:
    job, logdir = slowing_job
    shim = tmp_path / "shim"
    shim.mkdir()
    (shim / "pynvml.py").write_text(FAKE_PYNVML)
    attach = subprocess.Popen(
        [
            *(sys.executable, "-m", "driftwatch", "attach", str(job.pid)),
            *("--listen", "127.0.0.1:0", "--logdir", str(logdir), "--run", RUN),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        env={
            **os.environ,
            "PYTHONPATH": os.pathsep.join([str(shim), str(REPO)]),
            "FAKE_NVML_TARGET_PID": str(job.pid),
        },
    )
    prometheus: subprocess.Popen[bytes] | None = None
    try:
        assert attach.stderr is not None
        found = re.search(r"metrics at http://([\d.]+:\d+)/", attach.stderr.readline())
        assert found, "attach did not say where its metrics are"
        instance = found.group(1)
        config = tmp_path / "prometheus.yml"
        config.write_text(
            "global: {scrape_interval: 1s, evaluation_interval: 1s}\n"
            f"rule_files: [{RULES}]\n"
            "scrape_configs:\n"
            f"  - {{job_name: driftwatch, static_configs: [{{targets: ['{instance}']}}]}}\n"
        )
        base = f"127.0.0.1:{free_port()}"
        prometheus = subprocess.Popen(
            [
                "prometheus",
                f"--config.file={config}",
                f"--storage.tsdb.path={tmp_path / 'data'}",
                f"--web.listen-address={base}",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        server = f"http://{base}"

        def slowdown_alert() -> bool:
            alerts = api(server, "alerts")["alerts"] if prometheus.poll() is None else []
            return any(
                alert["labels"]["alertname"] == "DriftwatchAbruptSlowdown"
                and alert["labels"]["run"] == RUN
                and alert["state"] in {"pending", "firing"}
                for alert in alerts
            )

        wait_for(lambda: _up(server), 20, "Prometheus to start", poll=0.2)
        # TF's start-up (5-46 s), 40 s of baseline, then the slowdown is seen within seconds.
        wait_for(slowdown_alert, 120, "the slowdown's alert to go off", poll=0.5)

        for name in sorted(recorded()):
            if any(metric in name for metric in NOT_FROM_THIS_JOB):
                continue
            assert api(server, "query", query=name)["result"], f"recording rule {name} is empty"
        values = {**EXAMPLE_VALUES, "$instance": instance, "$run": RUN, "$__rate_interval": "5s"}
        for title, dashboard in DASHBOARDS.items():
            for expr in queries(dashboard):
                result = api(server, "query", query=expand(expr, values))["result"]
                if not result and any(metric in expr for metric in NOT_FROM_THIS_JOB):
                    continue
                assert result, f"{title} dashboard: no data for {expr}"
    finally:
        if prometheus is not None:
            stop(prometheus)
        stop(attach)


def _up(server: str) -> bool:
    try:
        with urllib.request.urlopen(f"{server}/-/ready", timeout=2) as response:
            return bool(response.status == 200)
    except OSError:
        return False
