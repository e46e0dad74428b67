"""``driftwatch analyze``: the live detectors, offline, on a logdir or a recorded samples file.

A samples file has one JSON object per line: ``{"t": <unix seconds>, "series": <name>,
"value": <number>}`` with an optional ``"labels": {...}``, series named as in ``SERIES``
(see the README), in time order.
"""

from __future__ import annotations

import itertools
import json
import math
from collections.abc import Iterable, Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

from driftwatch.detect.catalog import default_engine
from driftwatch.errors import DriftwatchError
from driftwatch.findings import Finding
from driftwatch.series import SERIES, Sample
from driftwatch.sources.eventfiles import replay_logdir

EVALUATE_EVERY_SECONDS = 30.0
"""How often, in the recording's time, the detectors are asked what holds: as a live
monitor would, a little less often (findings' onsets are estimated, not tick-bound)."""


class RecordingError(DriftwatchError):
    """A samples file that cannot be analysed; the message names the line."""


EXPECTED = 'expected {"t": seconds, "series": name, "value": number}'

BATCH_LINES = 4096
"""Lines parsed by one ``json.loads`` call: per-line calls cost more than the parsing."""


def _parse(path: Path, lines: list[str], first: int) -> Iterable[tuple[int, Any]]:
    """``(line number, decoded JSON)`` of the non-blank ``lines``, numbered from ``first``.

    One ``json.loads`` of them all as an array; should that fail (a blank or malformed
    line), or the array not hold one value per line (lines that are not JSON values on their
    own), they are decoded one by one, blank lines skipped, so that the error names the line.
    """
    try:
        values = json.loads("[" + ",".join(lines) + "]")
    except ValueError:
        values = None
    if isinstance(values, list) and len(values) == len(lines):
        return enumerate(values, first)
    decoded: list[tuple[int, Any]] = []
    for number, line in enumerate(lines, first):
        if not line.strip():
            continue
        try:
            decoded.append((number, json.loads(line)))
        except ValueError as err:
            raise RecordingError(f"{path}:{number}: {EXPECTED}") from err
    return decoded


def read_samples(path: Path) -> Iterator[Sample]:
    """The samples of a recording, checked line by line (a hot loop: kept lean)."""
    try:
        lines = path.open(encoding="utf-8")
    except OSError as err:
        raise RecordingError(f"{path}: cannot read: {err.strerror}") from err
    known = SERIES.keys()
    numbers = (int, float)
    last_t = -math.inf
    first = 1
    with lines:
        while batch := list(itertools.islice(lines, BATCH_LINES)):
            for number, record in _parse(path, batch, first):
                try:
                    t = record["t"]
                    series = record["series"]
                    value = record["value"]
                except (KeyError, TypeError) as err:
                    raise RecordingError(f"{path}:{number}: {EXPECTED}") from err
                if type(t) not in numbers or (value is not None and type(value) not in numbers):
                    raise RecordingError(f"{path}:{number}: t and value must be numbers")
                if series not in known:
                    raise RecordingError(
                        f"{path}:{number}: unknown series {series!r} (see the README)"
                    )
                if t < last_t:
                    raise RecordingError(
                        f"{path}:{number}: time goes backwards ({t} after {last_t})"
                    )
                last_t = t
                labels = record.get("labels")
                if labels is None:
                    yield Sample(series, math.nan if value is None else value, t)
                elif isinstance(labels, dict):
                    items = tuple(sorted((str(k), str(v)) for k, v in labels.items()))
                    yield Sample(series, math.nan if value is None else value, t, items)
                else:
                    raise RecordingError(f"{path}:{number}: labels must be an object")
            first += len(batch)


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
