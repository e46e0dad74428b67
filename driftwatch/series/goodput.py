"""Goodput: where the run's wall time went, by phase, settled from its step records
(driftwatch/detect/goodput.py; docs/goodput.md)."""

from __future__ import annotations

from driftwatch.series.spec import MetricType, SeriesSpec

GOODPUT: dict[str, SeriesSpec] = {
    "wall_seconds": SeriesSpec(
        "driftwatch_wall_seconds_total",
        "Wall time of the run watched, by phase: productive (in train steps), input_wait "
        "(waiting for the input pipeline, where the hook measures it), startup (until the "
        "first step), periodic_stall (checkpoints, validation, other pauses), stalled (no "
        "step for longer than the stall limit), host_overhead (between steps: callbacks, "
        "host work, input wait not measured). Counted as steps settle it.",
        MetricType.COUNTER,
        label_names=("phase",),
    ),
    "goodput_ratio": SeriesSpec(
        "driftwatch_goodput_ratio",
        "Share of the wall time accounted for that went to productive train steps.",
    ),
}
