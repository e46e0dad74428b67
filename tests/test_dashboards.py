"""The bundled Grafana dashboards, held to grafana/dashboard-linter's rules (the linter itself
cannot be installed here), and their queries to PromQL that promtool accepts and to series
that exist."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from driftwatch.commands import bundle
from tests.conftest import REPO, promtool_check_rules
from tests.metric_names import exported, recorded, referenced

DASHBOARDS = {name: json.loads(asset.text) for name, asset in bundle.dashboards().items()}
UNITS = {"none", "short", "percentunit", "bytes", "Bps", "s", "celsius", "watt"}
"""The Grafana units the dashboards use; dashboard-linter accepts these among many."""
TEMPLATED_DATASOURCE = {"$datasource", "${datasource}"}
RANGE_FUNCTIONS = ("rate", "irate", "increase")
EXAMPLE_VALUES = {
    "$__rate_interval": "1m",
    "$job": "driftwatch",
    "$instance": "node1:19461",
    "$run": "train",
}
"""What Grafana would put in place of each variable; used to run the queries elsewhere."""


def panels(dashboard: dict[str, Any]) -> list[dict[str, Any]]:
    return [panel for panel in dashboard["panels"] if panel["type"] != "row"]


def queries(dashboard: dict[str, Any]) -> list[str]:
    """Every PromQL expression: panel targets and annotations."""
    exprs = [target["expr"] for panel in panels(dashboard) for target in panel["targets"]]
    return exprs + [a["expr"] for a in dashboard["annotations"]["list"]]


def expand(expr: str, values: dict[str, str] = EXAMPLE_VALUES) -> str:
    """The query as Grafana sends it, with these values for the variables."""
    for variable, value in values.items():
        expr = expr.replace(variable, value)
    assert "$" not in expr, expr
    return expr


def variable(dashboard: dict[str, Any], name: str) -> dict[str, Any]:
    (found,) = [v for v in dashboard["templating"]["list"] if v["name"] == name]
    assert isinstance(found, dict)
    return found


each_dashboard = pytest.mark.parametrize("dashboard", DASHBOARDS.values(), ids=list(DASHBOARDS))


def test_the_repository_links_to_the_packaged_dashboards() -> None:
    for name, asset in bundle.dashboards().items():
        path = REPO / "grafana" / "dashboards" / asset.filename
        assert path.is_symlink(), name
        assert path.read_text() == asset.text


@each_dashboard
def test_one_templated_prometheus_datasource(dashboard: dict[str, Any]) -> None:
    # template-datasource-rule
    sources = [v for v in dashboard["templating"]["list"] if v["type"] == "datasource"]
    assert len(sources) == 1
    assert sources[0]["name"] == "datasource"
    assert sources[0]["label"] == "Data source"
    assert sources[0]["query"] == "prometheus"


@each_dashboard
@pytest.mark.parametrize("name", ["job", "instance"])
def test_job_and_instance_variables(dashboard: dict[str, Any], name: str) -> None:
    # template-job-rule, template-instance-rule
    template = variable(dashboard, name)
    assert template["type"] == "query"
    assert template["datasource"]["uid"] in TEMPLATED_DATASOURCE
    assert template["label"] == name.title()
    assert template["multi"] is True
    assert template["allValue"] == ".+"


@each_dashboard
def test_query_variables_reload_on_time_change_and_are_label_queries(
    dashboard: dict[str, Any],
) -> None:
    # template-on-time-change-reload-rule, template-label-promql-rule
    for template in dashboard["templating"]["list"]:
        if template["type"] == "query":
            assert template["refresh"] == 2, template["name"]
            assert re.fullmatch(r"label_values\(.+, \w+\)", template["query"]), template["name"]


@each_dashboard
def test_every_variable_is_used(dashboard: dict[str, Any]) -> None:
    # template-unused-rule (datasource and job are used by the other variables too)
    text = json.dumps(dashboard["panels"]) + json.dumps(dashboard["annotations"])
    for template in dashboard["templating"]["list"]:
        assert f"${template['name']}" in text or "${" + template["name"] + "}" in text


@each_dashboard
def test_not_editable(dashboard: dict[str, Any]) -> None:
    # uneditable-dashboard-rule
    assert dashboard["editable"] is False


@each_dashboard
def test_every_panel_titled_described_with_a_unit_and_the_templated_datasource(
    dashboard: dict[str, Any],
) -> None:
    # panel-title-description-rule, panel-units-rule, panel-datasource-rule,
    # panel-no-targets-rule
    for panel in panels(dashboard):
        assert panel["title"].strip(), panel["id"]
        assert panel["description"].strip(), panel["title"]
        assert panel["fieldConfig"]["defaults"]["unit"] in UNITS, panel["title"]
        assert panel["datasource"]["uid"] in TEMPLATED_DATASOURCE, panel["title"]
        assert panel["targets"], panel["title"]
        for target in panel["targets"]:
            assert target["datasource"]["uid"] in TEMPLATED_DATASOURCE, panel["title"]


@each_dashboard
def test_panels_do_not_overlap(dashboard: dict[str, Any]) -> None:
    cells: set[tuple[int, int]] = set()
    for panel in dashboard["panels"]:
        pos = panel["gridPos"]
        assert pos["x"] + pos["w"] <= 24, panel["title"]
        mine = {
            (x, y)
            for x in range(pos["x"], pos["x"] + pos["w"])
            for y in range(pos["y"], pos["y"] + pos["h"])
        }
        assert not cells & mine, panel["title"]
        cells |= mine


@each_dashboard
def test_every_selector_has_job_and_instance_matchers(dashboard: dict[str, Any]) -> None:
    # target-job-rule, target-instance-rule
    for expr in queries(dashboard):
        for selector in re.findall(r"[\w:]+\{[^}]*\}", expr):
            assert 'job=~"$job"' in selector, selector
            assert 'instance=~"$instance"' in selector, selector
        assert not re.search(r"[\w:]+(?!\{)\[", expr), expr  # a range without matchers


@each_dashboard
def test_rate_functions_use_rate_interval_and_counters_only_appear_inside_them(
    dashboard: dict[str, Any],
) -> None:
    # target-rate-interval-rule, target-counter-agg-rule
    call = r"\b(" + "|".join(RANGE_FUNCTIONS) + r")\(\s*([\w:]+)\{[^}]*\}\[([^\]]+)\]\)"
    for expr in queries(dashboard):
        for _, _, window in re.findall(call, expr):
            assert window == "$__rate_interval", expr
        bare = re.sub(call, "", expr)
        assert not re.search(r"\w+_total\b", bare), expr


def test_range_functions_are_recognised() -> None:
    # The two checks above only see what their pattern matches: make sure it matches.
    run = DASHBOARDS["run"]
    assert any("rate(" in expr and "_total{" in expr for expr in queries(run))
    assert any("increase(" in expr for expr in queries(run))


@each_dashboard
def test_queries_use_only_series_that_exist(dashboard: dict[str, Any]) -> None:
    known = exported() | recorded()
    for expr in queries(dashboard):
        assert referenced(expr) <= known, expr


def test_queries_are_valid_promql(promtool: str, tmp_path: Path) -> None:
    # target-promql-rule: promtool parses each query as a recording rule's expression.
    exprs = [expand(expr) for dashboard in DASHBOARDS.values() for expr in queries(dashboard)]
    rules = [{"record": f"dashboard:query{i}", "expr": expr} for i, expr in enumerate(exprs)]
    path = tmp_path / "queries.yml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "dashboards", "rules": rules}]}))
    done = promtool_check_rules(promtool, path)
    assert done.returncode == 0, done.stdout + done.stderr


def test_findings_are_annotations() -> None:
    for dashboard in DASHBOARDS.values():
        (annotation,) = dashboard["annotations"]["list"]
        assert "driftwatch_finding_active" in annotation["expr"]
        assert annotation["datasource"]["uid"] in TEMPLATED_DATASOURCE


def test_provisioning() -> None:
    provisioning = REPO / "grafana" / "provisioning"
    (source,) = yaml.safe_load((provisioning / "datasources" / "driftwatch.yml").read_text())[
        "datasources"
    ]
    assert source["type"] == "prometheus"
    assert source["uid"] == "driftwatch-prometheus"
    (provider,) = yaml.safe_load((provisioning / "dashboards" / "driftwatch.yml").read_text())[
        "providers"
    ]
    assert provider["type"] == "file"
    assert provider["allowUiUpdates"] is False
