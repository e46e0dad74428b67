"""The series driftwatch knows: one table drives sampling, storage, export and the samples file.

A ``Sample`` names its series by the table's key (``rss_bytes``, ``step_seconds``, ...), the
same names a recorded samples file and ``driftwatch analyze`` use. The exporter derives every
Prometheus metric from this table; adding a signal means adding a row to its source's table
(``process``, ``job``, ``host``, ``gpu``, ``training``; ``goodput``: the monitor's own
accounting) and a source that emits it. ``WATCHED`` lists the signals a person looks at:
the live view's rows, the summary at the end of monitoring and the panels of ``driftwatch
report``.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import NamedTuple

from driftwatch.series.goodput import GOODPUT
from driftwatch.series.gpu import GPU
from driftwatch.series.host import HOST
from driftwatch.series.job import JOB
from driftwatch.series.process import PROCESS
from driftwatch.series.spec import (
    MAX_LABEL_SETS,
    MAX_LABEL_VALUE_CHARS,
    RUNTIME_LABELS,
    Export,
    Labels,
    MetricType,
    Scope,
    SeriesSpec,
)
from driftwatch.series.training import TRAINING

__all__ = [
    "MAX_LABEL_SETS",
    "MAX_LABEL_VALUE_CHARS",
    "RUNTIME_LABELS",
    "SERIES",
    "WATCHED",
    "Export",
    "LabelSetLimit",
    "Labels",
    "MetricType",
    "Sample",
    "Scope",
    "SeriesKey",
    "SeriesSpec",
    "Watched",
    "checked_labels",
    "key_of",
]

log = logging.getLogger(__name__)

SERIES: dict[str, SeriesSpec] = {**PROCESS, **JOB, **HOST, **GPU, **TRAINING, **GOODPUT}
"""Every series, by the key samples name it with: the sources' tables in one."""


@dataclass(frozen=True, slots=True)
class Watched:
    """A signal a person looks at, and what each place that shows it calls it (``None``: not
    shown there). Braces name the series' labels: ``GPU {gpu} memory``."""

    view: str | None = None  # its rows in the live view and the plain progress line
    summary: str | None = None  # its line in the summary printed when monitoring ends
    panel: str | None = None  # the title of its panels in ``driftwatch report``
    panel_rank: int = 0  # where its panels come among the report's, first to last
    also: tuple[str, ...] = ()  # the other series its readings use (limits, totals, peaks)


WATCHED: dict[str, Watched] = {
    "rss_bytes": Watched(
        view="RSS",
        summary="RSS",
        panel="Memory: RSS",
        panel_rank=1,
        also=("memory_limit_bytes",),
    ),
    "cpu_seconds": Watched(view="CPU"),
    "threads": Watched(
        view="threads",
        summary="threads",
        panel="Threads",
        panel_rank=7,
        also=("threads_limit",),
    ),
    "open_fds": Watched(
        view="open descriptors",
        summary="open descriptors",
        panel="Open descriptors",
        panel_rank=6,
        also=("fd_limit",),
    ),
    "workers_memory_bytes": Watched(
        view="workers",
        summary="workers",
        panel="Memory: worker processes",
        panel_rank=8,
        also=("job_processes", "largest_worker_memory_bytes", "workers_memory_limit_bytes"),
    ),
    "gpu_process_memory_bytes": Watched(
        view="GPU {gpu} memory",
        panel="Memory: GPU {gpu}",
        panel_rank=3,
        also=("gpu_memory_total_bytes",),
    ),
    "event_file_bytes": Watched(
        view="event files",
        summary="event files",
        panel="Event files",
        panel_rank=4,
        also=("event_files", "event_file_largest_bytes"),
    ),
    "step_seconds": Watched(
        view="step", summary="steps", panel="Step time", panel_rank=0, also=("train_step",)
    ),
    "step_gap_seconds": Watched(view="outside the step", also=("step_seconds",)),
    "input_wait_share": Watched(view="waiting for input"),
    "collective_wait_share": Watched(view="waiting for other ranks"),
    "tf_allocator_current_bytes": Watched(
        view="TF memory {device}",
        panel="Memory: TF {device}",
        panel_rank=2,
        also=("tf_allocator_peak_bytes",),
    ),
    "tracing_count": Watched(view="tf.function", also=("retracing_warnings_total",)),
    "nonfinite_total": Watched(view="non-finite values", also=("hook_nonfinite_total",)),
    "nondisk_write_bytes": Watched(panel="Uploads and other non-disk writes", panel_rank=5),
    "wall_seconds": Watched(view="goodput", summary="goodput", also=("goodput_ratio",)),
}
"""The signals a person looks at, keyed by the series each is about, in the live view's order."""


class Sample(NamedTuple):
    """One observation of one series at a wall-clock time (unix seconds): a named tuple,
    immutable and four times cheaper to build than a frozen dataclass (sources build 20 or
    more a tick, a replay hundreds of thousands)."""

    series: str
    value: float
    t: float
    labels: Labels = ()


SeriesKey = tuple[str, Labels]


def key_of(sample: Sample) -> SeriesKey:
    return (sample.series, sample.labels)


def checked_labels(series: str, labels: Mapping[object, object]) -> Labels | None:
    """The labels of a ``series`` named by outside input, in table form; None when the table
    has no such series or it takes other label names. Values are cut to a bounded length."""
    spec = SERIES.get(series)
    if spec is None or sorted(map(str, labels)) != sorted(spec.label_names):
        return None
    return tuple(sorted((str(k), str(v)[:MAX_LABEL_VALUE_CHARS]) for k, v in labels.items()))


class LabelSetLimit:
    """Admits at most ``limit`` label sets per series, the first ones seen.

    Bounds the memory of the store and the detectors and the exported cardinality, whatever
    a source sends; each series that reaches the limit is logged once.
    """

    def __init__(self, limit: int = MAX_LABEL_SETS) -> None:
        self._limit = limit
        self._seen: dict[str, set[Labels]] = {}
        self._full: set[str] = set()

    def admit(self, samples: Iterable[Sample]) -> list[Sample]:
        admitted = []
        for sample in samples:
            seen = self._seen.setdefault(sample.series, set())
            if sample.labels not in seen:
                if len(seen) >= self._limit:
                    if sample.series not in self._full:
                        self._full.add(sample.series)
                        log.warning(
                            "%s has %d label sets already; samples with new labels are dropped",
                            sample.series,
                            self._limit,
                        )
                    continue
                seen.add(sample.labels)
            admitted.append(sample)
        return admitted
