"""Prometheus exposition: a custom collector on driftwatch's own registry.

Every scrape builds fresh metric families from the latest snapshots, driven by the
``SERIES`` table, so a run that ended and was dropped simply stops appearing.
"""

from __future__ import annotations

import platform
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any

from prometheus_client import CollectorRegistry
from prometheus_client.core import InfoMetricFamily, Metric
from prometheus_client.registry import Collector

from driftwatch import __version__
from driftwatch.export.exposition import Family, metrics_wsgi_app
from driftwatch.findings import CAPTURE_ERROR, CAPTURE_EVIDENCE, worst_per_kind
from driftwatch.runtime.snapshot import Snapshot
from driftwatch.series import SERIES, MetricType, Scope

RUN_LABEL = "run"
RANK_LABEL = "rank"
"""Beside ``run`` on every per-run series while a run watched is one rank of a distributed
job (``worker:1``); a run of one process has it empty, which Prometheus drops."""
COMMAND_LABEL_LIMIT = 200
"""Characters of the (redacted) command kept in the info metric: bounded label size."""

SnapshotProvider = Callable[[], Iterable[Snapshot]]

Rows = Iterable[tuple[tuple[str, ...], float]]
"""A family's samples for one run: the values of its labels after ``run``, and the value."""


def _cause_ranks(snapshot: Snapshot) -> Rows:
    for kind, item in worst_per_kind(snapshot.findings).items():
        yield from (((kind, cause.cause), float(rank)) for rank, cause in enumerate(item.causes, 1))


def _cause_scores(snapshot: Snapshot) -> Rows:
    for kind, item in worst_per_kind(snapshot.findings).items():
        yield from (((kind, cause.cause), cause.score) for cause in item.causes)


def _capture_failures(snapshot: Snapshot) -> Rows:
    for kind, item in worst_per_kind(snapshot.findings).items():
        for key in item.evidence:
            if key.startswith(CAPTURE_EVIDENCE) and key.endswith(CAPTURE_ERROR):
                yield (kind, key[len(CAPTURE_EVIDENCE) : -len(CAPTURE_ERROR)]), 1.0


@dataclass(frozen=True)
class RunFamily:
    """A gauge with one or more samples per run, read from the run's snapshot."""

    name: str
    help: str
    labels: tuple[str, ...]  # after ``run``
    rows: Callable[[Snapshot], Rows]


RUN_FAMILIES = (
    RunFamily(
        "driftwatch_target_start_time_seconds",
        "Start time of the watched process since the unix epoch.",
        (),
        lambda snapshot: [((), snapshot.target.create_time)],
    ),
    RunFamily(
        "driftwatch_last_sample_timestamp_seconds",
        "When driftwatch last sampled the run.",
        (),
        lambda snapshot: [((), snapshot.t)],
    ),
    RunFamily(
        "driftwatch_source_up",
        "Whether a data source works for the run (1) or was switched off (0).",
        ("source",),
        lambda snapshot: (((s.name,), 1.0 if s.up else 0.0) for s in snapshot.sources),
    ),
    RunFamily(
        "driftwatch_finding_active",
        "1 for each kind of problem driftwatch currently reports for the run.",
        ("kind", "severity"),
        lambda snapshot: (((f.kind, f.severity.value), 1.0) for f in snapshot.findings),
    ),
    RunFamily(
        "driftwatch_finding_since_timestamp_seconds",
        "When each active finding's problem started.",
        ("kind",),
        lambda snapshot: (((f.kind,), f.since) for f in snapshot.findings),
    ),
    RunFamily(
        "driftwatch_detector_score",
        "Each detector's evidence against its threshold: 1 or more means it reports.",
        ("detector",),
        lambda snapshot: (((name,), value) for name, value in snapshot.scores.items()),
    ),
    RunFamily(
        "driftwatch_finding_cause_rank",
        "Rank of each likely cause of an active slowdown or stall (1: the top cause).",
        ("kind", "cause"),
        _cause_ranks,
    ),
    RunFamily(
        "driftwatch_finding_cause_score",
        "How far each likely cause's signals moved with the slowdown or stall (1 or more "
        "counts; docs/causes.md).",
        ("kind", "cause"),
        _cause_scores,
    ),
    RunFamily(
        "driftwatch_finding_capture_failed",
        "1 for each capture (stack, trace) an active finding called for that could not be "
        "made; the finding's evidence says why (docs/capture.md).",
        ("kind", "capture"),
        _capture_failures,
    ),
)
"""The per-run gauges beside the series of ``SERIES``, in the order a scrape lists them."""


class DriftwatchCollector(Collector):
    """Yields driftwatch's metric families from whatever ``snapshots()`` returns now."""

    def __init__(self, snapshots: SnapshotProvider) -> None:
        self._snapshots = snapshots

    def collect(self) -> Iterator[Metric]:
        snapshots = list(self._snapshots())
        build = InfoMetricFamily("driftwatch_build", "driftwatch version and runtime.")
        build.add_metric([], {"version": __version__, "python": platform.python_version()})
        yield build
        run_labels = (RUN_LABEL, RANK_LABEL) if any(s.rank for s in snapshots) else (RUN_LABEL,)
        yield from self._series_families(snapshots, run_labels)
        yield from self._run_families(snapshots, run_labels)

    @staticmethod
    def _series_families(
        snapshots: list[Snapshot], run_labels: tuple[str, ...]
    ) -> Iterator[Metric]:
        # Each run's values sorted by series once: a scrape walks every value once, not
        # once per series of the table.
        by_series: dict[str, list[tuple[tuple[str, ...], tuple[str, ...], float]]] = {}
        for snapshot in snapshots:
            run = _run_values(snapshot, run_labels)
            for (name, labels), value in snapshot.values.items():
                entry = (run, tuple(v for _, v in labels), value)
                by_series.setdefault(name, []).append(entry)
        for series, spec in SERIES.items():
            values = by_series.get(series)
            if not values:
                continue
            per_run = spec.scope is Scope.RUN
            label_names = [*run_labels, *spec.label_names] if per_run else list(spec.label_names)
            kind = "counter" if spec.kind is MetricType.COUNTER else "gauge"
            family = Family(spec.metric, spec.help, kind, label_names)
            seen: set[tuple[str, ...]] = set()
            for run, label_values, value in values:
                if per_run:
                    label_values = (*run, *label_values)
                if label_values in seen:  # node-wide series seen through several runs
                    continue
                seen.add(label_values)
                family.add_metric(label_values, value)
            yield family

    @staticmethod
    def _run_families(snapshots: list[Snapshot], run_labels: tuple[str, ...]) -> Iterator[Metric]:
        info = InfoMetricFamily(
            "driftwatch_target", "The watched process of each run.", labels=run_labels
        )
        for snapshot in snapshots:
            target = snapshot.target
            command = " ".join(target.command)[:COMMAND_LABEL_LIMIT]
            labels = {"pid": str(target.pid), "command": command, "user": target.username}
            info.add_metric(_run_values(snapshot, run_labels), labels)
        yield info
        for spec in RUN_FAMILIES:
            family = Family(spec.name, spec.help, "gauge", [*run_labels, *spec.labels])
            for snapshot in snapshots:
                run = _run_values(snapshot, run_labels)
                for label_values, value in spec.rows(snapshot):
                    family.add_metric((*run, *label_values), value)
            yield family


def _run_values(snapshot: Snapshot, run_labels: tuple[str, ...]) -> tuple[str, ...]:
    """The values of ``run_labels`` (``run``, and ``rank`` where a run has one) of a run."""
    return (snapshot.run, snapshot.rank) if len(run_labels) == 2 else (snapshot.run,)


def metrics_app(snapshots: SnapshotProvider) -> Callable[..., Any]:
    """A WSGI app serving the exposition of a fresh registry holding only our collector."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(DriftwatchCollector(snapshots))
    return metrics_wsgi_app(registry)
