"""Drift of a resource a job can run out of: slope, significance and time to the limit, per
signal, at several scales. One detector class judges every row of ``RESOURCES`` (memory in
bytes; open descriptors and threads as counts, docs/resources.md); memory's rows are below.

Each signal (host RSS, TensorFlow's allocator, GPU process memory) is averaged into
consecutive windows at several widths (1.5 s to 10 min) and the newest ``points`` means of
each are tested: Theil-Sen slope and Mann-Kendall trend (corrected for lag-1
autocorrelation), within the segment after the last level jump, so a one-off allocation is
a "memory step", not a leak. Short scales see fast growth within seconds (rapid growth on
their newest few windows), long ones a slow leak over hours. Start-up (imports, model
building, tracing) is never judged: it ends when the process stopped loading (``Loading``),
else on the signal's own shape (``StartUp``) or after ``STARTUP_MAX_SECONDS``, or at the
first training step, so no step signal is needed; right after it, growth is also judged
read by read and on windows counted from its end (``fresh_rises``). Warm-up
is excluded, and a trend counts as a leak only once it has held for ``min_span`` seconds (a
GC or caching cycle rises for minutes, then falls), except growth that would exhaust the
limit within ``fast_horizon`` seconds: that is reported whenever it is seen. At a run's end
(``conclude``), growth no live window could judge yet is stated over the whole run.

The windows are in ``driftwatch.detect.windows``, start-up in ``startup``, one scale's
trends and jumps in ``memory_trends``, RSS's leak class in ``host_memory``. Reasoning:
docs/memory.md.
"""

from __future__ import annotations

import math
import statistics
from collections import deque
from dataclasses import dataclass, field

from driftwatch.detect import Evaluation
from driftwatch.detect.memory.resources import RESOURCES, Resource
from driftwatch.detect.memory.startup import (
    LOADING_SERIES,
    STARTUP_MAX_LOADING_SECONDS,
    STARTUP_MAX_SECONDS,
    Loading,
    StartUp,
)
from driftwatch.detect.memory.trends import (
    MIN_READINGS,
    RAPID_MAX_WIDTH,
    READINGS_KEPT,
    Jump,
    MemoryThresholds,
    Trend,
    TrendAnalysis,
    analyse_scale,
    fresh_rises,
)
from driftwatch.detect.memory.whole_run import CONCLUDE_MIN_POINTS, whole_run_trend
from driftwatch.detect.windows import WindowMeans
from driftwatch.findings import JUDGED_AT_END, KINDS, WHOLE_RUN, Finding, Severity
from driftwatch.series import Labels, Sample
from driftwatch.units import clock, human_seconds


@dataclass
class _Signal:
    """State of one signal and label set."""

    scales: list[WindowMeans]
    first_t: float = math.nan
    startup: StartUp = field(default_factory=StartUp)
    readings: deque[tuple[float, float]] = field(
        default_factory=lambda: deque(maxlen=READINGS_KEPT)
    )
    analysed: dict[float, tuple[tuple[int, float, float, bool], TrendAnalysis]] = field(
        default_factory=dict
    )


class ResourceDriftDetector:
    """Drift of one resource's signal (a row of ``RESOURCES``: memory, open descriptors,
    threads), reported as its kind with projected time to its limit."""

    def __init__(self, resource: Resource, thresholds: MemoryThresholds | None = None) -> None:
        self.resource = resource
        self.name = resource.kind
        self.what = resource.what
        self.signal = resource.signal
        wanted = {resource.signal, "epoch_seconds", "train_step"}
        if resource.limit_series is not None:
            wanted.add(resource.limit_series)
        self.series = frozenset(wanted)
        self.limit_series = resource.limit_series
        self.thresholds = resource.thresholds if thresholds is None else thresholds
        self._signals: dict[Labels, _Signal] = {}
        self._limits: dict[Labels, float] = {}
        self._epochs = 0
        self._epochs_done_at = math.nan  # when ``warmup_epochs`` epochs had ended
        self._first_step_at = math.inf  # when the first training step was seen
        # The mean training step of each scale's windows: whole-run growth may keep its
        # pace per step where its steps slowed.
        self._steps = [WindowMeans(w, self.thresholds.points) for w in self.thresholds.scales]
        self._loading = Loading()  # fed by subclasses that watch the process's loading

    # -- input -------------------------------------------------------------------------

    def observe(self, sample: Sample) -> None:
        if sample.series == "train_step":
            self._first_step_at = min(self._first_step_at, sample.t)
            for steps in self._steps:
                steps.add(sample.t, sample.value)
        elif sample.series in LOADING_SERIES:
            self._loading.reading(sample.series, sample.t, sample.value)
        elif sample.series == "epoch_seconds":
            self._epochs += 1
            if self._epochs == self.thresholds.warmup_epochs:
                self._epochs_done_at = sample.t
        elif sample.series == self.signal:
            self._reading(sample)
        elif (
            sample.series == self.limit_series and math.isfinite(sample.value) and sample.value > 0
        ):
            self._limits[sample.labels] = sample.value

    def _reading(self, sample: Sample) -> None:
        """A reading of the signal: into its windows at every scale."""
        self._loading.level(sample.value)
        state = self._signals.get(sample.labels)
        if state is None:
            widths = [WindowMeans(w, self.thresholds.points) for w in self.thresholds.scales]
            state = self._signals[sample.labels] = _Signal(widths, first_t=sample.t)
        state.readings.append((sample.t, sample.value))
        narrowest = state.scales[0]
        closed = narrowest.version
        for scale in state.scales:
            scale.add(sample.t, sample.value)
        if narrowest.version != closed:
            state.startup.window_closed(narrowest.means[-1][0], narrowest.floors[-1])

    def limit_for(self, labels: Labels) -> float:
        """The limit of a signal: same labels, else the only (unlabelled) limit known."""
        return self._limits.get(labels, self._limits.get((), math.nan))

    # -- analysis ----------------------------------------------------------------------

    def training_start(self, state: _Signal) -> float:
        """When start-up ended, whichever comes first of: the first training step; when the
        process stopped loading (``Loading``, where its detector reads the process's loading
        series; at the latest after ``STARTUP_MAX_LOADING_SECONDS``), else by the signal's
        own shape or after ``STARTUP_MAX_SECONDS``. No step
        signal needed: many jobs give none. Growth before it is never judged live, not even
        urgent growth."""
        if self._loading.seen:
            by_process = state.first_t + STARTUP_MAX_LOADING_SECONDS
            if self._loading.ended_at < by_process:  # False while it is NaN
                by_process = self._loading.ended_at
        else:
            shape = state.startup.ended_at
            capped = state.first_t + STARTUP_MAX_SECONDS
            by_process = min(shape, capped) if math.isfinite(shape) else capped
        if math.isfinite(by_process):
            return min(self._first_step_at, by_process)
        return self._first_step_at

    def warmup_end(self, state: _Signal) -> float:
        """Warm-up lasts ``warmup_seconds`` and ``warmup_epochs`` epochs, whichever is longer."""
        by_time = state.first_t + self.thresholds.warmup_seconds
        return (
            max(by_time, self._epochs_done_at) if math.isfinite(self._epochs_done_at) else by_time
        )

    def trends(self, state: _Signal) -> TrendAnalysis:
        """Trends past warm-up, fast trends since training started and level jumps, over
        all scales."""
        merged = TrendAnalysis()
        warm_until = self.warmup_end(state)
        started = self.training_start(state)
        for scale in state.scales:
            full = scale.width <= RAPID_MAX_WIDTH and scale.open_is_full
            key = (scale.version, warm_until, started, full)
            cached = state.analysed.get(scale.width)
            if cached is None or cached[0] != key:
                analysis = analyse_scale(scale, self.thresholds, warm_until, started, full)
                cached = state.analysed[scale.width] = (key, analysis)
            merged.merge(cached[1])
        return merged

    def evaluate(self, now: float) -> Evaluation:
        findings: list[Finding] = []
        score = 0.0
        for labels, state in self._signals.items():
            analysis = self.trends(state)
            limit = self.limit_for(labels)
            finding, signal_score = self._judge(labels, analysis, limit, now, state)
            score = max(score, signal_score)
            if finding is not None:
                findings.append(finding)
            findings.extend(self._jump_findings(labels, analysis.jumps))
        return Evaluation(score, tuple(findings))

    def _judge(
        self,
        labels: Labels,
        analysis: TrendAnalysis,
        limit: float,
        now: float,
        state: _Signal,
        ended: bool = False,
    ) -> tuple[Finding | None, float]:
        # Urgent: growth that reaches the limit within the horizon, projected with the
        # slowing seen, and rising at every wider scale that could test it too (a GC
        # cycle's rising half fills a narrow window but not a wide one).
        # Rapid growth, judged on a few narrow windows in any phase after start-up, needs
        # no wider scale's word: its evenness and pace are the evidence.
        horizon = self.thresholds.fast_horizon
        rising = {t.width for t in analysis.fast}
        urgent = [
            t
            for t in analysis.fast
            if t.time_to(limit, now) < horizon
            and all(w in rising for w in analysis.fast_tested if w > t.width)
        ]
        urgent += [t for t in analysis.rapid if t.time_to(limit, now) < horizon]
        started = self.training_start(state)
        fresh = fresh_rises(state.readings, started, self.thresholds, ended=ended)
        urgent += [t for t in fresh if t.time_to(limit, now) < horizon]
        # A leak: a material trend in wide windows (10-minute means), held for
        # ``min_span``; narrower windows see the rising half of GC or caching cycles.
        worth = [
            t
            for t in analysis.settled
            if t.width >= self.thresholds.settled_min_width
            and self._materiality(t) >= 1
            and t.points * t.width >= self.thresholds.min_span
        ]
        candidates = urgent or worth
        if not candidates:
            return None, max((self._materiality(t) for t in analysis.settled), default=0.0)
        # The widest scale that sees it: the most evidence, the steadiest slope.
        trend = max(candidates, key=lambda t: t.width)
        remaining = trend.time_to(limit, now)
        # Critical when the limit comes before the run likely ends: it has run this long,
        # so assume it goes on as long again.
        expected_end = max(horizon, now - state.first_t)
        severity = Severity.CRITICAL if remaining < expected_end else Severity.WARNING
        finding = self._finding(labels, trend, limit, remaining, severity)
        return finding, 1.0 + (1.0 if severity is Severity.CRITICAL else 0.0)

    def _finding(
        self,
        labels: Labels,
        trend: Trend,
        limit: float,
        remaining: float,
        severity: Severity,
        *,
        ended: bool = False,
    ) -> Finding:
        """``remaining``: seconds until ``limit`` from the moment judged."""
        advice, extra_evidence = self.explain(trend)
        message = self._message(labels, trend, limit, remaining, ended) + ". " + advice
        unit = self.resource.amount.unit
        evidence: dict[str, float | str] = {
            f"slope_{unit}_per_hour": trend.slope * 3600,
            f"level_{unit}": trend.level,
            "p_value": trend.p,
            "window_seconds": trend.width,
            "seconds_to_limit": remaining,
        }
        if math.isfinite(limit):
            evidence[f"limit_{unit}"] = limit
        if ended:
            evidence[JUDGED_AT_END] = WHOLE_RUN
        evidence.update(extra_evidence)
        return Finding(self.name, severity, trend.since, message, evidence)

    def _message(
        self, labels: Labels, trend: Trend, limit: float, remaining: float, ended: bool
    ) -> str:
        """What grows, how fast since when, its level and when it reaches its limit."""
        where = "".join(f" {v}" for _, v in labels)
        amount = self.resource.amount
        limit_text = amount.text(limit)
        if self.resource.limit_what:
            limit_text += f" ({self.resource.limit_what})"
        if ended:
            message = (
                f"{self.what}{where} grew steadily by {amount.rate(trend.slope)} from about "
                f"{clock(trend.since)} until the run ended (to {amount.text(trend.level)}, "
                f"{trend.points} windows of {trend.width:g} s, Mann-Kendall p={trend.p:.1g})"
            )
            if math.isfinite(remaining):
                message += (
                    f"; had it gone on, it would have reached its limit of {limit_text} "
                    f"in {human_seconds(remaining)}"
                )
            return message
        message = (
            f"{self.what}{where} is growing by {amount.rate(trend.slope)} since about "
            f"{clock(trend.since)} (now {amount.text(trend.level)}, "
            f"Mann-Kendall p={trend.p:.1g})"
        )
        if math.isfinite(remaining):
            message += (
                f"; at this rate it reaches its limit of {limit_text} in {human_seconds(remaining)}"
            )
        return message

    # -- the end of a run --------------------------------------------------------------

    def conclude(self, now: float) -> Evaluation:
        """The live verdict, and for a signal without one, growth over the whole run since
        start-up that no live window could judge yet (too few windows, the window still
        open): stated when it is steady (no single jump, no levelling off) and material."""
        findings: list[Finding] = []
        score = 0.0
        for labels, state in self._signals.items():
            analysis = self.trends(state)
            limit = self.limit_for(labels)
            finding, signal_score = self._judge(labels, analysis, limit, now, state, True)
            if finding is None:
                trend = self._whole_run(state, now)
                if trend is not None:
                    # Critical when it would have reached the limit within the hour, or
                    # within as long again as the run lasted, as live.
                    expected_end = max(self.thresholds.fast_horizon, now - state.first_t)
                    remaining = trend.time_to(limit, now)
                    critical = remaining < expected_end
                    severity = Severity.CRITICAL if critical else Severity.WARNING
                    finding = self._finding(labels, trend, limit, remaining, severity, ended=True)
                    signal_score = 2.0 if critical else 1.0
            score = max(score, signal_score)
            if finding is not None:
                findings.append(finding)
            findings.extend(self._jump_findings(labels, analysis.jumps))
        return Evaluation(score, tuple(findings))

    def _whole_run(self, state: _Signal, now: float) -> Trend | None:
        """Steady, material growth since start-up (``whole_run_trend``) over every window
        kept, the open one too, at the narrowest scale whose windows reach back to it (else
        the one with the most windows since); since the first reading when the run ended
        within its start-up climb."""
        started = self.training_start(state)
        unsettled = started > now  # the climb never settled
        if unsettled:
            started = state.first_t
        best: list[tuple[float, float, float, int]] = []
        width = math.nan
        steps = self._steps[0]
        for scale, scale_steps in zip(state.scales, self._steps, strict=True):
            windows = scale.windows(with_open=True)
            since = [w for w in windows if w[0] >= started]
            # The first and the open window may hold part of theirs: judge the others.
            inner = windows[1:-1] or windows
            if not windows or statistics.median(w[3] for w in inner) < MIN_READINGS:
                continue
            if len(since) >= CONCLUDE_MIN_POINTS and windows[0][0] <= started:
                best, width, steps = since, scale.width, scale_steps
                break
            if len(since) > len(best):
                best, width, steps = since, scale.width, scale_steps
        by_start = {w[0]: w[1] for w in steps.windows(with_open=True)}
        return whole_run_trend(best, width, unsettled, self.thresholds, by_start)

    def _materiality(self, trend: Trend) -> float:
        """Growth over the tested window relative to the smallest worth reporting."""
        grown = trend.slope * trend.points * trend.width
        return grown / max(
            self.thresholds.min_growth_amount, self.thresholds.min_growth * trend.level
        )

    def _jump_findings(self, labels: Labels, jumps: list[Jump]) -> list[Finding]:
        """The newest upward jump, as ``memory_step``, where the resource states its steps."""
        rises = [(t, size) for t, size in jumps if size > 0]
        if not self.resource.steps_stated or not rises:
            return []
        t, size = rises[0]
        where = "".join(f" {v}" for _, v in labels)
        amount = self.resource.amount
        return [
            Finding(
                "memory_step",
                KINDS["memory_step"].severity,
                t,
                f"{self.what}{where} jumped by {amount.text(size)} at {clock(t)} and then "
                "stayed flat: a one-off allocation (a bigger batch, a cache, a checkpoint "
                "buffer), not a leak.",
                {f"jump_{amount.unit}": size, "signal": self.signal},
            )
        ]

    def explain(self, trend: Trend) -> tuple[str, dict[str, float | str]]:
        """What to try, and evidence of the cause; subclasses that can tell more, do."""
        return self.resource.advice, {}


class AllocatorMemoryDetector(ResourceDriftDetector):
    """TensorFlow allocator memory, judged against its device's limit: a GPU's total memory
    (NVML's ``gpu`` index matched to TensorFlow's ``GPU:<index>``), else the process's
    memory limit (a CPU device allocates host memory)."""

    def __init__(self, thresholds: MemoryThresholds | None = None) -> None:
        super().__init__(RESOURCES["tf_memory"], thresholds)
        self.series = self.series | {"gpu_memory_total_bytes"}
        self._gpu_totals: dict[str, float] = {}

    def observe(self, sample: Sample) -> None:
        if sample.series != "gpu_memory_total_bytes":
            super().observe(sample)
        elif math.isfinite(sample.value) and sample.value > 0:
            self._gpu_totals[dict(sample.labels).get("gpu", "")] = sample.value

    def limit_for(self, labels: Labels) -> float:
        kind, _, index = dict(labels).get("device", "").rpartition(":")
        if kind.upper().endswith("GPU"):
            return self._gpu_totals.get(index, math.nan)
        return super().limit_for(())
