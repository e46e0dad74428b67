"""The bundled Prometheus rules: promtool's checks and unit tests, and what promtool cannot
see (an alert per finding kind, a test per alert both ways, runbook anchors, metric names)."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest
import yaml

from driftwatch.commands import bundle
from driftwatch.findings import KINDS
from tests.conftest import REPO
from tests.metric_names import exported, recorded, referenced, rules

PROMETHEUS_DIR = REPO / "deploy" / "prometheus"
RULES = PROMETHEUS_DIR / "driftwatch.rules.yml"
RULE_TESTS = PROMETHEUS_DIR / "driftwatch.rules.test.yml"
RUNBOOK = REPO / "docs" / "runbook.md"
RUNBOOK_URL = "https://github.com/driftwatch/driftwatch/blob/main/docs/runbook.md#"

FINDING_KINDS = {kind for kind, spec in KINDS.items() if spec.runbook is not None}
"""Every kind of finding reported live, each with its alert and runbook section (``KINDS``)."""

ALERTS = [rule for rule in rules() if "alert" in rule]


def promtool_run(promtool: str, *args: str, cwd: Path = REPO) -> None:
    done = subprocess.run(
        [promtool, *args], capture_output=True, text=True, cwd=cwd, timeout=120, check=False
    )
    assert done.returncode == 0, done.stdout + done.stderr


def test_the_repository_links_to_the_packaged_rules() -> None:
    assert RULES.is_symlink()
    assert RULES.read_text() == bundle.rules().text


def test_promtool_check_rules(promtool: str) -> None:
    promtool_run(promtool, "check", "rules", str(RULES))


def test_promtool_unit_tests(promtool: str) -> None:
    promtool_run(promtool, "test", "rules", RULE_TESTS.name, cwd=PROMETHEUS_DIR)


def test_every_alert_has_a_firing_and_a_quiet_unit_test() -> None:
    cases = [
        case
        for group in yaml.safe_load(RULE_TESTS.read_text())["tests"]
        for case in group["alert_rule_test"]
    ]
    for alert in ALERTS:
        mine = [case for case in cases if case["alertname"] == alert["alert"]]
        assert any(case["exp_alerts"] for case in mine), f"{alert['alert']} never fires"
        assert any(not case["exp_alerts"] for case in mine), f"{alert['alert']} always fires"


def test_every_finding_kind_has_its_alert() -> None:
    alerted = {
        match.group(1)
        for alert in ALERTS
        if (match := re.fullmatch(r'driftwatch_finding_active\{kind="(\w+)"\} == 1', alert["expr"]))
    }
    assert alerted == FINDING_KINDS


def test_each_finding_alert_links_the_runbook_section_of_its_kind() -> None:
    for alert in ALERTS:
        match = re.fullmatch(r'driftwatch_finding_active\{kind="(\w+)"\} == 1', alert["expr"])
        if match is not None:
            anchor = KINDS[match.group(1)].runbook
            assert alert["annotations"]["runbook_url"] == RUNBOOK_URL + str(anchor), alert["alert"]


@pytest.mark.parametrize("alert", ALERTS, ids=lambda alert: alert["alert"])
def test_alert_has_severity_annotations_and_a_runbook_section(alert: dict[str, object]) -> None:
    labels = alert.get("labels") or {}
    assert isinstance(labels, dict)
    # Alerts on findings take the finding's own severity label from the series.
    assert labels.get("severity") in {"info", "warning", "critical"} or "finding_active" in str(
        alert["expr"]
    )
    annotations = alert["annotations"]
    assert isinstance(annotations, dict)
    assert set(annotations) == {"summary", "description", "runbook_url"}
    anchor = str(alert["alert"]).lower()
    assert annotations["runbook_url"] == RUNBOOK_URL + anchor
    headings = re.findall(r"^## (.+)$", RUNBOOK.read_text(), re.MULTILINE)
    assert anchor in {heading.strip().lower() for heading in headings}


def test_runbook_links_between_sections_resolve() -> None:
    text = RUNBOOK.read_text()
    anchors = {h.strip().lower() for h in re.findall(r"^## (.+)$", text, re.MULTILINE)}
    for target in re.findall(r"\]\(#([\w-]+)\)", text):
        assert target in anchors, target


def test_rules_query_only_series_that_exist() -> None:
    known = exported() | recorded()
    for rule in rules():
        assert referenced(rule["expr"]) <= known, rule.get("record") or rule.get("alert")
