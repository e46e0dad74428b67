"""What a row of the series table says: its metric, type, scope, export and labels."""

from __future__ import annotations

import enum
from dataclasses import dataclass

Labels = tuple[tuple[str, str], ...]
"""Extra identity of a series beyond the run, e.g. ``(("gpu", "0"),)``; sorted by name."""

MAX_LABEL_SETS = 32
"""Label sets one series may have in a run (GPUs, TF devices): more are dropped."""
MAX_LABEL_VALUE_CHARS = 128
"""Label values from outside input (the hook's metadata) are cut to this length."""


RUNTIME_LABELS = ("keras", "python", "tensorflow")
"""The versions ``runtime_info`` carries, as label names (sorted, like every ``Labels``)."""


class MetricType(enum.Enum):
    GAUGE = "gauge"
    COUNTER = "counter"


class Scope(enum.Enum):
    """Whether a series belongs to the watched run or to the node (e.g. a whole GPU)."""

    RUN = "run"
    NODE = "node"


class Export(enum.Enum):
    """Which value of a series the exporter shows."""

    LAST = "last"
    RECENT_MEDIAN = "recent_median"  # noisy per-event values: the median of the recent window


@dataclass(frozen=True, slots=True)
class SeriesSpec:
    metric: str
    help: str
    kind: MetricType = MetricType.GAUGE
    scope: Scope = Scope.RUN
    export: Export = Export.LAST
    label_names: tuple[str, ...] = ()
