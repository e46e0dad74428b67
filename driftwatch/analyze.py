"""``driftwatch analyze``: the live detectors, offline, on a logdir or a recorded samples file.

A samples file has one JSON object per line: ``{"t": <unix seconds>, "series": <name>,
"value": <number>}`` with an optional ``"labels": {...}``, series named as in ``SERIES``
(see the README), in time order.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Iterator
from dataclasses import replace
from pathlib import Path

from driftwatch.detect.catalog import default_engine
from driftwatch.errors import DriftwatchError
from driftwatch.findings import Finding
from driftwatch.series import SERIES, Sample
from driftwatch.sources.eventfiles import replay_logdir

EVALUATE_EVERY_SECONDS = 10.0
"""How often, in the recording's time, the detectors are asked what holds (as live)."""


class RecordingError(DriftwatchError):
    """A samples file that cannot be analysed; the message names the line."""


def read_samples(path: Path) -> Iterator[Sample]:
    """The samples of a recording, checked line by line."""
    last_t = -math.inf
    try:
        lines = path.open(encoding="utf-8")
    except OSError as err:
        raise RecordingError(f"{path}: cannot read: {err.strerror}") from err
    with lines:
        for number, line in enumerate(lines, 1):
            if not line.strip():
                continue
            where = f"{path}:{number}"
            try:
                record = json.loads(line)
                t, series, value = record["t"], record["series"], record["value"]
                labels = record.get("labels", {})
            except (ValueError, KeyError, TypeError) as err:
                raise RecordingError(
                    f'{where}: expected {{"t": seconds, "series": name, "value": number}}'
                ) from err
            if not isinstance(t, int | float) or not isinstance(value, int | float | None):
                raise RecordingError(f"{where}: t and value must be numbers")
            if series not in SERIES:
                raise RecordingError(f"{where}: unknown series {series!r} (see the README)")
            if not isinstance(labels, dict):
                raise RecordingError(f"{where}: labels must be an object")
            if t < last_t:
                raise RecordingError(f"{where}: time goes backwards ({t} after {last_t})")
            last_t = t
            number_value = math.nan if value is None else float(value)
            label_items = tuple(sorted((str(k), str(v)) for k, v in labels.items()))
            yield Sample(series, number_value, float(t), label_items)


def detect(samples: Iterable[Sample], every: float = EVALUATE_EVERY_SECONDS) -> list[Finding]:
    """Run the default detectors over ``samples`` (in time order), as live every ``every``
    seconds of their time; each kind's latest finding, with when it was first reported."""
    engine = default_engine()
    first_reported: dict[str, float] = {}
    latest: dict[str, Finding] = {}
    next_evaluation = math.nan
    t = math.nan

    def evaluate(now: float) -> None:
        for finding in engine.evaluate(now):
            first_reported.setdefault(finding.kind, now)
            latest[finding.kind] = finding

    for sample in samples:
        t = sample.t
        if math.isnan(next_evaluation):
            next_evaluation = t + every
        while t >= next_evaluation:
            evaluate(next_evaluation)
            next_evaluation += every
        engine.observe(sample)
    if math.isfinite(t):
        evaluate(t)
    return [
        replace(f, evidence={**f.evidence, "first_reported": first_reported[kind]})
        for kind, f in sorted(latest.items(), key=lambda item: first_reported[item[0]])
    ]


def analyze(path: Path) -> list[Finding]:
    """Findings for a TensorBoard logdir or a samples file."""
    if path.is_dir():
        samples = list(replay_logdir(path))
        if not samples:
            raise RecordingError(f"{path}: no TensorBoard event files with data in it")
        samples.sort(key=lambda s: s.t)
        return detect(samples)
    if not path.exists():
        raise RecordingError(f"{path}: no such file or directory")
    return detect(read_samples(path))
