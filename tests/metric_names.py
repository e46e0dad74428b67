"""Which metric names exist: driftwatch's exposition and its recording rules, for the tests
that check that rules and dashboards only query series that can exist."""

from __future__ import annotations

import re
from typing import Any

import yaml
from prometheus_client.core import CounterMetricFamily, InfoMetricFamily

from driftwatch.commands import bundle
from driftwatch.export.prometheus import DriftwatchCollector
from driftwatch.series import SERIES

_NAME = re.compile(r"(?<![\w:\"'])((?:[a-z_]+:)?driftwatch_[a-z0-9_]+(?::[a-z0-9_]+)?)")


def referenced(expr: str) -> set[str]:
    """Names of driftwatch's metrics and recorded series that a PromQL expression uses."""
    return set(_NAME.findall(expr))


def rules() -> list[dict[str, Any]]:
    """Every rule of the bundled rule file, recording and alerting."""
    groups = yaml.safe_load(bundle.rules().text)["groups"]
    return [rule for group in groups for rule in group["rules"]]


def recorded() -> set[str]:
    return {rule["record"] for rule in rules() if "record" in rule}


def exported() -> set[str]:
    """Every metric name driftwatch's exposition can carry."""
    names = {spec.metric for spec in SERIES.values()}
    for family in DriftwatchCollector(list).collect():
        if isinstance(family, InfoMetricFamily):
            names.add(f"{family.name}_info")
        elif isinstance(family, CounterMetricFamily):
            names.add(f"{family.name}_total")
        else:
            names.add(family.name)
    return names
