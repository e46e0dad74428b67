"""End to end to a person: a real Prometheus scrapes ``driftwatch run`` watching a Keras job
that leaks descriptors, evaluates the bundled rules, and sends the alert to a real
Alertmanager (Debian's ``prometheus-alertmanager``), which delivers it to this test's webhook
receiver, grouped per run, with its runbook link, by the route shipped in
``deploy/alertmanager/alertmanager.yml``."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.conftest import REPO, TF_ENV, wait_for
from tests.test_custom_loop_hook import ONE_THREAD
from tests.test_prometheus_e2e import RULES, free_port, stop
from tests.test_resource_exhaustion_e2e import FIT

pytestmark = [pytest.mark.tf, pytest.mark.paired]

ALERTMANAGER = shutil.which("prometheus-alertmanager") or shutil.which("alertmanager")
ROUTE = REPO / "deploy" / "alertmanager" / "alertmanager.yml"
RUN = "leaky"


class Receiver(ThreadingHTTPServer):
    """A webhook receiver that keeps every notification Alertmanager posts to it."""

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.notifications: list[dict[str, Any]] = []

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}/driftwatch"


class _Handler(BaseHTTPRequestHandler):
    server: Receiver

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers["Content-Length"]))
        self.server.notifications.append(json.loads(body))
        self.send_response(200)
        self.end_headers()

    def log_message(self, format: str, *args: Any) -> None:
        """Quiet: the test reads what was posted, not the access log."""


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    server = Receiver()
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()


def shipped_route_to(url: str) -> str:
    """The shipped Alertmanager configuration, its receiver posting to ``url`` and its
    waits cut to a second (the test's time, not a route's meaning)."""
    config = yaml.safe_load(ROUTE.read_text())
    config["receivers"][0]["webhook_configs"][0]["url"] = url
    for route in config["route"]["routes"]:
        route.update(group_wait="1s", group_interval="1s")
    return yaml.safe_dump(config)


HELD_SECONDS = 5
"""The ``for`` of the rule under test here, instead of its shipped minute (its promtool tests
hold it to the minute): what is tested here is the way from the rule to a person."""


def rules_held_briefly(path: Path) -> Path:
    """The shipped rules with DriftwatchFdExhaustion's ``for`` set to ``HELD_SECONDS``."""
    groups = yaml.safe_load(RULES.read_text())
    rules = [rule for group in groups["groups"] for rule in group["rules"]]
    (rule,) = [rule for rule in rules if rule.get("alert") == "DriftwatchFdExhaustion"]
    rule["for"] = f"{HELD_SECONDS}s"
    path.write_text(yaml.safe_dump(groups, sort_keys=False))
    return path


def started(command: list[str], log: Path) -> subprocess.Popen[bytes]:
    with log.open("wb") as out:
        return subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT)


def test_a_descriptor_leak_reaches_a_webhook_through_prometheus_and_alertmanager(
    tmp_path: Path, receiver: Receiver
) -> None:
    # Expected: the job leaks about 40 descriptors a second under a limit it will not reach
    # during the test; driftwatch reports fd_exhaustion within seconds, its alert fires
    # HELD_SECONDS later (its `for` here), and Alertmanager posts one notification for the
    # run holding DriftwatchFdExhaustion with the run's label and the runbook section's link.
    assert ALERTMANAGER is not None, "no prometheus-alertmanager: make system-deps installs it"
    (tmp_path / "logs").mkdir()
    script = tmp_path / "train.py"
    script.write_text(FIT)
    listen = f"127.0.0.1:{free_port()}"
    watched = [sys.executable, "-m", "driftwatch", "run", "--listen", listen, "--run", RUN]
    job = [sys.executable, str(script), str(tmp_path / "logs"), "fds", "0.025", "240"]
    alertmanager_at = f"127.0.0.1:{free_port()}"
    (tmp_path / "alertmanager.yml").write_text(shipped_route_to(receiver.url))
    (tmp_path / "prometheus.yml").write_text(
        "global: {scrape_interval: 1s, evaluation_interval: 1s}\n"
        f"rule_files: [{rules_held_briefly(tmp_path / 'rules.yml')}]\n"
        f"alerting: {{alertmanagers: [{{static_configs: [{{targets: ['{alertmanager_at}']}}]}}]}}\n"
        f"scrape_configs: [{{job_name: driftwatch, static_configs: [{{targets: ['{listen}']}}]}}]\n"
    )
    processes = [
        subprocess.Popen(
            [*watched, "--", "prlimit", "--nofile=16384", *job],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            env={**os.environ, **TF_ENV, **ONE_THREAD},
        ),
        started(
            [
                ALERTMANAGER,
                f"--config.file={tmp_path / 'alertmanager.yml'}",
                f"--storage.path={tmp_path / 'alertmanager'}",
                f"--web.listen-address={alertmanager_at}",
                "--cluster.listen-address=",
            ],
            tmp_path / "alertmanager.log",
        ),
        started(
            [
                "prometheus",
                f"--config.file={tmp_path / 'prometheus.yml'}",
                f"--storage.tsdb.path={tmp_path / 'data'}",
                f"--web.listen-address=127.0.0.1:{free_port()}",
            ],
            tmp_path / "prometheus.log",
        ),
    ]
    try:

        def delivered() -> list[dict[str, Any]]:
            return [
                alert
                for notification in receiver.notifications
                for alert in notification["alerts"]
                if alert["labels"]["alertname"] == "DriftwatchFdExhaustion"
            ]

        # TF's start-up (5-40 s on this machine), the leak seen within seconds, the `for`.
        wait_for(lambda: delivered(), 200, "the alert at the webhook", poll=0.5)
        (notification,) = [
            n for n in receiver.notifications if any(a in delivered() for a in n["alerts"])
        ][:1]
        assert notification["groupLabels"]["run"] == RUN
        assert notification["status"] == "firing"
        alert = delivered()[0]
        assert alert["labels"]["run"] == RUN
        assert alert["labels"]["kind"] == "fd_exhaustion"
        assert re.search(
            r"docs/runbook\.md#driftwatchfdexhaustion$", alert["annotations"]["runbook_url"]
        )
        assert all(a["labels"]["run"] == RUN for a in notification["alerts"])  # one run's
    finally:
        for process in processes:
            stop(process)
