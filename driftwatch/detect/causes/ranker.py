"""Ranked likely causes of a slowdown or stall: the signals that moved with it.

The ranker keeps, per signal, 1-s buckets for the recent minutes and 5-min ones for a day
(bounded arrays, no I/O), and compares each signal over the finding's two windows: the
level a gradual slowdown rose from (the minute before its onset; a run judged whole at its
end: its first part) and its newest part; before an abrupt slowdown's onset and after it;
between a run's stalls and during them. Each cause of ``CAUSES`` scores how far
its signals moved the way that would slow training, 1 being the least change that counts;
those at 1 or more are ranked, highest first, with their numbers. A slowdown that none moved
with says so, then lists its ``USUAL_CAUSES``. It only annotates: it adds no finding.
Reasoning: docs/causes.md, "Co-moving".
"""

from __future__ import annotations

import math
from array import array
from collections.abc import Sequence
from dataclasses import replace

import numpy as np

from driftwatch.causes import CAUSES, USUAL_CAUSES, RankedCause, numbers_said
from driftwatch.detect.causes.scores import SCORERS, Scorer
from driftwatch.detect.stats import FloatArray
from driftwatch.findings import JUDGED_AT_END, WHOLE_RUN, Finding
from driftwatch.series import Labels, Sample

RANKED_KINDS = frozenset(
    {"gradual_slowdown", "abrupt_slowdown", "periodic_stall", "stalled", "straggling_rank"}
)
"""The kinds of finding that carry ranked causes."""
FINE_SECONDS = 1.0
"""Width of the fine buckets, in seconds: stalls and short runs are judged on them."""
FINE_POINTS = 300
"""Fine buckets kept per signal: the newest 5 minutes."""
COARSE_SECONDS = 300.0
"""Width of the coarse buckets, in seconds, that windows older than the fine ones use."""
COARSE_POINTS = 288
"""Coarse buckets kept per signal: a day."""
MIN_WINDOW_SECONDS = 60.0
"""Least span of the window before an onset (or a stall), in seconds."""
MAX_WINDOW_SECONDS = 6 * 3600.0
"""Most span of either window, in seconds."""
CLIMB_SIDE_SHARE = 1 / 3
"""Share of a gradual slowdown's span, from its onset to now, that its side after covers:
the newest (and, in a run judged whole at its end, its side before: the first)."""
BASELINE_SECONDS = 60.0
"""Span of a live gradual slowdown's side before its onset, in seconds: the level its steps
rose from."""
REFRESH_SECONDS = 10.0
"""A finding's causes are ranked again at most this often, in seconds of its clock."""
REFRESH_SHARE = 0.05
"""Nor more often than this share of the finding's age (an hour-old slowdown: every 3 min)."""
LEAST_SCORE = 1.0
"""Score from which a cause is named."""
MAX_STALLS = 64
"""Most of a periodic stall finding's recent stalls compared with the time between them."""

RATES = frozenset(
    {
        "cpu_seconds",
        "pressure_some_seconds",
        "cgroup_cpu_throttled_seconds",
        "tracing_count",
        "retracing_warnings_total",
        "train_step",
        "event_file_bytes",
        "nondisk_write_bytes",
        "read_bytes",
    }
)
"""TrackedSignals judged by their rate per second (counters, and totals that only grow)."""
LEVELS = frozenset(
    {
        "step_seconds",
        "step_gap_seconds",
        "input_wait_share",
        "collective_wait_share",
        "process_stopped",
        "rss_bytes",
        "memory_limit_bytes",
        "tf_allocator_current_bytes",
        "tf_allocator_peak_bytes",
        "gpu_clock_throttled",
        "gpu_sm_clock_hertz",
        "gpu_sm_clock_max_hertz",
    }
)
"""TrackedSignals judged by their mean level."""
PER_STEP = frozenset({"step_seconds", "step_gap_seconds"})
"""Levels averaged per sample (one a train-function call: their means' ratio is a share of
time); the others are averaged over time, each sample weighted by the time since the last."""
SAMPLE_SECONDS = (1e-3, 10.0)
"""Least and most time, in seconds, one sample of a level averaged over time stands for."""

Windows = Sequence[tuple[float, float]]
"""Intervals [start, end) of unix seconds that together make one side of a comparison."""


class _Tier:
    """Consecutive buckets of one width: rows of (start, weighted sum, weight, last t, last
    value)."""

    __slots__ = ("_end", "capacity", "rows", "width")

    def __init__(self, width: float, capacity: int) -> None:
        self.width = width
        self.capacity = capacity
        self.rows = array("d")
        self._end = -math.inf  # where the newest bucket ends: a sample before it joins it

    def add(self, t: float, value: float, weight: float) -> None:
        rows = self.rows
        if rows and t < self._end:
            if t < rows[-5]:
                return  # out of order: a bucket once closed stays as it is
            rows[-4] += value * weight
            rows[-3] += weight
            rows[-2], rows[-1] = t, value
            return
        start = math.floor(t / self.width) * self.width
        if rows and start <= rows[-5]:
            if start < rows[-5]:
                return
            rows[-4] += value * weight
            rows[-3] += weight
            rows[-2], rows[-1] = t, value
            return
        rows.extend((start, value * weight, weight, t, value))
        self._end = start + self.width
        if len(rows) >= 10 * self.capacity:  # amortised: trim a whole tier at once
            del rows[: 5 * self.capacity]

    def reaches(self, t: float) -> bool:
        """Whether its oldest bucket starts at or before ``t``."""
        return bool(self.rows) and self.rows[0] <= t


class _Track:
    """One signal in fine buckets (recent minutes) and coarse ones (a day); ``timed``: its
    mean weights each sample by the time since the one before (``SAMPLE_SECONDS``)."""

    __slots__ = ("coarse", "fine", "first", "last_t", "timed")

    def __init__(self, timed: bool) -> None:
        self.fine = _Tier(FINE_SECONDS, FINE_POINTS)
        self.coarse = _Tier(COARSE_SECONDS, COARSE_POINTS)
        self.first: tuple[float, float] | None = None  # (t, value) of its first sample
        self.last_t = -math.inf
        self.timed = timed

    def add(self, t: float, value: float) -> None:
        if self.first is None:
            self.first = (t, value)
        weight = 1.0
        if self.timed:
            least, most = SAMPLE_SECONDS
            since = t - self.last_t  # infinite for the first sample: it stands for an instant
            weight = least if math.isinf(since) else min(max(since, least), most)
            self.last_t = max(self.last_t, t)
        self.fine.add(t, value, weight)
        self.coarse.add(t, value, weight)

    def _rows(self, windows: Windows) -> FloatArray:
        """Rows (start, weighted sum, weight, last t, last value) from the windows' start on: the
        fine tier's, after the coarse buckets that end before it where it does not reach
        back that far."""
        fine = np.frombuffer(self.fine.rows).reshape(-1, 5)
        if self.fine.reaches(min(a for a, _ in windows)):
            return fine
        coarse = np.frombuffer(self.coarse.rows).reshape(-1, 5)
        first = fine[0, 3] if len(fine) else math.inf
        return np.concatenate((coarse[coarse[:, 3] < first], fine))

    def mean(self, windows: Windows) -> float:
        """The mean level over ``windows`` (NaN with no sample in them): of the buckets whose
        last sample falls in one of them, per sample or over time (``timed``)."""
        if not windows:
            return math.nan
        rows = self._rows(windows)
        times = rows[:, 3]
        inside = np.zeros(len(rows), dtype=bool)
        for a, b in windows:
            inside |= (times >= a) & (times < b)
        weight = float(rows[inside, 2].sum())
        return float(rows[inside, 1].sum()) / weight if weight else math.nan

    def rate(self, windows: Windows) -> float:
        """Growth per second over ``windows``: their increases over their durations, each
        from the last sample at or before its start (else its first) to the last at or
        before its end. The signal's first sample counts as one where its first bucket is
        kept: a bucket holds only its last, so a coarse one alone would have no span."""
        if not windows:
            return math.nan
        rows = self._rows(windows)
        times, values = rows[:, 3], rows[:, 4]
        if self.first is not None and len(rows) and rows[0, 0] <= self.first[0] < times[0]:
            times = np.concatenate(((self.first[0],), times))
            values = np.concatenate(((self.first[1],), values))
        starts = np.array([a for a, _ in windows])
        ends = np.array([b for _, b in windows])
        first = np.maximum(np.searchsorted(times, starts, side="right") - 1, 0)
        last = np.searchsorted(times, ends, side="right") - 1
        kept = last > first
        grown = np.maximum(values[last[kept]] - values[first[kept]], 0.0).sum()
        spent = (times[last[kept]] - times[first[kept]]).sum()
        return float(grown / spent) if spent > 0 else math.nan


class TrackedSignals:
    """What each signal did over two sides of a comparison (before and after)."""

    def __init__(self, tracks: dict[tuple[str, Labels], _Track], before: Windows, after: Windows):
        self._tracks = tracks
        self._before = before
        self._after = after

    def labels(self, series: str) -> list[Labels]:
        """The label sets ``series`` has been seen with."""
        return [labels for name, labels in self._tracks if name == series]

    def mean(self, series: str, labels: Labels = ()) -> tuple[float, float]:
        """Its mean level before and after (NaN: no data)."""
        track = self._tracks.get((series, labels))
        if track is None:
            return math.nan, math.nan
        return track.mean(self._before), track.mean(self._after)

    def rate(self, series: str, labels: Labels = ()) -> tuple[float, float]:
        """Its rate per second before and after (NaN: no data)."""
        track = self._tracks.get((series, labels))
        if track is None:
            return math.nan, math.nan
        return track.rate(self._before), track.rate(self._after)


class CauseRanker:
    """Keeps the signals causes are judged on, and names the causes of slowdowns and stalls.

    The engine feeds it samples and hands it each evaluation's findings; it returns them
    with ``causes`` ranked (findings of other kinds unchanged)."""

    series = RATES | LEVELS

    def __init__(self, scorers: Sequence[Scorer] = SCORERS) -> None:
        self._scorers = scorers
        self._tracks: dict[tuple[str, Labels], _Track] = {}
        self._first_t = math.inf
        self._ranked: dict[str, tuple[float, float, tuple[RankedCause, ...]]] = {}

    def observe(self, sample: Sample) -> None:
        key = (sample.series, sample.labels)
        track = self._tracks.get(key)
        if track is None:
            timed = sample.series in LEVELS and sample.series not in PER_STEP
            track = self._tracks[key] = _Track(timed)
        if math.isfinite(sample.value):
            track.add(sample.t, sample.value)
            self._first_t = min(self._first_t, sample.t)

    def annotate(
        self, findings: list[Finding], now: float, *, final: bool = False
    ) -> list[Finding]:
        """``findings`` with the causes of each slowdown and stall ranked; ``final``: the run
        has ended, ranked again on all of it however recently they were."""
        return [self._annotated(f, now, final) if f.kind in RANKED_KINDS else f for f in findings]

    def _annotated(self, finding: Finding, now: float, final: bool) -> Finding:
        held = self._ranked.get(finding.kind)
        refresh = max(REFRESH_SECONDS, (now - finding.since) * REFRESH_SHARE)
        if not final and held is not None and held[0] == finding.since and now - held[1] < refresh:
            causes = held[2]
        else:
            before, after = self.windows(finding, now)
            causes = self.rank(before, after)
            self._ranked[finding.kind] = (finding.since, now, causes)
        text = said(causes, finding.kind)
        if not text:
            return finding
        return replace(finding, message=f"{finding.message} {text}", causes=causes)

    def windows(self, finding: Finding, now: float) -> tuple[Windows, Windows]:
        """The finding's two sides: the level a gradual slowdown rose from and its newest
        part; before an abrupt one's onset and after it; between stalls and during them
        (from the evidence of the last stall, its period and duration); before the last
        step and since."""
        if finding.kind == "periodic_stall":
            return self._stall_windows(finding)
        if finding.kind == "gradual_slowdown":
            return self._climb_windows(finding, now)
        onset = finding.since
        if finding.kind == "stalled":
            onset = now - float(finding.evidence.get("seconds_since_last_step", now - onset))
        span = min(max(now - onset, MIN_WINDOW_SECONDS), MAX_WINDOW_SECONDS)
        start = max(onset - span, self._first_t)
        end = math.nextafter(min(now, onset + MAX_WINDOW_SECONDS), math.inf)  # now is in
        return [(start, onset)], [(onset, end)]

    def _climb_windows(self, finding: Finding, now: float) -> tuple[Windows, Windows]:
        """A gradual slowdown's newest ``CLIMB_SIDE_SHARE`` of its span since its onset (of
        the day kept at most) against the level its steps rose from: the minute before its
        onset (a coarse bucket once that lies beyond the fine ones), or, for a run judged
        whole at its end (slowing from its start: no level before), its span's first
        ``CLIMB_SIDE_SHARE``. A signal that moved before that and then stayed is no cause."""
        onset = max(finding.since, self._first_t, now - COARSE_SECONDS * COARSE_POINTS)
        span = max(now - onset, 0.0)
        width = min(span * CLIMB_SIDE_SHARE, MAX_WINDOW_SECONDS)
        after = [(now - width, math.nextafter(now, math.inf))]
        fine = FINE_SECONDS * FINE_POINTS
        if finding.evidence.get(JUDGED_AT_END) == WHOLE_RUN:
            if span > fine:  # its first side may lie in the coarse buckets alone
                width = max(width, min(COARSE_SECONDS, span / 2))
            return [(onset, onset + width)], after
        reach = BASELINE_SECONDS if span + BASELINE_SECONDS <= fine else COARSE_SECONDS
        return [(max(onset - reach, self._first_t), onset)], after

    @staticmethod
    def _stall_windows(finding: Finding) -> tuple[Windows, Windows]:
        evidence = finding.evidence
        last = float(evidence.get("last_stall_t", math.nan))
        period = float(evidence.get("period_seconds", math.nan))
        stall = float(evidence.get("stall_seconds", math.nan))
        if not (math.isfinite(last) and period > stall > 0):
            return [], []
        during: list[tuple[float, float]] = []
        between: list[tuple[float, float]] = []
        end = last
        while end >= finding.since - stall and len(during) < MAX_STALLS:
            during.append((end - stall, end))
            if period > 2 * stall:  # between the stalls, half a stall's margin either side
                between.append((end - period + stall / 2, end - stall * 1.5))
            end -= period
        return between, during

    def rank(self, before: Windows, after: Windows) -> tuple[RankedCause, ...]:
        """The causes that score ``LEAST_SCORE`` or more, highest first (ties: table order)."""
        if not before or not after:
            return ()
        signals = TrackedSignals(self._tracks, before, after)
        found = [c for score in self._scorers for c in score(signals) if c.score >= LEAST_SCORE]
        order = list(CAUSES)
        found.sort(key=lambda c: (-c.score, order.index(c.cause)))
        best: dict[str, RankedCause] = {}
        for cause in found:  # one entry per cause: its best (e.g. the worst GPU)
            best.setdefault(cause.cause, cause)
        return tuple(best.values())


def said(causes: Sequence[RankedCause], kind: str) -> str:
    """The sentences a finding's message ends with: the top cause with its numbers and its
    fix, then the others by name; with none, for a slowdown, that no measured signal moved
    with it, then its usual causes (nothing for a stall)."""
    if not causes:
        usual = USUAL_CAUSES.get(kind)
        return f"No measured signal moved with it. {usual}" if usual else ""
    top = causes[0]
    where = f" on {top.detail}" if top.detail else ""
    text = f"The signals that moved with it point to {CAUSES[top.cause].title.lower()}{where} "
    text += f"({numbers_said(top)}): {CAUSES[top.cause].fix}."
    if len(causes) > 1:
        text += " Also moved: " + ", ".join(CAUSES[c.cause].title.lower() for c in causes[1:])
        text += "."
    return text
