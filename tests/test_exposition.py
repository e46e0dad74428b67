"""The scrape's renderer against prometheus_client's own: the same bytes in every format."""

from __future__ import annotations

import gzip
import math
from collections.abc import Callable, Iterable, Iterator
from typing import Any, cast

import pytest
from prometheus_client import CollectorRegistry
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.exposition import make_wsgi_app
from prometheus_client.openmetrics import parser as openmetrics_parser
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.registry import Collector

from driftwatch.causes import RankedCause
from driftwatch.export.exposition import Family, Renderer, metrics_wsgi_app
from driftwatch.export.prometheus import DriftwatchCollector, metrics_app
from driftwatch.findings import Finding, Severity
from driftwatch.runtime.snapshot import Snapshot, SourceStatus
from driftwatch.target.process import TargetInfo
from tests.conftest import promtool_check_metrics

openmetrics_families = cast(
    "Callable[[str], Iterator[Metric]]", openmetrics_parser.text_string_to_metric_families
)
PROMETHEUS_3 = (
    "application/openmetrics-text;version=1.0.0;escaping=allow-utf-8;q=0.6,"
    "application/openmetrics-text;version=0.0.1;q=0.5,"
    "text/plain;version=1.0.0;escaping=allow-utf-8;q=0.4,text/plain;version=0.0.4;q=0.3,*/*;q=0.2"
)
"""What Prometheus 3 asks for by default."""
ACCEPTS = [
    None,
    "",
    "*/*",
    "text/plain;version=0.0.4",
    "text/plain;version=1.0.0;escaping=allow-utf-8",
    "text/plain;version=1.0.0;escaping=underscores",
    "application/openmetrics-text",
    "application/openmetrics-text;version=1.0.0",
    "application/openmetrics-text;version=1.0.0;escaping=underscores",
    "application/openmetrics-text;version=0.0.1;q=0.5,text/plain;version=0.0.4;q=0.3",
    PROMETHEUS_3,
    # The library's alone (renamed metrics): the renderer hands these over.
    "text/plain;version=1.0.0;escaping=dots",
    "application/openmetrics-text;version=1.0.0;escaping=values",
]


def snapshot(run: str, pid: int, t: float, value: float) -> Snapshot:
    """A run with label values that need escaping and values that need Go's formatting."""
    info = TargetInfo(
        pid,
        1_700_000_000.25,
        "python",
        ("python", 'train "big".py', "--dir=C:\\runs", "line\nbreak", "naïve ✓"),
        "ml",
        1000,
    )
    stall = Finding(
        "stalled",
        Severity.CRITICAL,
        1_700_000_050.0,
        "no step",
        {},
        (RankedCause("retracing", 12.5), RankedCause("input_wait", 1.0)),
    )
    return Snapshot(
        run=run,
        target=info,
        t=t,
        ticks=7,
        values={
            ("rss_bytes", ()): value * 1e9,
            ("cpu_seconds", ()): value,
            ("step_seconds", ()): math.nan,
            ("train_step", ()): 1e22,
            ("gpu_process_memory_bytes", (("gpu", "0"),)): math.inf,
            ("gpu_memory_total_bytes", (("gpu", "0"),)): -math.inf,
            ("memory_limit_bytes", ()): 1234567.0,
            ("goodput_ratio", ()): -0.0,
            ("nonfinite_by_name_total", (("name", 'w"1\\\n'), ("role", "weight"))): 2.0,
            ("runtime_info", (("keras", "3.1"), ("python", "3.11"), ("tensorflow", ""))): 1.0,
        },
        sources=(SourceStatus("process", True), SourceStatus("nvml", False, "no driver")),
        findings=(stall,),
        scores={"stall": 3.25, "memory_drift": 1e-7},
    )


def call(app: Callable[..., Iterable[bytes]], accept: str | None, **extra: str) -> tuple[Any, ...]:
    """Status, headers and body (unzipped) of one GET."""
    environ: dict[str, Any] = {"REQUEST_METHOD": "GET", "PATH_INFO": "/metrics"}
    environ.update(extra)
    if accept is not None:
        environ["HTTP_ACCEPT"] = accept
    answered: list[Any] = []
    body = b"".join(app(environ, lambda status, headers: answered.extend((status, headers))))
    status, headers = answered
    if ("Content-Encoding", "gzip") in headers:
        body = gzip.decompress(body)
    return status, headers, body


def registry_of(collector: Collector) -> CollectorRegistry:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(collector)
    return registry


def test_every_format_is_byte_for_byte_what_prometheus_client_writes() -> None:
    """Across scrapes whose values, runs and labels change: the renderer's cache never shows."""
    scrapes = [
        [snapshot("a", 1, 1_700_000_100.0, 1.5), snapshot('b "x"\\', 2, 1_700_000_100.0, 2.0)],
        [snapshot("a", 1, 1_700_000_102.0, 1.75), snapshot('b "x"\\', 2, 1_700_000_102.0, 2.0)],
        [snapshot("a", 1, 1_700_000_104.0, 123456789.0)],  # run b ended
        [snapshot("c\nd", 3, 1_700_000_106.0, 0.1), snapshot("a", 1, 1_700_000_106.0, 1e-9)],
        [],
    ]
    current: list[Snapshot] = []
    ours = metrics_app(lambda: current)
    library = make_wsgi_app(registry_of(DriftwatchCollector(lambda: current)))
    for snapshots in scrapes:
        current[:] = snapshots
        for accept in ACCEPTS:
            expected = call(library, accept)
            assert call(ours, accept) == expected, accept
            assert expected[0] == "200 OK"
        zipped = call(ours, PROMETHEUS_3, HTTP_ACCEPT_ENCODING="gzip")
        assert zipped == call(library, PROMETHEUS_3, HTTP_ACCEPT_ENCODING="gzip")
        assert ("Content-Encoding", "gzip") in zipped[1]
        filtered = call(ours, None, QUERY_STRING="name[]=driftwatch_detector_score")
        assert filtered == call(library, None, QUERY_STRING="name[]=driftwatch_detector_score")
        for method in ("OPTIONS", "POST"):
            assert call(ours, None, REQUEST_METHOD=method) == call(
                library, None, REQUEST_METHOD=method
            )


def test_both_formats_parse_to_the_collectors_samples_and_pass_promtool(promtool: str) -> None:
    current = [snapshot("a", 1, 1_700_000_100.0, 1.5), snapshot("b", 2, 1_700_000_100.0, 2.0)]
    app = metrics_app(lambda: current)
    text = call(app, "text/plain;version=0.0.4")[2].decode()
    openmetrics = call(app, PROMETHEUS_3)[2].decode()
    assert openmetrics.endswith("# EOF\n")
    collected = list(DriftwatchCollector(lambda: current).collect())
    expected = sorted((s.name, sorted(s.labels.items())) for f in collected for s in f.samples)
    for families in (text_string_to_metric_families(text), openmetrics_families(openmetrics)):
        parsed = sorted((s.name, sorted(s.labels.items())) for f in families for s in f.samples)
        assert parsed == expected
    # promtool (2.42) reads the Prometheus text format only; the OpenMetrics parser is strict.
    result = promtool_check_metrics(promtool, text)
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.strip() == "", result.stdout


class _Others(Collector):
    """Families the renderer leaves to the library: a histogram, a counter's created time."""

    def collect(self) -> Iterator[Metric]:
        yield GaugeMetricFamily("plain", "A gauge.", value=1.0)
        counter = CounterMetricFamily("jobs", "Jobs done.", labels=["queue"])
        counter.add_metric(["a"], 3.0, created=1_700_000_000.0)
        yield counter
        yield HistogramMetricFamily("lat", "Latency.", buckets=[("1.0", 2.0), ("+Inf", 3.0)])


@pytest.mark.parametrize("accept", [None, PROMETHEUS_3])
def test_families_it_does_not_render_go_to_the_library(accept: str | None) -> None:
    registry = registry_of(_Others())
    assert call(metrics_wsgi_app(registry), accept) == call(make_wsgi_app(registry), accept)


def test_a_family_reads_as_the_library_family_of_the_same_samples() -> None:
    ours = Family("driftwatch_x_total", "X.", "counter", ["run", "gpu"])
    theirs = CounterMetricFamily("driftwatch_x_total", "X.", labels=["run", "gpu"])
    for values, value in [(("a", "0"), 1.0), (("b", "1"), 2.5)]:
        ours.add_metric(values, value)
        theirs.add_metric(list(values), value)
    assert ours == theirs
    assert Renderer().render([ours], False) == Renderer().render([theirs], False)
    with pytest.raises(ValueError, match="a gauge or a counter"):
        Family("driftwatch_x", "X.", "histogram", [])
