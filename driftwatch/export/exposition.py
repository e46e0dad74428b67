"""Rendering a scrape: the Prometheus text format and OpenMetrics, byte for byte as
``prometheus_client`` renders them, at a fraction of its cost.

A daemon's scrape is mostly the same samples every time with new values: the same families,
the same label sets. ``Renderer`` keeps each family's ``HELP``/``TYPE`` lines and each
sample's label text from one scrape to the next (those of the latest scrape only, so ended
runs are forgotten), and formats only the values anew. It renders what driftwatch's
collector yields: gauges, counters and info metrics with legacy metric and label names, no
timestamps, units or exemplars, in the two escapings a valid legacy name cannot tell apart
(``underscores``, Prometheus's default, and ``allow-utf-8``, Prometheus 3's). Anything else
(another escaping, another type, a ``name[]`` filter) goes to ``prometheus_client`` itself,
as does every request but a plain ``GET``: content negotiation and compression stay the
library's (``choose_encoder``, ``gzip_accepted``), so the answer's headers are its too.
"""

from __future__ import annotations

import contextlib
import gzip
import re
import threading
from collections.abc import Callable, Iterable, Iterator
from typing import Any, cast
from urllib.parse import parse_qs

from prometheus_client import CollectorRegistry
from prometheus_client.exposition import choose_encoder, gzip_accepted, make_wsgi_app
from prometheus_client.metrics_core import Metric
from prometheus_client.openmetrics import exposition as openmetrics
from prometheus_client.registry import Collector
from prometheus_client.samples import Sample
from prometheus_client.utils import floatToGoString

OPENMETRICS_TYPE = "application/openmetrics-text"
"""The media type ``choose_encoder`` answers for OpenMetrics."""
ESCAPINGS = frozenset({openmetrics.UNDERSCORES, openmetrics.ALLOWUTF8})
"""Escapings that leave a legacy metric or label name as it is."""
_LEGACY_NAME = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*")
"""A name that every escaping we render leaves as it is (no ``:``: OpenMetrics' sample
names under ``underscores`` turn it into ``_``)."""
_go_float = cast("Callable[[float], str]", floatToGoString)
"""A value as both formats write it (Go's formatting of a float)."""
_TEXT_TYPES = {"counter": "counter", "gauge": "gauge", "info": "gauge"}
"""The types we render, and what the Prometheus text format calls each."""
_TEXT_SUFFIXES = {"counter": "_total", "gauge": "", "info": "_info"}
"""What the Prometheus text format appends to each type's family name."""


class Family(Metric):
    """A gauge or counter family kept as rows (label values, value), in the order of
    ``label_names``: what ``GaugeMetricFamily`` and ``CounterMetricFamily`` hold, without a
    ``Sample`` and a label dict per value unless someone reads ``samples``."""

    def __init__(self, name: str, documentation: str, kind: str, label_names: Iterable[str]):
        if kind not in ("gauge", "counter"):
            raise ValueError(f"Family {name}: a gauge or a counter, not {kind}")
        if kind == "counter" and name.endswith("_total"):  # as CounterMetricFamily does
            name = name[: -len("_total")]
        self.rows: list[tuple[tuple[str, ...], float]] = []
        super().__init__(name, documentation, kind)
        self.label_names = tuple(label_names)

    def add_metric(self, label_values: tuple[str, ...], value: float) -> None:
        """One sample: its label values, in the order of ``label_names``."""
        self.rows.append((label_values, value))

    @property
    def samples(self) -> list[Sample]:
        """The rows as ``prometheus_client`` samples (built anew at each read)."""
        name = self.name + _TEXT_SUFFIXES[self.type]
        names = self.label_names
        rows = self.rows
        return [Sample(name, dict(zip(names, v, strict=True)), value) for v, value in rows]

    @samples.setter
    def samples(self, samples: list[Sample]) -> None:
        """``Metric.__init__`` sets an empty list: the rows are the samples."""
        if samples:
            raise ValueError("add samples to a Family with add_metric")


class Unrenderable(Exception):
    """A family or sample outside what ``Renderer`` renders (the library renders it)."""


class _Collected(Collector):
    """Families already collected, for ``prometheus_client``'s encoders."""

    def __init__(self, families: list[Metric]) -> None:
        self._families = families

    def collect(self) -> Iterator[Metric]:
        return iter(self._families)


def _label_value(value: str) -> str:
    """A label value escaped as both formats do (``allow-utf-8`` escaping)."""
    return value.replace("\\", r"\\").replace("\n", r"\n").replace('"', r"\"")


class Renderer:
    """Renders families as the Prometheus text format or OpenMetrics; keeps what repeats
    between scrapes (thread-safe: one scrape renders at a time)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._headers: dict[tuple[str, str, str, bool], tuple[str, str]] = {}
        self._labels: dict[tuple[str, tuple[Any, ...]], str] = {}

    def render(self, families: Iterable[Metric], openmetrics_format: bool) -> bytes:
        """The exposition of ``families``; ``Unrenderable`` for what only the library does."""
        with self._lock:
            kept = self._labels
            fresh: dict[tuple[str, tuple[Any, ...]], str] = {}
            output: list[str] = []
            append = output.append
            for family in families:
                header, name_suffix = self._header(family, openmetrics_format)
                append(header)
                if isinstance(family, Family):
                    sample_name = family.name + name_suffix
                    label_names = family.label_names
                    for values, number in family.rows:
                        row_key = (sample_name, values)
                        text = kept.get(row_key)
                        if text is None:
                            labels = dict(zip(label_names, values, strict=True))
                            text = _sample_prefix(sample_name, labels)
                        fresh[row_key] = text
                        append(text)
                        append(_go_float(number))
                        append("\n")
                    continue
                for sample in family.samples:
                    name, labels, value = sample.name, sample.labels, sample.value
                    if (
                        sample.timestamp is not None
                        or sample.exemplar is not None
                        or sample.native_histogram is not None
                        or value is None
                        or name != family.name + name_suffix
                    ):
                        raise Unrenderable(f"sample {name} of {family.name}")
                    key = (name, tuple(labels.items()))
                    text = kept.get(key)
                    if text is None:
                        text = _sample_prefix(name, labels)
                    fresh[key] = text
                    append(text)
                    append(_go_float(value))
                    append("\n")
            if openmetrics_format:
                append("# EOF\n")
            self._labels = fresh
            return "".join(output).encode("utf-8")

    def _header(self, family: Metric, openmetrics_format: bool) -> tuple[str, str]:
        """The family's ``HELP`` and ``TYPE`` lines, and its samples' suffix to its name."""
        key = (family.name, family.type, family.documentation, openmetrics_format)
        known = self._headers.get(key)
        if known is not None and not family.unit:
            return known
        name, kind, help_text = family.name, family.type, family.documentation
        if kind not in _TEXT_TYPES or family.unit or not _LEGACY_NAME.fullmatch(name):
            raise Unrenderable(f"family {name} ({kind})")
        suffix = _TEXT_SUFFIXES[kind]
        if openmetrics_format:
            escaped = _label_value(help_text)
            header = f"# HELP {name} {escaped}\n# TYPE {name} {kind}\n"
        else:
            escaped = help_text.replace("\\", r"\\").replace("\n", r"\n")
            shown = name + suffix
            header = f"# HELP {shown} {escaped}\n# TYPE {shown} {_TEXT_TYPES[kind]}\n"
        known = self._headers[key] = (header, suffix)
        return known


def _sample_prefix(name: str, labels: dict[str, str]) -> str:
    """A sample's line up to its value: the name and the labels, sorted by name."""
    if not labels:
        return f"{name} "
    if not all(_LEGACY_NAME.fullmatch(label) for label in labels):
        raise Unrenderable(f"a label name of {name}")
    pairs = ",".join(f'{k}="{_label_value(v)}"' for k, v in sorted(labels.items()))
    return f"{name}{{{pairs}}} "


def metrics_wsgi_app(registry: CollectorRegistry) -> Callable[..., Any]:
    """A WSGI app serving ``registry``'s exposition as ``prometheus_client``'s
    ``make_wsgi_app`` does, rendered by a ``Renderer`` where it can."""
    renderer = Renderer()
    library = make_wsgi_app(registry)

    def app(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        query = parse_qs(environ.get("QUERY_STRING", ""))
        if environ.get("REQUEST_METHOD") != "GET" or "name[]" in query:
            return cast("Iterable[bytes]", library(environ, start_response))
        encoder, content_type = choose_encoder(environ.get("HTTP_ACCEPT", ""))
        families = list(registry.collect())
        output = None
        if _escaping(content_type) in ESCAPINGS:
            with contextlib.suppress(Unrenderable):  # the library renders it below
                output = renderer.render(families, content_type.startswith(OPENMETRICS_TYPE))
        if output is None:
            output = encoder(_Collected(families))
        headers = [("Content-Type", content_type)]
        if gzip_accepted(environ.get("HTTP_ACCEPT_ENCODING", "")):
            output = gzip.compress(output)
            headers.append(("Content-Encoding", "gzip"))
        start_response("200 OK", headers)
        return [output]

    return app


def _escaping(content_type: str) -> str:
    """The escaping ``choose_encoder`` picked, from the content type it answered."""
    for part in content_type.split(";"):
        key, _, value = part.strip().partition("=")
        if key == "escaping":
            return value
    return openmetrics.UNDERSCORES
