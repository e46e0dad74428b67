"""Detectors that need no statistics: non-finite values and stalled training."""

from __future__ import annotations

import itertools
import math
import statistics
from collections import deque

from driftwatch.detect import Evaluation
from driftwatch.findings import KINDS, Finding, Severity
from driftwatch.series import Sample
from driftwatch.units import clock


class NonFiniteDetector:
    """Any NaN or infinity in the logged scalars or the hook's checks.

    In the loss or the weights (or where nothing says what held it): a diverged run,
    ``KINDS["nonfinite"]``'s severity. In metrics only: the metric's own computation (a 0/0
    or log(0) in it) while training stays finite, a warning (docs/nonfinite.md).
    """

    name = "nonfinite"
    series = frozenset({"nonfinite_total", "hook_nonfinite_total", "nonfinite_by_name_total"})

    def __init__(self) -> None:
        self._counts: dict[str, float] = {}
        self._by_name: dict[tuple[str, str], int] = {}  # (name, role) -> non-finite values
        self._first_seen: float | None = None

    def observe(self, sample: Sample) -> None:
        if not (math.isfinite(sample.value) and sample.value > 0):
            return
        if sample.series == "nonfinite_by_name_total":
            labels = dict(sample.labels)
            self._by_name[(labels.get("name", "?"), labels.get("role", "?"))] = int(sample.value)
            return
        self._counts[sample.series] = sample.value
        if self._first_seen is None or sample.t < self._first_seen:
            self._first_seen = sample.t

    def evaluate(self, now: float) -> Evaluation:
        if self._first_seen is None:
            return Evaluation(0.0)
        count = int(max(self._counts.values()))
        where = " and ".join(
            {"nonfinite_total": "event files", "hook_nonfinite_total": "the hook"}[s]
            for s in sorted(self._counts)
        )
        ranked = sorted(self._by_name.items(), key=lambda item: (-item[1], item[0]))
        names = ", ".join(f"{name} ({n})" for (name, _role), n in ranked[:MAX_NAMES_SAID])
        if len(ranked) > MAX_NAMES_SAID:
            names += f" and {len(ranked) - MAX_NAMES_SAID} more"
        metric_only = bool(ranked) and all(role == "metric" for (_name, role), _n in ranked)
        severity = Severity.WARNING if metric_only else KINDS["nonfinite"].severity
        seen = f"{count} non-finite (NaN/Inf) value(s) seen by {where} since "
        seen += clock(self._first_seen)
        if metric_only:
            message = (
                f"{seen}, only in metrics: {names}. The loss stays finite, so training "
                "itself is not diverging: the metric's own computation yields NaN/Inf (a 0/0, "
                "e.g. a batch with no positives, or a log(0) in it). Anything that monitors it "
                "(EarlyStopping, ModelCheckpoint) is misled: accumulate its counts over the "
                "epoch (keras.metrics.Recall and friends) or guard the division."
            )
        else:
            inside = f" in {names}" if names else ""
            message = (
                f"{seen}{inside}: training has likely diverged. Try a lower learning rate, "
                "gradient clipping, or guard the loss against log(0) and division by zero."
            )
        evidence: dict[str, float | str] = {"nonfinite_values": count}
        if ranked:  # the roles and names as text (a new one is news), each name's count
            evidence["nonfinite_in"] = ", ".join(sorted({role for _name, role in self._by_name}))
            evidence["nonfinite_names"] = ", ".join(sorted(name for name, _role in self._by_name))
            evidence.update({f"nonfinite_values[{name}]": n for (name, _role), n in ranked})
        finding = Finding(
            kind="nonfinite",
            severity=severity,
            since=self._first_seen,
            message=message,
            evidence=evidence,
        )
        return Evaluation(1.0, (finding,))


MAX_NAMES_SAID = 5
"""Names of non-finite values a finding's message lists (its evidence has them all)."""


VALIDATION_ALLOWANCE = 2.0
"""Times the longest of the last 8 validations that a pause may last and be one more."""
STOPPED_SECONDS = 10.0
"""Seconds a process stays stopped, with no step since, from which it is stalled."""


class StallDetector:
    """No new training step for much longer than steps usually take to be logged; or the
    process stopped (SIGSTOP, a tracer) for ``STOPPED_SECONDS``: it runs nothing, so no
    step can come however long steps usually take."""

    name = "stalled"
    series = frozenset({"step_timestamp", "validation_seconds", "process_stopped"})

    def __init__(self, min_seconds: float = 120.0, factor: float = 10.0, window: int = 64):
        self.min_seconds = min_seconds
        self.factor = factor
        self._stamps: deque[float] = deque(maxlen=window)
        self._validations: deque[float] = deque(maxlen=8)
        self._typical: float | None = None  # the median gap of ``_stamps``, until one comes
        self._stopped_since = math.nan  # when the process was first seen stopped, this time

    def observe(self, sample: Sample) -> None:
        if not math.isfinite(sample.value):
            return
        if sample.series == "validation_seconds":
            self._validations.append(sample.value)
        elif sample.series == "process_stopped":
            if not sample.value:
                self._stopped_since = math.nan
            elif math.isnan(self._stopped_since):
                self._stopped_since = sample.t
        elif not self._stamps or sample.value > self._stamps[-1]:
            self._stamps.append(sample.value)
            self._typical = None

    def evaluate(self, now: float) -> Evaluation:
        if not self._stamps:
            return Evaluation(0.0)
        typical = self._typical
        if typical is None:  # computed again only once a step came
            gaps = [b - a for a, b in itertools.pairwise(self._stamps)]
            typical = self._typical = statistics.median(gaps) if gaps else 0.0
        # Validation pauses training for as long as it takes: that is no stall.
        validation = VALIDATION_ALLOWANCE * max(self._validations, default=0.0)
        limit = max(self.min_seconds, self.factor * typical, validation)
        last = self._stamps[-1]
        silent_for = now - last
        stopped = self._stopped_since
        stopped_for = math.nan if math.isnan(stopped) else now - max(stopped, last)
        score = max(0.0, silent_for / limit)
        if math.isfinite(stopped_for):
            score = max(score, stopped_for / STOPPED_SECONDS)
        if silent_for <= limit and not stopped_for >= STOPPED_SECONDS:
            return Evaluation(score)
        evidence = {"seconds_since_last_step": silent_for, "usual_log_interval": typical}
        if math.isfinite(stopped_for):
            evidence["stopped_seconds"] = stopped_for
            why = (
                f"The process has been stopped for {stopped_for:.0f} s (SIGSTOP, SIGTSTP or a "
                "tracer): it runs nothing (in a multi-worker job the other ranks wait for it "
                "at their collectives). Resume it (kill -CONT PID) or find what stopped it."
            )
        else:
            why = (
                "The job may be hung (input pipeline, deadlock, a collective waiting for "
                "another rank) or stuck in a long checkpoint or validation: look at its "
                "stacks with py-spy dump."
            )
        finding = Finding(
            kind="stalled",
            severity=KINDS["stalled"].severity,
            since=last,
            message=(
                f"no training step for {silent_for:.0f} s (since {clock(last)}; steps are "
                f"usually logged every {typical:.1f} s). {why}"
            ),
            evidence=evidence,
        )
        return Evaluation(score, (finding,))
